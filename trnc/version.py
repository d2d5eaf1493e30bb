"""trnc's version, in the lowest layer: artifacts and the compile and kernel caches stamp it on what they write."""

__version__ = "0.1.0"
