"""A/B of an environment toggle read at launch, in one process.

A runs with VAR unset, B with VAR=VALUE; the two sides alternate over 6 interleaved rounds
(A,B then B,A ...) of fwd steps (mode fwd) or fwd+bwd steps taking every gradient (mode
fwdbwd), 10 steps a timing. Prints, per case, the median step time of each side in us with the
spread of its rounds, B/A, whether the two sides' outputs are bitwise the same (else the max
relative difference), and B's bandwidth in GB/s over the bytes a step must move.

usage: ab_env.py VAR=VALUE op:dtype:n:mode ...
  op: layer_norm, rms_norm, add_rms_norm or any one-input rownorm op (softmax, ...)
  dtype: bf16 or fp32; mode: fwd or fwdbwd
"""

import os
import statistics
import sys

import rownorm
import torch

DT = {"bf16": torch.bfloat16, "fp32": torch.float32}


def timeit(f, iters=10):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    f()
    torch.cuda.synchronize()
    s.record()
    for _ in range(iters):
        f()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1000 / iters


def make_step(op, mode, m, n, dtype):
    """Inputs (drawn in a fixed order from a generator seeded 0) and the step to time."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*s):
        t = torch.randn(*s, device="cuda", dtype=dtype, generator=g)
        return t.requires_grad_(mode == "fwdbwd")

    x, w, b, r = rnd(m, n), rnd(n), rnd(n), rnd(m, n)
    dy = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    if op == "layer_norm":
        leaves, call = [x, w, b], lambda: rownorm.layer_norm(x, w, b)
    elif op == "rms_norm":
        leaves, call = [x, w], lambda: rownorm.rms_norm(x, w)
    elif op == "add_rms_norm":
        leaves, call = [x, r, w], lambda: rownorm.add_rms_norm(x, r, w)[0]
    else:
        leaves, call = [x], lambda: getattr(rownorm, op)(x)
    f = (lambda: torch.autograd.grad(call(), leaves, dy)) if mode == "fwdbwd" else call
    return x, f


def main():
    var, val = sys.argv[1].split("=")
    for case in sys.argv[2:]:
        op, dt, n, mode = case.split(":")
        n = int(n)
        dtype = DT[dt]
        m = (1 << 27 if dtype == torch.bfloat16 else 1 << 26) // n
        x, f = make_step(op, mode, m, n, dtype)
        outs, ts = {}, {"A": [], "B": []}
        for rd in range(6):
            for side in ("A", "B") if rd % 2 == 0 else ("B", "A"):
                if side == "B":
                    os.environ[var] = val
                else:
                    os.environ.pop(var, None)
                if rd == 0:
                    o = f()
                    outs[side] = [t.detach().clone() for t in (o if isinstance(o, tuple) else (o,))]
                ts[side].append(timeit(f))
        os.environ.pop(var, None)
        pairs = list(zip(outs["A"], outs["B"], strict=False))
        same = all(torch.equal(a, b) for a, b in pairs)
        diff = max(
            ((a.float() - b.float()).abs().max() / (a.float().abs().max() + 1e-30)).item()
            for a, b in pairs
        )
        a, bb = statistics.median(ts["A"]), statistics.median(ts["B"])
        spa = (max(ts["A"]) - min(ts["A"])) / a * 100
        spb = (max(ts["B"]) - min(ts["B"])) / bb * 100
        esz = x.element_size()
        byts = (5 if mode == "fwdbwd" else 2) * m * n * esz + (
            m * n * esz * (3 if op == "add_rms_norm" and mode == "fwdbwd" else 0)
        )
        verdict = "bitwise same" if same else f"max rel diff {diff:.2e}"
        # bb is in us: bytes / us / 1e3 = GB/s
        print(
            f"{case}: A {a:.1f} us (±{spa:.1f}%)  B {bb:.1f} us (±{spb:.1f}%)  B/A {bb / a:.3f}  "
            f"{verdict}  B {byts / bb / 1e3:.0f} GB/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
