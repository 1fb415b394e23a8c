"""The report of a run: ``results.md`` (one table per op × mode, the seeds' workloads, the small
calls, notes), one plot per op (matplotlib, when importable) and ``results.csv``.

The tables are a few groupings of the results with cells of their own format (GB/s and % of
the copy limit, FAIL with its error, the best peer); the standard library does that in less
than pandas + tabulate would need as dependencies.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence

import torch

from rownorm.bench.impls import FAMILIES, Impl
from rownorm.bench.runner import CSV_FIELDS, SAME_BYTES_COPY, Result, RunInfo
from rownorm.bench.specs import OPS, SHORT_DTYPE
from rownorm.bench.timer import SmallCall


def small_call_table(calls: Sequence[SmallCall]) -> list[str]:
    base = next((c for c in calls if c.label == "F.rms_norm"), None)
    lines = [
        "## Small calls — rms_norm on a 1×4096 bf16 tensor (bf16 weight)",
        "",
        "eager: µs per call of 2000 back-to-back calls synchronized once (best of 5 loops): the "
        "host's cost per call (dispatch, checks, allocation, launch); CUDA graph: µs per call "
        "of a replayed CUDA graph of many calls (`triton.testing.do_bench_cudagraph`, median): "
        "the GPU work alone",
        "",
        "| implementation | eager µs/call | vs F.rms_norm | CUDA graph µs/call |",
        "|---|---:|---:|---:|",
    ]
    for c in calls:
        vs = f"{c.host_us - base.host_us:+.2f} µs" if base is not None else "—"
        graph = f"{c.graph_us:.2f}" if c.graph_us is not None else f"failed ({c.graph_note})"
        lines.append(f"| `{c.expr}` | {c.host_us:.2f} | {vs} | {graph} |")
    return lines + [""]


def _short(dtype_name: str) -> str:
    return SHORT_DTYPE.get(getattr(torch, dtype_name, None), dtype_name)


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:g} MiB"


def _num(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _cell(r: Result | None) -> str:
    if r is None:
        return "—"
    if r.status == "ok":
        return f"{_num(r.gbps)} ({r.pct:.0f}%)" if r.pct is not None else _num(r.gbps)
    if r.status == "FAIL":
        err = f"err {r.rel_err:.0e}" if r.rel_err is not None else ""
        timed = f", {_num(r.gbps)} GB/s" if r.gbps else ""
        return f"FAIL ({err}{timed})"
    return r.status


def _ms(v: float) -> str:
    """Milliseconds with 3–4 significant digits: 6.05, 0.0140."""
    return f"{v:.2f}" if v >= 1 else f"{v:.3f}" if v >= 0.1 else f"{v:.4f}"


def _ms_cell(r: Result | None) -> str:
    if r is None:
        return "—"
    if r.status == "ok":
        return f"{_ms(r.ms)} ({r.pct:.0f}%)" if r.pct is not None else _ms(r.ms)
    return _cell(r)


def _impl_meta(op: str) -> dict[str, Impl]:
    spec = OPS.get(op)
    return {i.name: i for i in spec.impls} if spec else {}


def is_ours(r: Result) -> bool:
    impl = _impl_meta(r.op).get(r.impl)
    return impl is not None and impl.family == "rownorm"


def _label(op: str, impl: str) -> str:
    meta = _impl_meta(op).get(impl)
    return meta.label if meta else impl


def _ordered_impls(op: str, results: Sequence[Result]) -> list[str]:
    present = {r.impl for r in results}
    order = list(_impl_meta(op))
    return [n for n in order if n in present] + sorted(present - set(order))


def best_peer(by_impl: dict[str, Result]) -> tuple[Result | None, Result | None]:
    """(rownorm's result, the fastest correct peer's result) of one configuration."""
    ours = next((r for r in by_impl.values() if is_ours(r)), None)
    ok = [
        r
        for r in by_impl.values()
        if not is_ours(r) and r.impl != SAME_BYTES_COPY and r.status == "ok" and r.ms
    ]
    return ours, min(ok, key=lambda r: r.ms) if ok else None


def _vs(ours: Result | None, best: Result | None) -> str:
    """rownorm's speed-up over the best peer (> 1: rownorm is faster)."""
    if ours is None or best is None or ours.status != "ok" or not ours.ms:
        return "—"
    return f"{best.ms / ours.ms:.2f}×"


def _grid_table(op: str, mode: str, rows: Sequence[Result]) -> list[str]:
    spec = OPS.get(op)
    formula = spec.bytes_text(mode) if spec else ""
    title = "forward" if mode == "fwd" else "forward + backward"
    impls = _ordered_impls(op, rows)
    heads = " | ".join(_label(op, i) for i in impls)
    lines = [
        f"## {op} — {title}",
        "",
        f"bytes = {formula}; cells: GB/s (% of the copy limit)",
        "",
        f"| N | dtype | M | {heads} | best peer | rownorm vs best |",
        "|---:|---|---:|" + "---|" * len(impls) + "---|---:|",
    ]
    dtypes = list(dict.fromkeys(r.dtype for r in rows))
    keys = sorted(
        dict.fromkeys((r.dtype, r.N, r.M) for r in rows),
        key=lambda k: (dtypes.index(k[0]), k[1]),
    )
    for dt, n, m in keys:
        by = {r.impl: r for r in rows if (r.dtype, r.N, r.M) == (dt, n, m)}
        ours, best = best_peer(by)
        best_txt = f"{_label(op, best.impl)} {_num(best.gbps)}" if best else "—"
        cells = " | ".join(_cell(by.get(i)) for i in impls)
        lines.append(f"| {n} | {_short(dt)} | {m} | {cells} | {best_txt} | {_vs(ours, best)} |")
    return lines + [""]


