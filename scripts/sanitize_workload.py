"""Small workload for compute-sanitizer: every op of the op table (``rownorm.testing``: its case
with every parameter), forward + backward (parameter gradients included), on every tier: CUDA
results against the same op on the CPU in float64.

    compute-sanitizer --tool memcheck python scripts/sanitize_workload.py [--device cuda]

Its last line is ``sanitizer workload: results OK`` or ``... RESULTS WRONG`` (exit status 1),
which ``scripts/gpu_check.sh`` reads; ``--device cpu`` runs the same workload on the CPU (a
check of this script without a GPU).
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
from rownorm.testing import OpInfo, families

# (shape, dim, slice_cols): tiers by N (group / warp / CTA / cluster / beyond), the fused
# weight-gradient CTA path (4096), strided reductions over dim 0 and 1 (scalar, streamed and
# 16-byte-pack columns), row-strided input.
CASES = [
    ((64, 100), -1, None),
    ((16, 1500), -1, None),
    ((40, 4096), -1, None),
    ((4, 65535), -1, None),
    ((2, 300000), -1, None),
    ((300, 4, 5), 0, None),
    ((3, 70, 33), 1, None),
    ((2, 48, 264), 1, None),
    ((8, 1024), -1, 1000),
]


def results(op: OpInfo, dtype, device, values: dict, dim: int, view_of, grad_dtype) -> list:
    """The outputs of ``op`` and the gradients of all its inputs, computed in ``dtype`` on
    ``device`` from ``values`` (float64, by input name); ``view_of``: x is a row-strided view
    of a zero tensor of that shape."""
    inp = {k: values[k].to(device=device, dtype=dtype).requires_grad_(True) for k in values}
    if view_of is not None:  # the same values as a row-strided view of a wider tensor
        n = values["x"].shape[-1]
        wide = torch.zeros(view_of, dtype=dtype, device=device)
        wide[:, :n] = inp["x"].detach()
        inp["x"] = wide[:, :n].requires_grad_(True)
    outs = op.call(inp, dim)
    dys = []
    for y in outs:
        dy = torch.cos(torch.arange(y.numel(), dtype=torch.float64)).reshape(y.shape)
        dys.append(dy.to(grad_dtype).to(device=device, dtype=dtype))  # the same in both runs
    names = op.grad_inputs(inp)
    grads = torch.autograd.grad(outs, [inp[k] for k in names], dys)
    return [y.detach() for y in outs] + list(grads)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="where the ops run (default cuda)")
    device = p.parse_args(argv).device
    worst = 0.0
    for i, (shape, dim, cols) in enumerate(CASES):
        g = torch.Generator().manual_seed(i)
        x0 = torch.randn(shape, generator=g)
        x0 = x0[:, :cols].contiguous() if cols else x0
        n = x0.shape[dim]
        values = {
            "x": x0,
            "weight": torch.randn(n, generator=g),
            "bias": torch.randn(n, generator=g),
            "residual": torch.randn(x0.shape, generator=g),
        }
        for dtype in (torch.float32, torch.bfloat16):
            rounded = {k: v.to(dtype).double() for k, v in values.items()}
            tol = 2e-5 if dtype == torch.float32 else 3e-2
            case_worst = 0.0
            for op in families().values():
                if not op.supports(x0, dim):
                    continue
                mine = {k: rounded[k] for k in op.input_names}
                got = results(op, dtype, device, mine, dim, shape if cols else None, dtype)
                ref = results(op, torch.float64, "cpu", mine, dim, None, dtype)
                errs = [_error(a, c) / tol for a, c in zip(got, ref, strict=True)]
                case_worst = max(case_worst, *errs)
            worst = max(worst, case_worst)
            print(
                f"{str(dtype):<15} {str(shape):<14} dim={dim:<2} cols={cols} "
                f"worst error / tolerance {case_worst:.2f}",
                flush=True,
            )
    ok = worst <= 1  # False for NaN
    print("sanitizer workload:", "results OK" if ok else "RESULTS WRONG")
    return 0 if ok else 1


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got − want| over the finite reference values, relative to the largest of them
    (infinite where that is NaN, so that max() over errors never drops it)."""
    got = got.double().cpu()
    fin = torch.isfinite(want)
    scale = want[fin].abs().max().clamp_min(1e-30)
    err = ((got - want).abs()[fin].max() / scale).item()
    return math.inf if math.isnan(err) else err


if __name__ == "__main__":
    sys.exit(main())
