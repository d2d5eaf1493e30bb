"""The rules of passes/graph/legalize_strided.py compiled end to end (trnc.compile, the JIT) against eager:
as_strided (overlapping, offset, of a computed and of a transposed value), as_strided_scatter, slice_scatter with
steps, max_unpool1d/2d/3d (duplicates, NaN and infinities, an index out of range) and new_empty_strided, and the
refusals that name the op.

Tolerance: none. Every op here only moves values (a gather at a constant index, a select, a cat of slices, a
scatter whose one selected value per element passes through an exact max), so results must equal eager bit for
bit, signed zeros and NaN included.
"""
import pytest
import torch
import torch.nn.functional as F

import trnc
from modules import Fn
from trnc.errors import TrncError, UnsupportedOpError


def compiled(fn, *xs):
    return trnc.compile(Fn(fn).eval(), xs, cache=False)


def equal_to_eager(fn, *xs):
    got, ref = compiled(fn, *xs)(*xs), fn(*xs)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)
    if ref.dtype.is_floating_point:
        assert torch.equal(got.signbit() | got.isnan(), ref.signbit() | ref.isnan())


@pytest.mark.parametrize("shape, size, stride, offset", [
    ((3, 3), (2, 2), (1, 2), 0), ((3, 3), (2, 2), (1, 2), 1), ((16,), (2, 2, 2, 2), (1, 1, 1, 1), 0),
    ((16,), (2, 1, 1, 2), (1, 7, 7, 1), 0), ((10,), (4, 3), (2, 1), None), ((6, 5), (5, 6), (1, 5), 0),
    ((1,), (1,), (1,), 0), ((4,), (3, 2), (0, 1), 2), ((2, 3, 4), (24,), (1,), 0), ((5,), (0, 3), (1, 1), 0)])
def test_as_strided_reads_the_storage_as_eager(shape, size, stride, offset):
    torch.manual_seed(1701)
    x = torch.randn(*shape)
    x.view(-1)[0] = -0.0
    equal_to_eager(lambda x: torch.as_strided(x, size, stride, offset), x)
    equal_to_eager(lambda x: torch.ops.aten.as_strided_copy(x, size, stride, offset), x)


def test_as_strided_of_computed_and_transposed_values():
    torch.manual_seed(1702)
    x = torch.randn(3, 4)
    equal_to_eager(lambda x: (x * 2).as_strided((2, 3), (3, 1), 2), x)
    equal_to_eager(lambda x: (x * 2).t().as_strided((3, 2), (1, 3), 1), x)
    equal_to_eager(lambda x: (x + 1)[1:].as_strided((2, 2), (1, 4)), x)   # offset 4: the view's own


def test_as_strided_refusals_name_the_op():
    torch.manual_seed(1703)
    x = torch.randn(8)
    with pytest.raises(UnsupportedOpError, match=r"aten\.as_strided\.default .* reads storage outside"):
        compiled(lambda x: x[2:6].as_strided((2,), (1,), 0), x)
    n = torch.randint(0, 100, (8,), dtype=torch.int32)
    with pytest.raises(UnsupportedOpError, match=r"aten\.as_strided\.default .*int32"):
        compiled(lambda n: (n + 1).as_strided((2, 2), (1, 2)), n)


@pytest.mark.parametrize("shape, src_shape, stride, offset", [
    ((1,), (), (), 0), ((3, 3), (2, 2), (1, 2), 1), ((3, 3), (2, 2), (2, 1), 0),
    ((16,), (2, 2, 2, 2), (8, 4, 2, 1), 0), ((16,), (2, 1, 1, 2), (1, 2, 4, 8), 0), ((4, 5), (0, 2), (1, 1), 0),
    ((6,), (2,), (3,), 2)])
def test_as_strided_scatter_as_eager(shape, src_shape, stride, offset):
    torch.manual_seed(1704)
    x, src = torch.randn(shape), torch.randn(src_shape)
    src.view(-1)[:1] = float("nan")
    equal_to_eager(lambda x, s: torch.as_strided_scatter(x, s, src_shape, stride, offset), x, src)


def test_as_strided_scatter_into_transposed_and_offset_values():
    torch.manual_seed(1709)
    x, src, pair = torch.randn(3, 4), torch.randn(2, 2), torch.randn(2)
    # eager's result keeps the input's strides and storage offset: positions address the input's own storage
    equal_to_eager(lambda x, s: torch.as_strided_scatter((x * 2).t(), s, (2, 2), (1, 2), 1), x, src)
    equal_to_eager(lambda x, s: torch.as_strided_scatter((x + 1)[1:], s, (2,), (3,)), x, pair)
    equal_to_eager(lambda x, s: torch.as_strided_scatter((x + 1)[1:], s, (2,), (2,), 5), x, pair)