def _seed_table(op: str, rows: Sequence[Result], copy_gbps: float | None) -> list[str]:
    impls = [i for i in _ordered_impls(op, rows) if i != SAME_BYTES_COPY]
    heads = " | ".join(_label(op, i) for i in impls)
    lines = [
        f"## {op} — the seeds' workloads",
        "",
        "cells: ms (% of the copy limit); copy limit = bytes / copy bandwidth; same-size "
        "copy = `dst.copy_(src)` moving the workload's bytes, timed like the ops (launch and "
        "ramp included: the floor for a small workload)",
        "",
        f"| workload | bytes | copy limit | same-size copy | {heads} | rownorm vs best |",
        "|---|---:|---:|---:|" + "---:|" * len(impls) + "---:|",
    ]
    for wl in dict.fromkeys(r.workload for r in rows):
        by = {r.impl: r for r in rows if r.workload == wl}
        nbytes = next(iter(by.values())).nbytes
        limit = _ms(nbytes / (copy_gbps * 1e6)) if copy_gbps else "—"
        same = by.get(SAME_BYTES_COPY)
        same_cell = _ms(same.ms) if same is not None and same.ms else "—"
        ours, best = best_peer(by)
        cells = " | ".join(_ms_cell(by.get(i)) for i in impls)
        lines.append(
            f"| {wl} | {nbytes / 1e9:.3g} GB | {limit} | {same_cell} | {cells} | "
            f"{_vs(ours, best)} |"
        )
    return lines + [""]


def _time_spent(results: Sequence[Result]) -> str:
    """Where the run's time went, per implementation family (to plan --time-budget)."""
    fams: dict[str, list[float]] = {}
    for r in results:
        if r.wall_s is None:
            continue
        meta = _impl_meta(r.op).get(r.impl)
        acc = fams.setdefault(meta.family if meta else r.impl, [0.0, 0.0, 0])
        acc[0] += r.setup_s or 0.0
        acc[1] += r.wall_s
        acc[2] += 1
    if not fams:
        return ""
    parts = [
        f"{fam} {v[0]:.0f} s / {v[1]:.0f} s ({v[2]})"
        for fam, v in sorted(
            fams.items(), key=lambda kv: FAMILIES.index(kv[0]) if kv[0] in FAMILIES else 9
        )
    ]
    return (
        "time per family, setup (make + first call + check: torch.compile, Triton JIT, the "
        "float64 reference) / whole measurement (measurements): " + ", ".join(parts)
    )


def _is_bulk_skip(note: str) -> bool:
    return note == "time budget exhausted" or note.startswith("aborted")


