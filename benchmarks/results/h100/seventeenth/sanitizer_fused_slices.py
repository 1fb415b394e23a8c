"""One fused fwd+bwd (parameter gradients in the same pass) of layer_norm or rms_norm on 16-bit
rows of given lengths, with the fewest rows that the fused plan takes plus a part-full chunk: the
workload these runs put under compute-sanitizer (memcheck, racecheck).

    compute-sanitizer --tool racecheck python sanitizer_fused_slices.py layer_norm 24576 40968
"""

from __future__ import annotations

import sys

import rownorm
import torch


def fused_step(op: str, n: int, dtype: torch.dtype) -> str:
    def plan(rows: int):
        x = torch.empty(rows, n, device="cuda", dtype=dtype)
        return rownorm.explain(x, op, backward=True, param_grads=True)

    rows = 64
    while plan(rows).param_grads != "fused":
        rows = rows * 3 // 2
    rows += 17
    x = torch.randn(rows, n, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    if op == "layer_norm":
        b = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
        y = rownorm.layer_norm(x, w, b)
    else:
        y = rownorm.rms_norm(x, w)
    y.backward(torch.randn_like(y))
    torch.cuda.synchronize()
    return plan(rows).raw


if __name__ == "__main__":
    op, lengths = sys.argv[1], [int(n) for n in sys.argv[2:]]
    for dtype in (torch.bfloat16, torch.float16):
        for n in lengths:
            print(dtype, n, fused_step(op, n, dtype), flush=True)
