"""The graph-level passes: on trnc's op graph (trnc/ir.py), from legalize to plan."""
