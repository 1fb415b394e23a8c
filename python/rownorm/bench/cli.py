"""The command line: ``python -m rownorm.bench`` (``--help`` lists the options)."""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rownorm import build_info
from rownorm.bench import runner as run
from rownorm.bench.impls import FAMILIES, peer_versions
from rownorm.bench.report import is_ours, small_call_table, write_reports
from rownorm.bench.runner import (
    FIRST_ROUND_NS,
    GRID_ELEMS,
    GRID_NS,
    QUICK_ELEMS,
    QUICK_NS,
    RunInfo,
    Runner,
    build_configs,
    probe_impls,
)
from rownorm.bench.specs import MODES, OPS
from rownorm.bench.timer import (
    COPY_BYTES_CPU,
    COPY_BYTES_CUDA,
    Timer,
    measure_copy_bandwidth,
    measure_small_calls,
)

DTYPE_ALIASES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "f32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "f16": torch.float16,
    "half": torch.float16,
    "float64": torch.float64,
    "fp64": torch.float64,
    "double": torch.float64,
}


def device_slug(device: torch.device) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; the results folder name."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device)
    m = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Za-z]?)\b", name.replace("NVIDIA", ""))
    if m:
        return m.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def _csv_list(kind: Callable[[str], Any]) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            return [kind(t.strip()) for t in text.split(",") if t.strip()]
        except (ValueError, KeyError) as err:
            raise argparse.ArgumentTypeError(f"bad value in {text!r}: {err}") from err

    return parse


def _dtype(name: str) -> torch.dtype:
    try:
        return DTYPE_ALIASES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (one of {', '.join(DTYPE_ALIASES)})") from None


