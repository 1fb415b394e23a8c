"""Probe: forward time of rows under the tier table's plan and under other plans.

The other plans are chosen by the env knobs ROWNORM_PLAN_AS_N / ROWNORM_CLUSTER_ROWS (see
CONFIGS). One process, interleaved rounds (5), each config timed against a copy of the same
bytes (y.copy_(x)); 2^27 bf16 or 2^26 fp32 elements per case. Prints each config's plan, then
per case the median copy time and, per config, the median time in us, the copy's time as a
percentage of it, and the spread of the rounds.

usage: probe_tiers.py op:dtype:n:cfg[,cfg...] ...
  op: layer_norm, rms_norm, softmax, log_softmax, l2_normalize, l1_normalize
  dtype: bf16 or fp32; cfg: a key of CONFIGS
"""

import functools
import os
import statistics
import sys

import rownorm
import torch


def timeit(f, iters=20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    f()
    torch.cuda.synchronize()
    s.record()
    for _ in range(iters):
        f()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1000 / iters


def call(op, x, w, b):
    if op == "layer_norm":
        return lambda: rownorm.layer_norm(x, w, b)
    if op == "rms_norm":
        return lambda: rownorm.rms_norm(x, w)
    if op == "softmax":
        return lambda: rownorm.softmax(x)
    if op == "log_softmax":
        return lambda: rownorm.log_softmax(x)
    if op == "l2_normalize":
        return lambda: rownorm.l2_normalize(x)
    if op == "l1_normalize":
        return lambda: rownorm.l1_normalize(x)
    raise SystemExit(
        f"probe_tiers: unknown op {op!r} (known: layer_norm, rms_norm, softmax, log_softmax, "
        "l2_normalize, l1_normalize)"
    )


CONFIGS = {
    "table": {},
    "stream": {"ROWNORM_PLAN_AS_N": str(1 << 24)},
    "regs": {"ROWNORM_CLUSTER_ROWS": "registers"},
    "shared": {"ROWNORM_CLUSTER_ROWS": "shared"},
    "c4": {"ROWNORM_PLAN_AS_N": "32769"},
    # ROWNORM_WIDE_CTA_2PERSM was an experiment toggle that no longer exists in the code: this
    # config only had effect on the experiment build of the eighteenth session (elsewhere it
    # measures the table's plan again).
    "2sm": {"ROWNORM_WIDE_CTA_2PERSM": "1"},
}
KNOBS = ("ROWNORM_PLAN_AS_N", "ROWNORM_CLUSTER_ROWS", "ROWNORM_WIDE_CTA_2PERSM")


def main():
    cases = [a.split(":") for a in sys.argv[1:]]
    for op, dt, n, cfgs in cases:
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dt]
        n = int(n)
        m = (1 << 27) // n if dtype == torch.bfloat16 else (1 << 26) // n
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        b = torch.randn(n, device="cuda", dtype=dtype)
        y = torch.empty_like(x)
        res = {c: [] for c in cfgs.split(",")}
        res["copy"] = []
        for c in cfgs.split(","):
            os.environ.update(CONFIGS[c])
            print("  plan", c, rownorm.explain(x, op))
            for k in CONFIGS[c]:
                os.environ.pop(k, None)
        ref = None
        for r in range(5):
            for c in list(res):
                for k in KNOBS:
                    os.environ.pop(k, None)
                if c == "copy":
                    res[c].append(timeit(functools.partial(y.copy_, x)))
                    continue
                os.environ.update(CONFIGS[c])
                f = call(op, x, w, b)
                if r == 0:
                    out = f()
                    if ref is None:
                        ref = out.float()
                    err = (out.float() - ref).abs().max().item()
                    if err > (0.05 if dtype == torch.bfloat16 else 1e-4):
                        print("MISMATCH", op, c, err)
                res[c].append(timeit(f))
        for k in KNOBS:
            os.environ.pop(k, None)
        cp = statistics.median(res["copy"])
        line = f"{op} {dt} {n}: copy {cp:.1f}"
        for c in cfgs.split(","):
            t = statistics.median(res[c])
            sp = (max(res[c]) - min(res[c])) / t * 100
            line += f" | {c} {t:.1f} ({cp / t * 100:.0f}%, ±{sp:.1f}%)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
