"""A/B timing of two rownorm builds on one GPU, interleaved, in one call.

Two builds of rownorm register the same ``torch.ops.rownorm`` namespace, so they cannot share a
process: each side runs as its own worker process (``PYTHONPATH`` pointing at its package), and
the sides alternate, A B then B A, for ``--reps`` rounds so that drift of the GPU (clocks,
temperature) falls on both. Each worker times every case with CUDA events (median of the
iterations); the report gives, per case, the median over rounds of each side, B / A, and the
spread of each side over its rounds, which is the noise a difference must exceed to mean
anything (a ratio within it is marked ~).

    git archive <old commit> | (mkdir -p /tmp/old && tar -x -C /tmp/old)
    (cd /tmp/old && python setup.py build_ext --inplace)     # and the same in this tree
    python benchmarks/ab_builds.py --a /tmp/old/python --b python --reps 3 --out ab.md

It calls the public functions only (``rownorm.rms_norm(x, w, dim=...)`` ...), which both sides
of a refactor keep, so any two builds compare. ``--a-env`` / ``--b-env VAR=value`` set a
side's environment: one build against itself under a planning knob, e.g. the fused parameter
gradients against the two-pass path,

    python benchmarks/ab_builds.py --a python --b python --b-env ROWNORM_PARAM_GRADS=two-pass
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# (op, dtype, shape, dim): bf16 rows across the tiers (group, CTA, cluster, streaming), fp32
# rows, and the strided-dim path (the channel dim of NCHW) — the shapes a refactor of the row
# engine can slow down. 8192 is bf16's 256-thread 4-pack CTA, whose fused backward lost 10%
# to a register change unseen while this grid lacked it (benchmarks/results/h100/NOTES.md §30).
ROW_NS = (256, 1024, 4096, 8192, 16384, 65536, 262144)
OPS = (
    "l2_normalize",
    "l1_normalize",
    "rms_norm",
    "layer_norm",
    "softmax",
    "log_softmax",
    "add_rms_norm",
)


def cases(ops: tuple[str, ...] = OPS, ns: tuple[int, ...] | None = None) -> list[dict]:
    """The cases; ``ns``: these row lengths in both dtypes instead of ROW_NS (fp32: a subset)."""
    out = []
    for op in ops:
        for dtype, elems in (("bfloat16", 1 << 27), ("float32", 1 << 26)):
            for n in ROW_NS if ns is None else ns:
                if ns is None and dtype == "float32" and n not in (1024, 16384, 262144):
                    continue
                out.append({"op": op, "dtype": dtype, "shape": [elems // n, n], "dim": -1})
    for op in [o for o in ("rms_norm", "l2_normalize") if o in ops]:
        out.append({"op": op, "dtype": "float32", "shape": [16, 64, 256, 256], "dim": 1})
        out.append({"op": op, "dtype": "bfloat16", "shape": [32, 32, 256, 256], "dim": 1})
    return out


def strided_cases(ops: tuple[str, ...]) -> list[dict]:
    """Channel dims of NCHW (the strided-dim path's packed kernel): d = 3, 16, 32 (the warp
    layout's 1, 2 and 4 lanes a column) and 64 (the CTA layout), 2^26 elements."""
    out = []
    for op in ops:
        for dtype in ("bfloat16", "float32"):
            for d in (3, 16, 32, 64):
                out.append(
                    {
                        "op": op,
                        "dtype": dtype,
                        "shape": [(1 << 26) // (d << 16), d, 256, 256],
                        "dim": 1,
                    }
                )
    return out


def worker(
    iters: int, ops: tuple[str, ...], ns: tuple[int, ...] | None, strided: bool, samples: int = 3
) -> None:
    import rownorm
    import torch

    # Bring the clocks up before the first case (an idle H100 sits at a few hundred MHz).
    a = torch.randn(8192, 8192, device="cuda")
    for _ in range(200):
        a = a @ a.T
        a = a / a.norm()
    torch.cuda.synchronize()

    def run(case: dict, backward: bool):
        dtype = getattr(torch, case["dtype"])
        x = torch.randn(case["shape"], device="cuda", dtype=dtype)
        n = x.shape[case["dim"]]
        op, dim = case["op"], case["dim"]
        w = torch.randn(n, device="cuda", dtype=dtype)
        b = torch.randn(n, device="cuda", dtype=dtype)
        r = torch.randn_like(x)
        leaves = [x] + ([w] if op in ("rms_norm", "layer_norm", "add_rms_norm") else [])
        leaves += [b] if op == "layer_norm" else []
        leaves += [r] if op == "add_rms_norm" else []
        if backward:
            for t in leaves:
                t.requires_grad_(True)

        def call():
            if op == "rms_norm":
                return rownorm.rms_norm(x, w, dim=dim)
            if op == "layer_norm":
                return rownorm.layer_norm(x, w, b, dim=dim)
            if op == "add_rms_norm":
                return rownorm.add_rms_norm(x, r, w)[0]
            return getattr(rownorm, op)(x, dim=dim)

        dy = torch.randn_like(x) if backward else None

        def step():
            y = call()
            if backward:
                y.backward(dy)
                for t in leaves:
                    t.grad = None

        for _ in range(3):
            step()
        # Back-to-back steps between one pair of events: a host sync after every step lets the
        # clocks sag between launches, which made one build look 2x slower than itself.
        times = []
        for _ in range(samples):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / iters)
        return statistics.median(times)

    results = {}
    for case in cases(ops, ns) + (strided_cases(ops) if strided else []):
        for backward in (False, True):
            key = json.dumps([case, backward])
            results[key] = run(case, backward)
            torch.cuda.empty_cache()
    print(json.dumps(results))


def report(runs: dict[str, list[dict]], reps: int) -> tuple[list[str], str]:
    """The markdown table (per case: the median over rounds of each side, B / A, each side's
    spread over its rounds) and the one-line summary of the rounds of both sides."""
    lines = [
        "| op | dtype | shape | dim | pass | A µs | B µs | B/A | A spread | B spread |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    worst = []
    within_noise = 0
    for key in runs["A"][0]:
        case, backward = json.loads(key)
        a = [r[key] for r in runs["A"]]
        b = [r[key] for r in runs["B"]]
        am, bm = statistics.median(a), statistics.median(b)
        spread = (max(a) - min(a)) / am
        b_spread = (max(b) - min(b)) / bm
        ratio = bm / am
        worst.append((ratio, spread, case, backward))
        # A difference no larger than either side's spread over its rounds is noise: marked.
        noise = abs(ratio - 1) <= max(spread, b_spread)
        within_noise += noise
        lines.append(
            f"| {case['op']} | {case['dtype']} | {'x'.join(map(str, case['shape']))} | "
            f"{case['dim']} | {'fwd+bwd' if backward else 'fwd'} | {am:.1f} | {bm:.1f} | "
            f"{ratio:.3f}{' ~' if noise else ''} | {spread:.3f} | {b_spread:.3f} |"
        )
    worst.sort(key=lambda t: -t[0])
    ratios = [w[0] for w in worst]
    summary = (
        f"\n{len(ratios)} cases, {reps} rounds: B/A median {statistics.median(ratios):.3f}, "
        f"max {ratios[0]:.3f} ({worst[0][2]['op']} {worst[0][2]['dtype']} "
        f"{worst[0][2]['shape']} {'fwd+bwd' if worst[0][3] else 'fwd'}), min {ratios[-1]:.3f}; "
        f"{within_noise} within a side's spread (marked ~)"
    )
    return lines, summary


def worker_env(base: dict[str, str], pythonpath: str, pairs: list[str]) -> dict[str, str]:
    """A side's worker environment: `base` with PYTHONPATH and each ``VAR=value`` of `pairs`."""
    env = dict(base, PYTHONPATH=pythonpath)
    for pair in pairs:
        var, sep, value = pair.partition("=")
        if not sep or not var:
            raise SystemExit(f"ab_builds.py: --a-env / --b-env takes VAR=value, not {pair!r}")
        env[var] = value
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="PYTHONPATH of build A (the baseline)")
    parser.add_argument("--b", required=True, help="PYTHONPATH of build B")
    for side in ("a", "b"):
        parser.add_argument(
            f"--{side}-env",
            action="append",
            default=[],
            metavar="VAR=value",
            help=f"an environment variable of side {side.upper()}'s workers (repeatable)",
        )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10, help="steps per timed sample")
    parser.add_argument("--ops", default=",".join(OPS), help="comma list of ops (default: all)")
    parser.add_argument(
        "--ns", default=None, help="comma list of row lengths, both dtypes (default: ROW_NS)"
    )
    parser.add_argument(
        "--strided", action="store_true", help="add the channel dims d = 3-64 (strided_cases)"
    )
    parser.add_argument("--out", default=None, help="markdown report path")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        ns = None if args.ns is None else tuple(int(n) for n in args.ns.split(","))
        worker(args.iters, tuple(args.ops.split(",")), ns, args.strided)
        return
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    for rep in range(args.reps):
        for side in ("A", "B") if rep % 2 == 0 else ("B", "A"):
            path, pairs = (args.a, args.a_env) if side == "A" else (args.b, args.b_env)
            env = worker_env(dict(os.environ), path, pairs)
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                "--iters",
                str(args.iters),
                "--ops",
                args.ops,
                *([] if args.ns is None else ["--ns", args.ns]),
                *(["--strided"] if args.strided else []),
                "--a",
                "",
                "--b",
                "",
            ]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {rep} side {side} done", flush=True)
    lines, summary = report(runs, args.reps)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n" + summary + "\n")
    print(
        "\n".join(lines[:2] + [ln for ln in lines[2:] if float(ln.split("|")[8].split()[0]) > 1.03])
    )
    print(summary)


if __name__ == "__main__":
    main()
