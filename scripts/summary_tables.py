"""The README's summary tables from a benchmark run's results.csv: per op and N, rownorm's
bandwidth as % of the copy limit / the best peer's, and (in brackets) the best peer's time over
rownorm's (above 1: rownorm is faster). Grid rows only, one dtype; the best peer is the
report's (rownorm.bench.report.best_peer).

    PYTHONPATH=python python scripts/summary_tables.py benchmarks/results/h200/results.csv \
        [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict

from rownorm.bench.report import best_peer
from rownorm.bench.runner import Result


def _cell(by_impl: dict[str, Result]) -> str:
    ours, best = best_peer(by_impl)
    if ours is None or ours.status != "ok" or not ours.ms:
        return "—"
    if best is None:
        return f"{ours.pct:.0f} / —"
    return f"{ours.pct:.0f} / {best.pct:.0f} ({best.ms / ours.ms:.2f})"


def tables(path: str, dtype: str) -> str:
    configs: dict[tuple[str, str, int], dict[str, Result]] = defaultdict(dict)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            r = Result.from_csv_row(row)
            if r.workload == "grid" and r.dtype == dtype:
                configs[(r.op, r.mode, r.N)][r.impl] = r
    ns = sorted({n for _, _, n in configs})
    out = []
    for mode, title in (("fwd", "Forward"), ("fwdbwd", "Forward + backward")):
        ops = sorted({op for op, m, _ in configs if m == mode})
        out += [f"{title}:", "", "| op | " + " | ".join(str(n) for n in ns) + " |"]
        out.append("|---|" + "---:|" * len(ns))
        for op in ops:
            cells = [_cell(configs.get((op, mode, n), {})) for n in ns]
            out.append(f"| {op} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    print(tables(args.csv, args.dtype))


if __name__ == "__main__":
    main()
