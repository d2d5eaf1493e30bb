"""The error hierarchy: every failure a user can cause is a TrncError with a message naming the thing."""


class TrncError(Exception):
    """Base of every error trnc raises on purpose."""


class VerifyError(TrncError):
    """A program or IR broke a rule of the machine; the message names the instruction and the rule."""


class EncodingError(TrncError):
    """Binary or assembly text that cannot be decoded into a program."""


class ExecutionError(TrncError):
    """A fault while running a verified program (e.g. a gather index outside its table)."""


class UnsupportedOpError(TrncError):
    """A model operation trnc cannot compile."""


class ArtifactError(TrncError):
    """A malformed or incompatible .trnc artifact."""
