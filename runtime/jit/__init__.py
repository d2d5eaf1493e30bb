"""trnc.runtime.jit: the llvmlite JIT that executes programs bit-exactly with runtime/reference.py."""