def _int_expr(text: str) -> int:
    """'65536', '2**16', '1<<16' or '64k'."""
    t = text.lower().replace("_", "")
    if re.fullmatch(r"\d+", t):
        return int(t)
    if m := re.fullmatch(r"(\d+)\*\*(\d+)", t):
        return int(m.group(1)) ** int(m.group(2))
    if m := re.fullmatch(r"(\d+)<<(\d+)", t):
        return int(m.group(1)) << int(m.group(2))
    if m := re.fullmatch(r"(\d+)([km])", t):
        return int(m.group(1)) * (1024 if m.group(2) == "k" else 1024 * 1024)
    raise ValueError(f"not an integer: {text!r}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m rownorm.bench",
        description="Bandwidth benchmark of the rownorm ops against eager PyTorch, "
        "torch.compile and Liger (correctness checked first).",
    )
    p.add_argument(
        "--ops",
        type=_csv_list(str),
        default=None,
        help=f"ops to run (default: all: {','.join(OPS)}; an op whose grid is off by default "
        "(mean_abs: the same kernel as l1_normalize) runs its grid only when named here)",
    )
    p.add_argument(
        "--dtypes",
        type=_csv_list(_dtype),
        default=None,
        help="dtypes of the grid (default float32,bfloat16)",
    )
    p.add_argument(
        "--ns",
        type=_csv_list(_int_expr),
        default=None,
        help=f"row lengths N (default {','.join(map(str, GRID_NS))}; "
        f"--quick: {','.join(map(str, QUICK_NS))}); {','.join(map(str, FIRST_ROUND_NS))} are "
        "measured first for every op, then the others",
    )
    p.add_argument(
        "--modes", type=_csv_list(str), default=list(MODES), help="fwd and/or fwdbwd (default both)"
    )
    p.add_argument(
        "--impls",
        type=_csv_list(str),
        default=list(FAMILIES),
        help="families (rownorm,eager,compile,liger) or implementation names "
        "(e.g. compile_norm); default all families",
    )
    p.add_argument(
        "--elems",
        type=_int_expr,
        default=None,
        help="M·N elements per grid point (default 2**28; --quick 2**26); M = ceil(elems / N)",
    )
    p.add_argument("--out", default=None, help="output folder (default benchmarks/results/<gpu>)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="small grid (N 1024,4096,65535; 2**26 elements), short timing, no seeds",
    )
    p.add_argument(
        "--seeds",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the seeds' workloads (default: on, off with --quick)",
    )
    p.add_argument("--seeds-only", action="store_true", help="only the seeds' workloads")
    p.add_argument(
        "--small-calls",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure the per-call cost of rms_norm on a 1×4096 bf16 tensor, eager and under "
        "a CUDA graph, against F.rms_norm (default: on, off with --quick; CUDA only)",
    )
    p.add_argument("--device", default=None, help="cuda (default when available), cuda:1, cpu")
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="S",
        help="stop starting new measurements after S seconds (results so far written)",
    )
    p.add_argument(
        "--reserve-s",
        type=float,
        default=10.0,
        help="with --time-budget: do not start a measurement with less than this left",
    )
    p.add_argument(
        "--warmup-ms", type=float, default=None, help="warm-up time per measurement (default 10)"
    )
    p.add_argument(
        "--rep-ms", type=float, default=None, help="timed time per measurement (default 50)"
    )
    p.add_argument("--min-reps", type=int, default=10, help="at least this many timed reps")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="time each configuration's implementations in this many interleaved rounds "
        "(rep-ms split among them; the median is reported; default 3)",
    )
    p.add_argument(
        "--max-mem-gb",
        type=float,
        default=None,
        help="skip configurations estimated to need more device memory",
    )
    p.add_argument(
        "--time-failing",
        action="store_true",
        help="also time implementations that fail the correctness check",
    )
    p.add_argument(
        "--command-file",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write COMMAND.txt beside the results (default on)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed of the inputs")
    p.add_argument("--list", action="store_true", help="list ops and implementations, then exit")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the configurations that would run (after probing the peers), then exit",
    )
    args = p.parse_args(argv)

    args.ops_named = list(args.ops or ())
    args.ops = args.ops or list(OPS)
    for op in args.ops:
        if op not in OPS:
            p.error(f"unknown op {op!r}; known: {', '.join(OPS)}")
    for mode in args.modes:
        if mode not in MODES:
            p.error(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    known = set(FAMILIES) | {i.name for s in OPS.values() for i in s.impls}
    for name in args.impls:
        if name not in known:
            p.error(f"unknown implementation {name!r}; known: {', '.join(sorted(known))}")
    args.dtypes = args.dtypes or [torch.float32, torch.bfloat16]
    args.ns = args.ns or list(QUICK_NS if args.quick else GRID_NS)
    if any(n < 1 for n in args.ns):
        p.error("--ns: every N must be >= 1")
    if args.rounds < 1:
        p.error(f"--rounds: must be >= 1, got {args.rounds}")
    args.elems = args.elems or (QUICK_ELEMS if args.quick else GRID_ELEMS)
    if args.seeds is None:
        args.seeds = not args.quick or args.seeds_only
    if args.small_calls is None:
        args.small_calls = not args.quick
    if args.seeds_only:
        args.seeds = True
    # Modest on purpose: every op × N × dtype × mode × implementation is one measurement, and
    # a median of ≥ 50 reps of a ≥ 0.3 ms op is stable to about 1%.
    if args.warmup_ms is None:
        args.warmup_ms = 5.0 if args.quick else 10.0
    if args.rep_ms is None:
        args.rep_ms = 25.0 if args.quick else 50.0
    return args


def _command_line(argv: Sequence[str] | None) -> str:
    args = list(sys.argv[1:] if argv is None else argv)
    return "python -m rownorm.bench " + " ".join(shlex.quote(a) for a in args)


def list_ops() -> str:
    lines = []
    for spec in OPS.values():
        lines.append(
            f"{spec.name}  (fwd bytes {spec.bytes_text('fwd')}; fwd+bwd bytes "
            f"{spec.bytes_text('fwdbwd')})"
        )
        for i in spec.impls:
            extra = "" if i.grid else "  [seeds / when named]"
            lines.append(f"  {i.name:<16} {i.family:<8} {i.expr}{extra}")
        for s in spec.seeds:
            lines.append(f"  seed: {s.title} ({s.mode})")
        if not spec.default_grid:
            lines.append("  (grid only when named in --ops)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, command: str | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        print(list_ops())
        return 0
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)  # CUDA events record on the current device's stream
    if device.type == "cpu":
        print(
            "warning: no CUDA device; timing on the CPU with wall time (smoke runs only)",
            flush=True,
        )
    out_dir = args.out or os.path.join("benchmarks", "results", device_slug(device))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    info = RunInfo(
        device_name=name,
        copy_gbps=None,
        command=command or _command_line(argv),
        started=datetime.datetime.now().isoformat(timespec="seconds"),
        build=build_info(),
        ops=list(args.ops),
        rounds=args.rounds,
    )
    specs = [OPS[o] for o in args.ops]
    unavailable = probe_impls(specs, args.impls, device)
    for (op, impl), why in unavailable.items():
        print(f"{op} {impl}: not run ({why})", flush=True)
    configs = build_configs(args, specs, unavailable)
    n_meas = sum(len(c.impls) for c in configs)
    if args.dry_run:
        for cfg in configs:
            where = "" if cfg.workload == "grid" else f"  [{cfg.workload}]"
            print(f"  {cfg.describe()}: {', '.join(i.name for i in cfg.impls)}{where}")
        print(f"{len(configs)} configurations, {n_meas} measurements")
        return 0
    os.makedirs(out_dir, exist_ok=True)
    info.peers = peer_versions()
    print(
        f"rownorm.bench on {name}: {len(configs)} configurations, {n_meas} measurements "
        f"-> {out_dir}",
        flush=True,
    )
    runner = Runner(args, device, info)
    runner.open_csv(os.path.join(out_dir, "results.csv"))
    old_handler = signal.signal(signal.SIGTERM, run.on_sigterm)
    interrupted = False
    t0 = time.monotonic()
    try:
        runner.timer = Timer(device)
        info.flush_bytes = runner.timer.flush_bytes
        nbytes = COPY_BYTES_CUDA if device.type == "cuda" else COPY_BYTES_CPU
        info.copy_bytes = nbytes
        if device.type != "cuda":
            info.timer = "wall time (CPU)"
        info.copy_gbps, copy_ms = measure_copy_bandwidth(runner.timer, nbytes, args.quick)
        print(
            f"copy limit: {info.copy_gbps:.0f} GB/s ({nbytes >> 20} MiB copy in {copy_ms:.3f} ms)",
            flush=True,
        )
        run.free(device)
        if args.small_calls and device.type == "cuda":
            info.small_calls = measure_small_calls(device)
            for line in small_call_table(info.small_calls)[4:]:
                print(line, flush=True)
        runner.run(configs)
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: writing the results measured so far", flush=True)
        info.notes.append("run interrupted (SIGTERM or Ctrl-C): later measurements missing")
    finally:
        signal.signal(signal.SIGTERM, old_handler)
        runner.close_csv()
        info.duration_s = time.monotonic() - t0
        for (op, impl), why in unavailable.items():
            info.notes.append(f"{op} {impl}: not run ({why})")
        if runner.aborted:
            info.notes.append(runner.aborted)
        if device.type == "cpu":
            info.notes.append("CPU wall-time smoke run: the numbers say nothing about GPUs")
        paths = write_reports(
            runner.results,
            info,
            out_dir,
            args.command_file,
            csv_path=os.path.join(out_dir, "results.csv"),
        )
        print("wrote " + ", ".join(paths), flush=True)
    bad = [r for r in runner.results if r.status in ("FAIL", "error") and is_ours(r)]
    peers_bad = [r for r in runner.results if r.status in ("FAIL", "error") and r not in bad]
    if peers_bad:
        print(
            f"{len(peers_bad)} peer measurement(s) failed or errored (see results.md Notes)",
            flush=True,
        )
    if bad:
        print(f"rownorm FAILED {len(bad)} check(s):", flush=True)
        for r in bad:
            print(f"  {r.op} {r.mode} {r.dtype} M={r.M} N={r.N}: {r.status} {r.note}", flush=True)
        return 1
    return 143 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
