import os
import sys

# Test helpers shared across folders (strategies.py) are imported by name: `import strategies`.
sys.path.insert(0, os.path.dirname(__file__))
