"""Access-pattern builders shared by the tests: contiguous row-major tiles on chip and in HBM."""
import numpy as np

from trnc.isa import AP, Mem


def rowmajor(free_shape):
    """(stride, count) pairs of a contiguous row-major free shape."""
    dims, stride = [], 1
    for count in reversed(free_shape):
        dims.insert(0, (stride, count))
        stride *= count
    return tuple(dims)


def onchip(dtype, shape, offset=0, start=0, mem=Mem.SBUF):
    return AP(mem, dtype, shape[0], rowmajor(shape[1:]), offset=offset, start_partition=start)


def hbm(tensor, dtype, shape):
    return AP(Mem.HBM, dtype, shape[0], rowmajor(shape[1:]), tensor=tensor,
              partition_stride=int(np.prod(shape[1:], dtype=np.int64)))
