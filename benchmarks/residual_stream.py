"""add_rms_norm on the float32 residual stream (16-bit x, float32 residual) against the same
expression in eager PyTorch and under torch.compile, forward and forward + backward (every
gradient: x, residual, weight), with the 16-bit stream (residual in x's dtype) for scale.

Bytes counted per element: forward reads x and the residual and writes out and r (16-bit x:
2 + 4 + 2 + 4 = 12 B on the float32 stream); the backward reads r, dout and dr and writes
dresidual and x's gradient in x's dtype (4 + 2 + 4 + 4 + 2 = 16 B; rownorm's stream backward
writes both in one pass). % of copy: those bytes at the copy limit measured in the same run.

    python benchmarks/residual_stream.py --out benchmarks/results/<gpu>/residual_stream_<rev>.md
"""

from __future__ import annotations

import argparse
import statistics
import sys

import rownorm
import torch
import torch.nn.functional as F
from rownorm.bench.timer import COPY_BYTES_CUDA, Timer, measure_copy_bandwidth

FWD_BYTES = {torch.float32: 12, None: 8}  # per element, bf16 x: float32 stream / 16-bit stream
BWD_BYTES = {torch.float32: 16, None: 8}


def eager(x, residual, weight, eps):
    r = x + residual  # float32 on the float32 stream (torch's promotion)
    out = F.rms_norm(r, (r.shape[-1],), weight.to(r.dtype), eps).to(x.dtype)
    return out, r


def ours(x, residual, weight, eps):
    return rownorm.add_rms_norm(x, residual, weight, eps)


def _forward(fn, inputs, eps):
    def call():
        with torch.no_grad():
            fn(*inputs, eps)

    return call


def _step(fn, leaves, douts, eps):
    def call():  # every gradient, none accumulated into .grad
        torch.autograd.grad(fn(*leaves, eps), leaves, douts)

    return call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", default="1024,2048,4096,8192,16384")
    parser.add_argument("--elems", type=int, default=1 << 27, help="M·N of every shape")
    parser.add_argument("--out", default=None, help="markdown report path")
    args = parser.parse_args()
    device = torch.device("cuda")
    timer = Timer(device)
    copy_gbps, _ = measure_copy_bandwidth(timer, COPY_BYTES_CUDA)
    eps = 1e-6
    lines = [
        f"# add_rms_norm on the float32 residual stream ({torch.cuda.get_device_name(device)}, "
        f"rownorm {rownorm.build_info()['revision']}, torch {torch.__version__})",
        "",
        f"bf16 x, {args.elems} elements per shape, copy limit {copy_gbps:.0f} GB/s; µs (% of "
        f"copy). fwd: {FWD_BYTES[torch.float32]} B/element ({FWD_BYTES[None]} on the bf16 "
        f"stream); fwd+bwd: {FWD_BYTES[torch.float32] + BWD_BYTES[torch.float32]} "
        f"({FWD_BYTES[None] + BWD_BYTES[None]}).",
        "",
        "| residual | N | pass | rownorm | eager | torch.compile |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for n in (int(v) for v in args.ns.split(",")):
        m = args.elems // n
        for res_dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator(device=device).manual_seed(n)
            x = torch.randn(m, n, device=device, dtype=torch.bfloat16, generator=g)
            residual = torch.randn(m, n, device=device, dtype=res_dtype, generator=g)
            weight = 1 + 0.1 * torch.randn(n, device=device, dtype=torch.bfloat16, generator=g)
            stream = torch.float32 if res_dtype == torch.float32 else None
            # A fresh compile per shape and dtype (no-grad and grad: two graphs), within
            # dynamo's recompile limit.
            torch._dynamo.reset()
            compiled = torch.compile(eager, fullgraph=True)
            # Correct first: the three agree on r and within bf16 on out.
            got, want = ours(x, residual, weight, eps), eager(x, residual, weight, eps)
            assert got[1].dtype == res_dtype and torch.equal(got[1], want[1]), "r differs"
            torch.testing.assert_close(got[0], want[0], rtol=1.6e-2, atol=1e-2)
            leaves = [t.detach().requires_grad_() for t in (x, residual, weight)]
            douts = [torch.randn_like(t) for t in ours(*leaves, eps)]
            for mode in ("fwd", "fwdbwd"):
                cells = []
                for fn in (ours, eager, compiled):
                    call = _forward(fn, (x, residual, weight), eps)
                    if mode == "fwdbwd":
                        call = _step(fn, leaves, douts, eps)
                    ms = statistics.median(timer(call)[0] for _ in range(3))
                    per = FWD_BYTES[stream] + (BWD_BYTES[stream] if mode == "fwdbwd" else 0)
                    gbs = per * m * n / (ms * 1e6)
                    cells.append(f"{ms * 1e3:.1f} ({100 * gbs / copy_gbps:.0f}%)")
                name = "float32" if stream else "bfloat16"
                lines.append(f"| {name} | {n} | {mode} | " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
