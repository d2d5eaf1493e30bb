"""Small modules the tests compile, shared by name (`from modules import Fn`; conftest puts tests/ on the path).
Tests that check the user's line an error names keep their own Fn: torch.export records only module forwards in a
node's stack trace, so that line is Fn's forward, which must then be in the test's file."""
from __future__ import annotations

from torch import nn


class Fn(nn.Module):
    """A module around a function of tensors."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)
