"""The tile-level passes: the tile IR (tiles.py), its lowering from the planned graph (lower.py, the kernels),
its verifier, allocate, schedule and emit."""
