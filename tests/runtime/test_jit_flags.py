"""trnc/flags.py, the flags the JIT reads: typed values, defaults, errors naming the variable, and their doc."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from trnc import flags
from trnc.flags import FlagError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = ("trnc", "isa", "passes", "runtime")


def test_defaults(monkeypatch, tmp_path):
    for name in flags.FLAGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert flags.get("TRNC_CACHE_DIR") == tmp_path / "trnc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert flags.get("TRNC_CACHE_DIR") == tmp_path / "home" / ".cache" / "trnc"
    assert flags.get("TRNC_CACHE") is True and flags.get("TRNC_ASSERT_CACHED") is False


def test_environment_values_are_parsed(monkeypatch, tmp_path):
    monkeypatch.setenv("TRNC_CACHE", "0")
    monkeypatch.setenv("TRNC_CACHE_DIR", str(tmp_path / "c"))
    assert flags.get("TRNC_CACHE") is False and flags.get("TRNC_CACHE_DIR") == tmp_path / "c"


@pytest.mark.parametrize("name, value", [("TRNC_CACHE", "yes"), ("TRNC_ASSERT_CACHED", "2"), ("TRNC_CACHE_DIR", "")])
def test_a_bad_value_raises_an_error_naming_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(FlagError, match=name):
        flags.get(name)


def test_override_wins_over_the_environment_for_its_scope_only(monkeypatch):
    monkeypatch.setenv("TRNC_CACHE", "1")
    with flags.override(TRNC_CACHE="0"):
        assert flags.get("TRNC_CACHE") is False
        with flags.override(TRNC_CACHE=True):
            assert flags.get("TRNC_CACHE") is True
        assert flags.get("TRNC_CACHE") is False
    assert flags.get("TRNC_CACHE") is True
    with pytest.raises(FlagError, match="TRNC_CACHE"):
        with flags.override(TRNC_CACHE="maybe"):
            pass


def test_unknown_flags_are_refused():
    with pytest.raises(FlagError, match="unknown flag 'TRNC_NOPE'"):
        flags.get("TRNC_NOPE")


def test_docs_env_vars_lists_exactly_the_flags():
    text = (ROOT / "docs" / "env_vars.md").read_text()
    documented = set(re.findall(r"^\| `(TRNC_[A-Z_]+)` \|", text, flags=re.MULTILINE))
    assert documented == set(flags.FLAGS)


def test_flags_py_is_the_only_reader_of_the_environment():
    readers = [str(p.relative_to(ROOT)) for folder in PACKAGE_FOLDERS for p in (ROOT / folder).rglob("*.py")
               if re.search(r"os\.environ|os\.getenv|getenv\(", p.read_text()) and p != ROOT / "trnc" / "flags.py"]
    assert readers == []
