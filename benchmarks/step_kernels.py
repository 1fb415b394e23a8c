"""Where a training step's time goes: each kernel of one fwd+bwd step of rms_norm, layer_norm or
add_rms_norm (every gradient), timed by torch.profiler over 5 steps (caches warm, no flush),
2^27 elements, with its share of the step and the time of 5 units of bytes at 3.0 TB/s.

    python benchmarks/step_kernels.py layer_norm:bf16:4096 rms_norm:fp32:65536

A case is op:dtype:N (dtype bf16 or fp32).
"""

from __future__ import annotations

import sys

import rownorm
import torch
from torch.profiler import ProfilerActivity, profile

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
STEPS = 5


def step_of(op: str, dtype: torch.dtype, n: int):
    """One fwd+bwd step of `op` on 2^27 elements in rows of n."""
    m = (1 << 27) // n
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, grad=True):
        t = torch.randn(*shape, device="cuda", dtype=dtype, generator=g)
        return t.requires_grad_(grad)

    x, w, b, r = randn(m, n), randn(n), randn(n), randn(m, n)
    dy = randn(m, n, grad=False)
    if op == "rms_norm":
        leaves, call = [x, w], lambda: rownorm.rms_norm(x, w)
    elif op == "layer_norm":
        leaves, call = [x, w, b], lambda: rownorm.layer_norm(x, w, b)
    elif op == "add_rms_norm":
        leaves, call = [x, r, w], lambda: rownorm.add_rms_norm(x, r, w)[0]
    else:
        raise SystemExit(f"op must be rms_norm, layer_norm or add_rms_norm, got {op!r}")
    return lambda: torch.autograd.grad(call(), leaves, dy), m


def main() -> None:
    for case in sys.argv[1:]:
        op, dtype, n = case.split(":")
        dtype, n = DTYPES[dtype], int(n)
        step, m = step_of(op, dtype, n)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                step()
            torch.cuda.synchronize()
        kernels = [
            (e.key, e.device_time_total / e.count, e.count // STEPS)
            for e in prof.key_averages()
            if e.device_time_total > 0
        ]
        total = sum(t * c for _, t, c in kernels)
        units_us = 5 * m * n * dtype.itemsize / 3.0e6
        print(f"== {case}: {total:.1f} us per step (5 units at 3.0 TB/s: {units_us:.1f} us)")
        for name, t, c in sorted(kernels, key=lambda k: -k[1] * k[2]):
            print(f"  {t:9.1f} us x{c:<2} {100 * t * c / total:5.1f}%  {name[:150]}")


if __name__ == "__main__":
    main()
