"""A small MLP for `trnc compile`: the module-level `model` and `example_inputs` are what it compiles.

Run: trnc compile examples/mlp.py -o mlp.trnc && trnc run mlp.trnc
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).eval()
example_inputs = (torch.randn(64, 256),)
