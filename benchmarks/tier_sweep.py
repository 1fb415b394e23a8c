"""The tier sweep: the measurement behind each boundary of the tier table (PlanRowTier in
src/kernels/common/plan.h), on the GPU it runs on.

    python benchmarks/tier_sweep.py [--ops rms_norm,layer_norm,...] [--dtypes bf16,fp32]
                                    [--modes fwd,fwdbwd] [--log2-elems 27] [--rounds 2]
                                    [--max-n 524288] [--ns 393216,...] [--ladder 3]
                                    [--out DIR]

A boundary of the table is the longest row a configuration holds (its edge); the next length
runs the next configuration up. At every edge of each element size this times the edge row
under the table's own configuration and under the next one (``ROWNORM_PLAN_AS_N`` = edge + 1:
the row planned as one element longer; the next configuration holds it too), forward and
forward + backward (with every parameter gradient), M = elems / N rows, the L2 flushed before
every rep (rownorm.bench's Timer), the two interleaved over ``--rounds`` rounds. A boundary
is where it should be when the next configuration is not faster at the edge (ratio next / own
≥ 1); a ratio below 1 says the boundary belongs lower. With ``--ns`` it times the given
lengths instead, each under its own configuration and the next one up (planned as one element
past the edge of its own configuration): how far below an edge a finding holds. With
``--ladder K`` it times the K configurations above each row's own (one row of the report
each, all against the same own timing): where a GPU with more bandwidth per SM (the H200)
wants more bytes in flight than the next configuration gives. Each other
configuration's output is checked against the table's own first (same op, same inputs;
relative error within the dtype's tolerance).

One op per kernel family: l2_normalize (l1_normalize's kernels), rms_norm, add_rms_norm,
layer_norm, softmax (log_softmax's). Writes DIR/tier_sweep.csv and DIR/tier_sweep.md.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics

import rownorm
import torch
from rownorm.bench.check import TOLERANCE
from rownorm.bench.specs import OPS as SPECS
from rownorm.bench.timer import Timer, time_impl
from rownorm.testing.tiers import tier_boundaries

OPS = ("l2_normalize", "rms_norm", "add_rms_norm", "layer_norm", "softmax")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
ENV = "ROWNORM_PLAN_AS_N"


def make_case(op: str, m: int, n: int, dtype: torch.dtype, mode: str, device: str = "cuda"):
    """(fn, inputs, dys, bytes moved) of one op on M x N rows: the benchmark's own (the op
    table's inputs, call and byte formula, rownorm.bench.specs)."""
    spec = SPECS[op]
    gen = torch.Generator(device=device).manual_seed(0)
    inputs = spec.make_inputs((m, n), -1, dtype, device, gen)
    dys = [
        torch.randn(m, n, device=device, dtype=dtype, generator=gen) for _ in range(spec.n_outputs)
    ]
    fn = spec.ours().make(-1, dict(spec.kwargs))
    return fn, inputs, dys, spec.nbytes(mode, m, n, inputs[0].element_size())


def plan_as(value: str | None) -> None:
    """Sets ROWNORM_PLAN_AS_N (read by the planner at every call), or unsets it (None)."""
    if value is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = value


def relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def plan_text(op: str, x: torch.Tensor, mode: str) -> str:
    backward = mode == "fwdbwd"
    params = op in ("rms_norm", "add_rms_norm", "layer_norm")
    return str(rownorm.explain(x, op, backward=backward, param_grads=backward and params))


def plan_lengths_above(n: int, edges: list[int], count: int) -> list[int]:
    """The shortest rows of the `count` configurations above n's own: one past the edge of
    n's configuration, then one past each edge after it (as many as the table has)."""
    above = [e + 1 for e in edges if e >= n]
    return above[:count]


