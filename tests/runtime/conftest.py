import pytest

from trnc import flags


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory):
    """One JIT kernel cache directory per test session (per xdist worker): the JIT test modules that use it
    share compiled kernels and never touch the user's cache."""
    cache = tmp_path_factory.getbasetemp() / "trnc-cache"
    cache.mkdir(exist_ok=True)
    with flags.override(TRNC_CACHE_DIR=cache):
        yield
