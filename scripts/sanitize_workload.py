"""Small workload for compute-sanitizer: every op, forward + backward (parameter gradients
included), on every tier: CUDA results against the same op on the CPU in float64.

    compute-sanitizer --tool memcheck python scripts/sanitize_workload.py [--device cuda]

Its last line is ``sanitizer workload: results OK`` or ``... RESULTS WRONG`` (exit status 1),
which ``scripts/gpu_check.sh`` reads; ``--device cpu`` runs the same workload on the CPU (a
check of this script without a GPU).
"""

from __future__ import annotations

import argparse
import math
import sys

import rownorm
import torch

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


def ops(x, dim, w, b, r):
    """(name, output, parameters to differentiate) of every op on x."""
    yield "l2_normalize", rownorm.l2_normalize(x, dim), ()
    yield "mean_abs", rownorm.l1_normalize(x, dim, 1e-12, True), ()
    yield "rms_norm", rownorm.rms_norm(x, w, dim, 1e-6), (w,)
    yield "layer_norm", rownorm.layer_norm(x, w, b, dim, 1e-5), (w, b)
    yield "softmax", rownorm.softmax(x, dim), ()
    yield "log_softmax", rownorm.log_softmax(x, dim), ()
    if dim in (-1, x.dim() - 1):
        out, h = rownorm.add_rms_norm(x, r, w, 1e-6)
        yield "add_rms_norm", out * 2 + h, (w, r)


def results(dtype, device, x0, w0, b0, r0, dim, view_of, grad_dtype):
    t = [v.to(device=device, dtype=dtype).requires_grad_(True) for v in (x0, w0, b0, r0)]
    if view_of is not None:  # the same values as a row-strided view of a wider tensor
        wide = torch.zeros(view_of, dtype=dtype, device=device)
        wide[:, : x0.shape[-1]] = t[0].detach()
        t[0] = wide[:, : x0.shape[-1]].requires_grad_(True)
    out = {}
    for name, y, params in ops(t[0], dim, t[1], t[2], t[3]):
        dy = torch.cos(torch.arange(y.numel(), dtype=torch.float64)).reshape(y.shape)
        dy = dy.to(grad_dtype)  # the same rounded values in both runs
        grads = torch.autograd.grad(y, (t[0], *params), dy.to(device=device, dtype=dtype))
        out[name] = [y.detach(), *grads]
    return out


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
        w0, b0 = torch.randn(n, generator=g), torch.randn(n, generator=g)
        r0 = torch.randn(x0.shape, generator=g)
        for dtype in (torch.float32, torch.bfloat16):
            rounded = [v.to(dtype).double() for v in (x0, w0, b0, r0)]
            got = results(dtype, device, *rounded, dim, shape if cols else None, dtype)
            ref = results(torch.float64, "cpu", *rounded, dim, None, dtype)
            tol = 2e-5 if dtype == torch.float32 else 3e-2
            case_worst = max(
                _error(a, c) / tol
                for name in ref
                for a, c in zip(got[name], ref[name], strict=True)
            )
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
