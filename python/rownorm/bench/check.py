"""Correctness before timing: one implementation's outputs and gradients against the float64
reference, in row chunks so that the check of an input of several GB fits beside it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rownorm.bench.impls import Fn
    from rownorm.bench.specs import OpSpec

# Correctness tolerance of any implementation in the benchmark: ‖out − ref‖ / ‖ref‖.
TOLERANCE = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 1e-2,
    torch.bfloat16: 1e-2,
}
# A reference chunk holds at most this many elements of one float64 tensor (256 MiB), so the
# check of an 8.6 GB input needs only a few GB beside it.
CHUNK_ELEMS = 1 << 25


def as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def row_chunks(shape: Sequence[int], dim: int) -> list[slice]:
    """Slices along dim 0 that keep every reduced row whole (one slice when dim is 0)."""
    if len(shape) < 2 or dim % len(shape) == 0 or shape[0] == 0:
        return [slice(None)]
    per_row = math.prod(shape[1:])
    step = max(1, CHUNK_ELEMS // max(per_row, 1))
    return [slice(r, min(r + step, shape[0])) for r in range(0, shape[0], step)]


class _ErrAcc:
    """Accumulates ‖a − b‖² and ‖b‖² in float64 over chunks."""

    def __init__(self) -> None:
        self.num = 0.0
        self.den = 0.0

    def add(self, got: torch.Tensor, want: torch.Tensor) -> None:
        want = want.detach().double()
        self.num += torch.linalg.vector_norm(got.detach().double() - want).item() ** 2
        self.den += torch.linalg.vector_norm(want).item() ** 2

    def rel(self, floor: float = 0.0) -> float:
        """‖a − b‖ / max(‖b‖, floor)."""
        if math.isnan(self.num) or math.isnan(self.den):
            return math.nan
        den = max(math.sqrt(self.den), floor)
        return math.sqrt(self.num) / den if den > 0 else math.sqrt(self.num)


def _name(names: Sequence[str], i: int, kind: str) -> str:
    return names[i] if i < len(names) else f"{kind}{i}"


def check_impl(
    spec: OpSpec,
    fn: Fn,
    inputs: Sequence[torch.Tensor],
    dim: int,
    kwargs: dict,
    mode: str,
    dys: Sequence[torch.Tensor] | None = None,
) -> tuple[float, str]:
    """Runs ``fn`` once and compares outputs (and, for fwdbwd, the gradients of every input:
    x, residual, weight, bias) with the float64 reference. Returns (max relative error,
    per-tensor detail).

    Each tensor's error is ‖out − ref‖/‖ref‖. A row-tensor gradient is divided by
    max(‖ref‖, ‖dy‖·‖y‖/‖x‖) instead: that is the gradient's natural scale (the Jacobian of a
    normalization scales like ‖y‖/‖x‖), so a gradient that is zero in exact arithmetic (a row
    of one element) is judged against that scale, not against its own rounding noise.
    """
    x_shape = inputs[0].shape
    diff = [i for i, t in enumerate(inputs) if t.is_floating_point()]
    grads: tuple[torch.Tensor | None, ...] = ()
    if mode == "fwd":
        with torch.no_grad():
            outs = as_tuple(fn(*inputs))
    else:
        # Fresh leaves, so the timed tensors' .grad is not touched.
        leaves = [t.detach().requires_grad_(i in diff) for i, t in enumerate(inputs)]
        outs = as_tuple(fn(*leaves))
        if dys is None:
            raise ValueError("check_impl: fwdbwd needs dys")
        grads = torch.autograd.grad(outs, [leaves[i] for i in diff], list(dys), allow_unused=True)
        outs = tuple(o.detach() for o in outs)
        del leaves
    out_acc = [_ErrAcc() for _ in outs]
    row_grad_acc = {j: _ErrAcc() for j, i in enumerate(diff) if inputs[i].shape == x_shape}
    param_ref: dict[int, torch.Tensor] = {}
    scale = {"dy": _ErrAcc(), "y": _ErrAcc(), "x": _ErrAcc()}  # only the .den sums are used

    def pick(t: torch.Tensor, sl: slice) -> torch.Tensor:
        return t[sl] if t.shape == x_shape else t

    for sl in row_chunks(x_shape, dim):
        t64 = [
            pick(t, sl).detach().double() if t.is_floating_point() else pick(t, sl) for t in inputs
        ]
        if mode == "fwd":
            with torch.no_grad():
                refs = as_tuple(spec.reference(*t64, dim=dim, **kwargs))
        else:
            for i in diff:
                t64[i].requires_grad_(True)
            refs = as_tuple(spec.reference(*t64, dim=dim, **kwargs))
        if len(refs) != len(outs):
            raise RuntimeError(f"{spec.name}: {len(outs)} outputs, reference gives {len(refs)}")
        for acc, out, r in zip(out_acc, outs, refs, strict=True):
            acc.add(pick(out, sl), r)
        if mode != "fwd":
            scale["y"].den += torch.linalg.vector_norm(refs[0].detach()).item() ** 2
            scale["x"].den += torch.linalg.vector_norm(t64[0].detach()).item() ** 2
            scale["dy"].den += sum(
                torch.linalg.vector_norm(pick(d, sl).double()).item() ** 2 for d in dys
            )
        if mode != "fwd":
            rgrads = torch.autograd.grad(
                refs, [t64[i] for i in diff], [pick(d, sl).double() for d in dys]
            )
            for j in range(len(diff)):
                if j in row_grad_acc:
                    g = grads[j]
                    row_grad_acc[j].add(
                        pick(g, sl) if g is not None else torch.zeros_like(rgrads[j]), rgrads[j]
                    )
                else:  # parameter gradients are sums over rows: add up the chunks
                    param_ref[j] = rgrads[j] if j not in param_ref else param_ref[j] + rgrads[j]
        del t64, refs
    errs: list[tuple[str, float]] = []
    for k, acc in enumerate(out_acc):
        errs.append((_name(spec.output_names, k, "out"), acc.rel()))
    for j, i in enumerate(diff if mode != "fwd" else ()):
        name = "d" + _name(spec.input_names, i, "input")
        if j in row_grad_acc:
            x_norm = math.sqrt(scale["x"].den)
            floor = (math.sqrt(scale["dy"].den * scale["y"].den) / x_norm) if x_norm > 0 else 0.0
            errs.append((name, row_grad_acc[j].rel(floor)))
        elif j in param_ref:
            acc = _ErrAcc()
            g = grads[j]
            acc.add(g if g is not None else torch.zeros_like(param_ref[j]), param_ref[j])
            errs.append((name, acc.rel()))
    worst = math.nan if any(math.isnan(e) for _, e in errs) else max(e for _, e in errs)
    return worst, ", ".join(f"{n} {e:.1e}" for n, e in errs)
