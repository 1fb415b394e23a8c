"""Where the host time of one small eager call goes: rms_norm on a 1×4096 bf16 tensor.

    python benchmarks/host_overhead.py [--calls 5000] [--out PATH.md]

Times back-to-back calls (one synchronize at the end, best of 5 loops) through each layer of
the call: rownorm.rms_norm (the Python API, which calls the op past its Python autograd kernel
for plain tensors: ops.call), torch.ops.rownorm.rms_norm (the dispatcher, with the autograd
layer) and .default under no_grad (its autograd kernel still runs, and finds nothing to
record), with and without requires_grad, beside F.rms_norm for the same call; the modules
(torch.nn.RMSNorm and rownorm.nn.RMSNorm, with and without no_grad); the op sent straight to
its CUDA kernel (past the Python autograd kernel that every call through the dispatcher's
Autograd key runs),
torch's own rms_norm called through ``torch.ops`` the same way, and both under
``torch.inference_mode()`` (which skips the Autograd key). Then the PyTorch profiler over a few
hundred calls of the dispatcher path: the CPU time of each op and CUDA runtime call below it
(allocation, device and stream queries, the launch), which is what the C++ path costs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import rownorm
import torch
import torch.nn.functional as F

SHAPE = (1, 4096)
EPS = 1e-6


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--out", default=None, help="markdown file for the tables")
    args = parser.parse_args()

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(SHAPE, dtype=torch.bfloat16, device="cuda", generator=gen)
    w = torch.randn(SHAPE[-1:], dtype=torch.bfloat16, device="cuda", generator=gen)
    xg = x.clone().requires_grad_()
    wg = w.clone().requires_grad_()
    op = torch.ops.rownorm.rms_norm.default
    torch_module = torch.nn.RMSNorm(SHAPE[-1], eps=EPS, device="cuda", dtype=torch.bfloat16)
    rownorm_module = rownorm.nn.RMSNorm(SHAPE[-1], eps=EPS, device="cuda", dtype=torch.bfloat16)

    def no_grad_op() -> object:
        with torch.no_grad():
            return op(x, w, -1, EPS)

    # The op's kernel for x's device alone: the dispatcher sent straight to it, past the
    # Python autograd kernel every call through the Autograd key runs.
    below_autograd = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)

    def no_grad(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return fn()

        return run

    def inference(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with torch.inference_mode():
                return fn()

        return run

    cases = [
        ("F.rms_norm", lambda: F.rms_norm(x, SHAPE[-1:], w, EPS)),
        ("rownorm.rms_norm", lambda: rownorm.rms_norm(x, w, eps=EPS)),
        ("torch.ops.rownorm.rms_norm", lambda: torch.ops.rownorm.rms_norm(x, w, -1, EPS)),
        ("torch.ops.rownorm.rms_norm.default", lambda: op(x, w, -1, EPS)),
        (".default under no_grad (incl. the context manager)", no_grad_op),
        (
            ".default sent to the CUDA kernel (op.redispatch: no autograd kernel)",
            lambda: op.redispatch(below_autograd, x, w, -1, EPS),
        ),
        (
            "torch.ops.aten.rms_norm.default (torch's op through torch.ops)",
            lambda: torch.ops.aten.rms_norm.default(x, list(SHAPE[-1:]), w, EPS),
        ),
        ("inference_mode: F.rms_norm", inference(lambda: F.rms_norm(x, SHAPE[-1:], w, EPS))),
        ("inference_mode: rownorm.rms_norm", inference(lambda: rownorm.rms_norm(x, w, eps=EPS))),
        ("F.rms_norm, requires_grad", lambda: F.rms_norm(xg, SHAPE[-1:], wg, EPS)),
        ("rownorm.rms_norm, requires_grad", lambda: rownorm.rms_norm(xg, wg, eps=EPS)),
        (
            "torch.ops.rownorm.rms_norm.default, requires_grad",
            lambda: op(xg, wg, -1, EPS),
        ),
        ("torch.nn.RMSNorm module (weight requires grad)", lambda: torch_module(x)),
        ("rownorm.nn.RMSNorm module (weight requires grad)", lambda: rownorm_module(x)),
        ("no_grad: torch.nn.RMSNorm module", no_grad(lambda: torch_module(x))),
        ("no_grad: rownorm.nn.RMSNorm module", no_grad(lambda: rownorm_module(x))),
        ("torch.empty_like(x) (allocation alone)", lambda: torch.empty_like(x)),
    ]
    lines = [
        f"# Host cost per eager call, {torch.cuda.get_device_name()}, torch {torch.__version__}",
        "",
        f"rms_norm of a {SHAPE[0]}×{SHAPE[1]} bf16 tensor, bf16 weight; µs per call, "
        f"best of 5 loops of {args.calls}.",
        "",
        "| call | µs |",
        "|---|---:|",
    ]
    for label, fn in cases:
        lines.append(f"| {label} | {per_call_us(fn, args.calls):.2f} |")
    print("\n".join(lines), flush=True)

    from torch.profiler import ProfilerActivity, profile

    for _ in range(100):
        op(x, w, -1, EPS)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(300):
            op(x, w, -1, EPS)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
    lines += [
        "",
        "Profiler, 300 calls of torch.ops.rownorm.rms_norm.default:",
        "",
        "```",
        table,
        "```",
    ]
    print(table, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
