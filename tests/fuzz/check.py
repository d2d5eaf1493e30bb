"""The verdict on one compiled run: its outputs against eager's and against the float64 reference, and the JIT
against the reference interpreter; shared by the runner and copied into every reproducer (repro.py), so a
reproducer decides exactly as the fuzzer did.

Structure, shapes and dtypes must be eager's exactly; integer and bool values too. Float values must lie within
the per-element tolerance of the float64 reference (reference.py derives it); a NaN or infinity never does, as
the fuzzer only keeps programs whose reference is finite.
"""
import torch
import torch.utils._pytree as pytree


def compare(got, eager, ref: list, tol: list) -> list[str]:
    """The problems of `got`, each 'kind: text' with kind one of structure, shape, dtype, value; [] if none.
    `ref` and `tol` are per leaf of eager's output: float64 tensors for float leaves, None for the others."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    eager_leaves, eager_spec = pytree.tree_flatten(eager)
    if got_spec != eager_spec:
        return [f"structure: got {got_spec}, eager {eager_spec}"]
    problems = []
    for i, (g, e, r, t) in enumerate(zip(got_leaves, eager_leaves, ref, tol)):
        if not isinstance(g, torch.Tensor):
            problems.append(f"structure: output {i} is a {type(g).__name__}, eager's a tensor")
        elif g.shape != e.shape:
            problems.append(f"shape: output {i} has shape {list(g.shape)}, eager {list(e.shape)}")
        elif g.dtype != e.dtype:
            problems.append(f"dtype: output {i} has dtype {g.dtype}, eager {e.dtype}")
        elif not e.dtype.is_floating_point:
            if not torch.equal(g, e):
                wrong = int((g != e).sum())
                problems.append(f"value: output {i} ({e.dtype}) differs from eager at {wrong} of {e.numel()} elements")
        else:
            problems.extend(_values(i, g.double(), r, t))
    return problems


def _values(i: int, got: torch.Tensor, ref: torch.Tensor, tol: torch.Tensor) -> list[str]:
    err = (got - ref).abs()
    bad = ~(err <= tol)   # a NaN error is bad too
    if not bad.any():
        return []
    ratio = torch.where(bad, err / tol.clamp_min(1e-300), torch.zeros_like(err)).nan_to_num(float("inf"))
    worst = int(ratio.flatten().argmax())
    at = list(torch.unravel_index(torch.tensor(worst), got.shape)) if got.dim() else []
    flat = (got.flatten()[worst].item(), ref.flatten()[worst].item(), tol.flatten()[worst].item())
    return [f"value: output {i}: {int(bad.sum())} of {got.numel()} elements outside the tolerance, the worst "
            f"{ratio.flatten()[worst].item():.3g}x it at {[int(a) for a in at]}: got {flat[0]:.9g}, "
            f"reference {flat[1]:.9g}, tolerance {flat[2]:.3g}; max |got - reference| {err.max().item():.3g}"]


def same_bits(jit, reference) -> list[str]:
    """The problems of the JIT's outputs against the reference interpreter's: they must agree bit for bit (a NaN
    matches any NaN); [] if they do."""
    problems = []
    for i, (a, b) in enumerate(zip(pytree.tree_leaves(jit), pytree.tree_leaves(reference))):
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"bits: output {i}: JIT {a.dtype}{list(a.shape)}, reference {b.dtype}{list(b.shape)}")
            continue
        if a.dtype.is_floating_point:
            nan_a, nan_b = torch.isnan(a), torch.isnan(b)
            differ = (nan_a != nan_b) | (~nan_a & ~nan_b & (_bits(a) != _bits(b)))
        else:
            differ = a != b
        if differ.any():
            problems.append(f"bits: output {i}: JIT and reference interpreter differ at {int(differ.sum())} of "
                            f"{a.numel()} elements")
    return problems


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


class Float64Casts(torch.overrides.TorchFunctionMode):
    """Within it, a float64 copy of a model computes the model's float64 reference: a conversion to a float
    dtype rounds as torch rounds, and the value goes on in float64 (reproducers compute their reference so)."""

    CONVERSIONS = (torch.Tensor.to, torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.CONVERSIONS and isinstance(out, torch.Tensor) and out.is_floating_point():
            return out.double()
        return out