def test_as_strided_scatter_refusals_name_the_op():
    x, src, pair = torch.randn(6), torch.randn(2, 2), torch.randn(2)
    with pytest.raises(UnsupportedOpError, match=r"aten\.as_strided_scatter\.default .* writes some elements twice"):
        compiled(lambda x, s: torch.as_strided_scatter(x, s, (2, 2), (1, 1)), x, src)
    with pytest.raises(UnsupportedOpError, match=r"aten\.as_strided_scatter\.default .* outside the input's elements"):
        compiled(lambda x, s: torch.as_strided_scatter(x[2:], s, (2,), (3,), 0), x, pair)


@pytest.mark.parametrize("dim, start, end, step", [(0, 0, 6, 2), (0, 1, 8, 3), (1, 0, None, 2), (-1, 2, 5, 4),
                                                   (0, 7, 8, 5), (1, 4, 2, 2), (0, None, None, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_slice_scatter_with_steps_as_eager(dim, start, end, step, dtype):
    torch.manual_seed(1705)
    x = torch.randn(8, 5)
    idx = range(*slice(start, end, step).indices(x.shape[dim]))
    src_shape = list(x.shape)
    src_shape[dim] = len(idx)
    src = torch.randn(*src_shape)
    if dtype is torch.int32:   # values past 256 (where bf16 would round): moved, never computed
        x, src = (x * 2 ** 20).to(dtype), (src * 2 ** 20).to(dtype)
    elif dtype is torch.bool:
        x, src = x > 0, src > 0
    equal_to_eager(lambda x, s: torch.slice_scatter(x, s, dim, start, end, step), x, src)


def _pooled(shape, kernel, stride, pool):
    x = torch.randn(*shape)
    x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    return pool(x, kernel, stride, return_indices=True)


@pytest.mark.parametrize("pool, unpool, shape, kernel, stride, out", [
    (F.max_pool1d, F.max_unpool1d, (2, 3, 9), 3, 2, None),
    (F.max_pool1d, F.max_unpool1d, (3, 8), 2, 2, (9,)),
    (F.max_pool2d, F.max_unpool2d, (2, 3, 6, 8), 2, 2, None),
    (F.max_pool2d, F.max_unpool2d, (1, 2, 5, 5), 3, 1, (5, 5)),
    (F.max_pool3d, F.max_unpool3d, (1, 2, 4, 4, 6), 2, 2, None),
    (F.max_pool3d, F.max_unpool3d, (2, 3, 5, 4), 2, 1, None)])
def test_max_unpool_as_eager(pool, unpool, shape, kernel, stride, out):
    torch.manual_seed(1706)
    y, index = _pooled(shape, kernel, stride, pool)
    equal_to_eager(lambda y, i: unpool(y, i, kernel, stride, output_size=out), y, index)


def test_max_unpool_duplicates_take_the_last_and_out_of_range_faults():
    torch.manual_seed(1707)
    y = torch.randn(2, 2, 5)
    index = torch.tensor([[[0, 3, 3, 5, 3], [7, 7, 7, 1, 0]], [[1, 1, 2, 2, 2], [0, 9, 9, 4, 4]]])
    fn = lambda y, i: F.max_unpool1d(y, i, 2, output_size=(10,))   # noqa: E731
    equal_to_eager(fn, y, index)
    model = compiled(fn, y, index)
    bad = index.clone()
    bad[1, 0, 2] = 10
    with pytest.raises(RuntimeError, match="invalid max index"):
        fn(y, bad)
    with pytest.raises(TrncError, match="gather index 10 .* outside"):
        model(y, bad)


def test_max_unpool_of_an_empty_input():
    y, index = torch.randn(0, 2, 3), torch.zeros(0, 2, 3, dtype=torch.int64)
    equal_to_eager(lambda y, i: F.max_unpool1d(y, i, 2), y, index)


@pytest.mark.parametrize("size, stride, dtype", [((2, 3), (7, 8), torch.float32), ((), (), None),
                                                 ((4, 0), (1, 1), torch.int32), ((2, 3), (3, 1), torch.float64)])
def test_new_empty_strided_is_zeros_of_the_size_and_dtype(size, stride, dtype):
    x = torch.randn(5)
    fn = lambda x: x.new_empty_strided(size, stride, dtype=dtype) + 0   # noqa: E731
    got, ref = compiled(fn, x)(x), fn(x)
    assert got.shape == ref.shape and got.dtype == ref.dtype and not got.any()


@pytest.mark.parametrize("make", [lambda x: torch.zeros_like(x, dtype=torch.float64),
                                  lambda x: torch.full_like(x, 0.3, dtype=torch.float64),
                                  lambda x: x.new_empty_strided((2, 3), (1, 2), dtype=torch.float64)])
def test_a_float64_creation_like_an_input_is_a_constant_on_the_device(make):
    """The `like` argument gives only shape and dtype: such a float64 result is a constant, not a float64 value
    computed from the inputs (which the machine lacks), so fallback=False compiles it (it used to refuse)."""
    torch.manual_seed(1709)
    x = torch.randn(2, 3)
    fn = lambda x: (x * 2, make(x) * 0)   # noqa: E731
    got = torch.compile(fn, backend="trnc", options={"fallback": False})(x)
    ref = fn(x)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape and torch.equal(g, r)


def test_a_call_with_another_layout_is_refused(tmp_path):
    torch.manual_seed(1708)
    fn = lambda x: torch.as_strided(x, (2, 2), (1, 2), 1)   # noqa: E731
    x, transposed = torch.randn(3, 4), torch.randn(4, 3).t()
    model = compiled(fn, x)
    model.save(tmp_path / "m.trnc")
    for m in (model, trnc.load(tmp_path / "m.trnc")):
        assert torch.equal(m(x), fn(x))
        with pytest.raises(TrncError, match=r"input 0 has strides \[1, 3\] .* reads storage \(as_strided\)"):
            m(transposed)
    equal_to_eager(fn, transposed)   # compiled for that layout: its storage order


def test_max_unpool_past_the_one_hot_limit_is_refused_by_name():
    y, index = F.max_pool2d(torch.randn(1, 4, 128, 128), 2, 2, return_indices=True)
    with pytest.raises(UnsupportedOpError, match=r"aten\.max_unpool2d\.default is not supported at this size"):
        compiled(lambda y, i: F.max_unpool2d(y, i, 2, 2), y, index)


class _Strided(torch.nn.Module):
    """as_strided of a transposed parameter and of an int64 buffer, and an input the view does not read."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 3).t())
        self.register_buffer("ids", torch.arange(12).reshape(3, 4))

    def forward(self, x, y):
        ids = self.ids.as_strided((2, 3), (1, 4), 1)
        return x + self.w.as_strided((3, 4), (4, 1)), ids * 2, y * 3


def test_as_strided_of_constants_reads_their_layout_and_guards_only_its_inputs():
    torch.manual_seed(1710)
    model = _Strided().eval()
    x, y = torch.randn(3, 4), torch.randn(2, 5)
    compiled_model = trnc.compile(model, (x, y), cache=False)
    assert compiled_model.info.input_layouts is None   # the views read parameters, not inputs
    y_transposed = y.t().contiguous().t()   # the same values, other strides: allowed, the views do not read y
    for args in ((x, y), (x, y_transposed)):
        for g, r in zip(compiled_model(*args), model(*args)):
            assert g.dtype == r.dtype and torch.equal(g, r)


def test_as_strided_of_a_pooled_value_does_not_guard_the_input_layout():
    """ConvNeXt's classifier reads its pooled [1, C, 1, 1] features through as_strided: a fresh tensor with one dim
    above 1 has one layout whatever the input's, so a channels_last call runs (it was refused); a view of the
    input itself still guards the input's layout."""
    torch.manual_seed(1711)
    pooled = lambda x: torch.as_strided(x.amax((2, 3), keepdim=True) * 2, (1, 6, 1, 1), (6, 1, 6, 6))  # noqa: E731
    viewed = lambda x: torch.as_strided(x, (1, 6, 1, 1), (96, 1, 96, 96))  # noqa: E731
    x = torch.randn(1, 6, 4, 4)
    channels_last = x.contiguous(memory_format=torch.channels_last)
    model = compiled(pooled, x)
    assert model.info.input_layouts is None
    assert torch.equal(model(channels_last), pooled(channels_last))
    with pytest.raises(TrncError, match=r"reads storage \(as_strided\)"):
        compiled(viewed, x)(channels_last)