def render_markdown(results: Sequence[Result], info: RunInfo) -> str:
    """The report: run facts, one table per op × mode, the seeds' workloads, notes."""
    build = info.build
    copy = f"**{info.copy_gbps:.0f} GB/s**" if info.copy_gbps else "not measured"
    lines = [
        f"# rownorm benchmark — {info.device_name}",
        "",
        f"- command: `{info.command}`",
        f"- started {info.started}, took {info.duration_s:.0f} s; torch {info.torch_version}, "
        f"CUDA {info.cuda_version}; rownorm {build.get('version', '?')} "
        f"rev {build.get('revision', '?')} (arch {build.get('arch_list', '?')})",
        f"- copy limit: {copy} (`dst.copy_(src)` of {_size(info.copy_bytes)}, bytes read + "
        "written, same run)",
        f"- time: median over reps, {info.timer}; the cache flushed before every rep by "
        f"writing {_size(info.flush_bytes)}"
        + (
            f"; each configuration's implementations timed in {info.rounds} interleaved "
            "rounds (their order rotating), the median of the rounds reported"
            if info.rounds > 1
            else ""
        ),
        "- every implementation is checked against the float64 reference first "
        "(‖out − ref‖/‖ref‖ ≤ 1e-5 fp32, 1e-2 bf16/fp16, outputs and the gradients of x and "
        "of every parameter); one that fails is shown as FAIL and not timed",
        "- fwd: the op under no_grad; fwd+bwd: the op, then the gradients of x (and residual) "
        "and of weight/bias (torch.autograd.grad), as in a training step",
        "- b = bytes per element; M rows of N elements, reduced over N",
    ]
    if info.peers:
        lines.append(f"- peers: {info.peers}")
    spent = _time_spent(results)
    if spent:
        lines.append(f"- {spent}")
    lines.append("")
    order = list(OPS)
    ops = sorted(
        dict.fromkeys(r.op for r in results),
        key=lambda o: (o not in OPS, order.index(o) if o in OPS else 0),
    )
    for op in ops:
        op_rows = [r for r in results if r.op == op]
        grid = [r for r in op_rows if r.workload == "grid"]
        for mode in dict.fromkeys(r.mode for r in grid):
            lines += _grid_table(op, mode, [r for r in grid if r.mode == mode])
        seeds = [r for r in op_rows if r.workload != "grid"]
        if seeds:
            lines += _seed_table(op, seeds, info.copy_gbps)
        meta = _impl_meta(op)
        named = [i for i in _ordered_impls(op, op_rows) if i in meta]
        if named:
            lines += ["Implementations:", ""]
            lines += [f"- {meta[i].label}: `{meta[i].expr}`" for i in named]
            lines.append("")
    if info.small_calls:
        lines += small_call_table(info.small_calls)
    problems = [r for r in results if r.status != "ok"]
    if problems or info.notes:
        lines += ["## Notes", ""]
        lines += [f"- {n}" for n in info.notes]
        bulk = [r for r in problems if r.status == "skipped" and _is_bulk_skip(r.note)]
        for note in dict.fromkeys(r.note for r in bulk):
            count = sum(r.note == note for r in bulk)
            lines.append(f"- {count} measurement(s) skipped: {note}")
        problems = [r for r in problems if r not in bulk]
        grouped: dict[tuple[str, str, str], list[str]] = {}
        for r in problems:
            where = f"{r.op} {r.mode} {_short(r.dtype)} M={r.M} N={r.N}"
            if r.workload != "grid":
                where = f"{r.op} [{r.workload}]"
            grouped.setdefault((where, r.status, r.note), []).append(r.impl)
        for (where, status, note), impls in grouped.items():
            why = f" — {note}" if note else ""
            lines.append(f"- {where}, {', '.join(impls)}: {status}{why}")
        lines.append("")
    return "\n".join(lines)


def write_plots(results: Sequence[Result], info: RunInfo, out_dir: str) -> list[str]:
    """One PNG per op: GB/s vs N, one line per implementation, one panel per mode × dtype."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not importable: no plots written", flush=True)
        return []
    written = []
    for op in dict.fromkeys(r.op for r in results):
        rows = [r for r in results if r.op == op and r.workload == "grid"]
        if not rows:
            continue
        modes = list(dict.fromkeys(r.mode for r in rows))
        dtypes = list(dict.fromkeys(r.dtype for r in rows))
        fig, axes = plt.subplots(
            len(modes), len(dtypes), figsize=(6.5 * len(dtypes), 4.2 * len(modes)), squeeze=False
        )
        for a, mode in enumerate(modes):
            for b, dt in enumerate(dtypes):
                ax = axes[a][b]
                sub = [r for r in rows if r.mode == mode and r.dtype == dt]
                for impl in _ordered_impls(op, sub):
                    pts = sorted(
                        (r.N, r.gbps) for r in sub if r.impl == impl and r.gbps and r.status == "ok"
                    )
                    if not pts:
                        continue
                    ours = any(is_ours(r) for r in sub if r.impl == impl)
                    ax.plot(
                        [p[0] for p in pts],
                        [p[1] for p in pts],
                        marker="o",
                        linewidth=2.5 if ours else 1.3,
                        label=_label(op, impl),
                    )
                if info.copy_gbps:
                    ax.axhline(
                        info.copy_gbps,
                        color="black",
                        linestyle="--",
                        linewidth=1,
                        label=f"copy limit {info.copy_gbps:.0f}",
                    )
                ax.set_xscale("log", base=2)
                ns = sorted({r.N for r in sub})
                # 65535 and 65536 share one tick position on a log axis: label the power of 2.
                labels = ["" if n + 1 in ns and (n + 1) & n == 0 else str(n) for n in ns]
                ax.set_xticks(ns, labels, fontsize=8)
                ax.minorticks_off()
                ax.set_xlabel("N (row length)")
                ax.set_ylabel("GB/s")
                ax.set_ylim(bottom=0)
                ax.set_title(f"{op} {'fwd' if mode == 'fwd' else 'fwd+bwd'} {_short(dt)}")
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize=8, loc="best")
        fig.suptitle(f"rownorm {op} — {info.device_name}", fontsize=11)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{op}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def write_reports(
    results: Sequence[Result],
    info: RunInfo,
    out_dir: str,
    command_file: bool = True,
    csv_path: str | None = None,
) -> list[str]:
    """Writes results.md, the plots and COMMAND.txt (and results.csv unless it was streamed)."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    if csv_path is None:
        csv_path = os.path.join(out_dir, "results.csv")
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            w.writeheader()
            for r in results:
                w.writerow(r.csv_row())
    written.append(csv_path)
    md = os.path.join(out_dir, "results.md")
    with open(md, "w") as f:
        f.write(render_markdown(results, info))
    written.append(md)
    written += write_plots(results, info, out_dir)
    if command_file:
        path = os.path.join(out_dir, "COMMAND.txt")
        with open(path, "w") as f:
            f.write(info.command + "\n")
        written.append(path)
    return written