def sweep_one(timer, op, dtype, mode, n, plan_ns, elems, rounds) -> list[dict]:
    """Times the row of n under its own configuration and under each configuration planned
    as plan_ns (interleaved over the rounds); one result per configuration above its own."""
    m = max(1, elems // n)
    fn, inputs, dys, nbytes = make_case(op, m, n, dtype, mode)
    x = inputs[0].detach()
    configs = {"own": None, **{str(v): str(v) for v in plan_ns}}
    times: dict[str, list[float]] = {k: [] for k in configs}
    plans, errs = {}, {}
    try:
        for name, value in configs.items():
            plan_as(value)
            plans[name] = plan_text(op, x, mode)
            with torch.no_grad():
                out = fn(*inputs)
                out = out[0] if isinstance(out, tuple) else out
            if name == "own":
                reference = out
            else:
                errs[name] = relerr(out, reference)
        for _ in range(rounds):
            for name, value in configs.items():
                plan_as(value)
                times[name].append(time_impl(timer, fn, inputs, mode, dys, rep_ms=50.0))
    finally:
        plan_as(None)
    own = statistics.mean(times["own"])
    spread = round(max(max(t) / min(t) - 1 for t in times.values()), 3)
    rows = []
    for name in configs:
        if name == "own":
            continue
        alt = statistics.mean(times[name])
        rows.append(
            dict(
                op=op,
                dtype=str(dtype).removeprefix("torch."),
                mode=mode,
                N=n,
                M=m,
                planned_as=int(name),
                own_us=round(own * 1e3, 2),
                next_us=round(alt * 1e3, 2),
                next_over_own=round(alt / own, 3),
                own_gbps=round(nbytes / (own * 1e6), 1),
                spread=spread,
                next_relerr=f"{errs[name]:.1e}",
                ok=errs[name] <= TOLERANCE[dtype],
                own_plan=plans["own"],
                next_plan=plans[name],
            )
        )
    return rows


def write(rows: list[dict], out_dir: str, gpu: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tier_sweep.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [
        f"# Tier sweep — {gpu}",
        "",
        f"rownorm {rownorm.__version__} rev {rownorm.build_info().get('revision', '?')}; "
        "each edge row (the longest row of a configuration) under the table's configuration "
        "(own) and a configuration above it (next: the row planned as the length given, the "
        "shortest row of that configuration), µs (median, L2 flushed), mean over the rounds; "
        "next/own < 1: that configuration was faster. Plans: tier_sweep.csv.",
        "",
        "| op | dtype | mode | N | planned as | own µs | next µs | next/own | own GB/s | spread "
        "| check |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['dtype']} | {r['mode']} | {r['N']} | {r['planned_as']} | "
            f"{r['own_us']} | "
            f"{r['next_us']} | {'**' if r['next_over_own'] < 0.97 else ''}{r['next_over_own']}"
            f"{'**' if r['next_over_own'] < 0.97 else ''} | {r['own_gbps']} | {r['spread']} | "
            f"{'ok' if r['ok'] else 'MISMATCH ' + r['next_relerr']} |"
        )
    with open(os.path.join(out_dir, "tier_sweep.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--modes", default="fwd,fwdbwd")
    parser.add_argument("--log2-elems", type=int, default=27, help="M·N = 2^this")
    parser.add_argument("--max-n", type=int, default=1 << 19)
    parser.add_argument("--ns", default="", help="these row lengths instead of the edges")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--ladder",
        type=int,
        default=1,
        help="time this many configurations above each row's own (default 1: the next one)",
    )
    parser.add_argument("--out", default="tier_sweep")
    args = parser.parse_args()

    timer = Timer(torch.device("cuda"))
    rows = []
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        edges = tier_boundaries(torch.empty((), dtype=dtype).element_size())
        ns = [int(v) for v in args.ns.split(",") if v] or edges
        for n in (n for n in ns if n <= min(args.max_n, edges[-1])):
            for op in args.ops.split(","):
                for mode in args.modes.split(","):
                    plan_ns = plan_lengths_above(n, edges, args.ladder)
                    found = sweep_one(
                        timer, op, dtype, mode, n, plan_ns, 1 << args.log2_elems, args.rounds
                    )
                    rows.extend(found)
                    for r in found:
                        print(
                            f"{op} {dname} {mode} N={n} as {r['planned_as']}: own "
                            f"{r['own_us']} us next {r['next_us']} us ({r['next_over_own']}) "
                            f"{'ok' if r['ok'] else 'MISMATCH'}",
                            flush=True,
                        )
                    torch.cuda.empty_cache()
                    write(rows, args.out, torch.cuda.get_device_name())  # as far as it got


if __name__ == "__main__":
    main()
