"""The README's summary tables from a benchmark run's results.csv: per op and N, rownorm's
bandwidth as % of the copy limit / the best peer's, and (in brackets) the best peer's time over
rownorm's (above 1: rownorm is faster). Grid rows only, one dtype.

    python scripts/summary_tables.py benchmarks/results/h200/results.csv [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict


def tables(path: str, dtype: str) -> str:
    best: dict[tuple[str, str, int], dict[str, float]] = defaultdict(dict)
    for r in csv.DictReader(open(path)):
        if r["workload"] != "grid" or r["dtype"] != dtype or r["status"] != "ok":
            continue
        key = (r["op"], r["mode"], int(r["N"]))
        cell = best[key]
        pct, ms = float(r["pct_of_copy"]), float(r["ms"])
        if r["impl"] == "rownorm":
            cell["ours_pct"], cell["ours_ms"] = pct, ms
        elif ms < cell.get("peer_ms", float("inf")):
            cell["peer_pct"], cell["peer_ms"] = pct, ms
    ns = sorted({n for _, _, n in best})
    out = []
    for mode, title in (("fwd", "Forward"), ("fwdbwd", "Forward + backward")):
        ops = sorted({op for op, m, _ in best if m == mode})
        out += [f"{title}:", "", "| op | " + " | ".join(str(n) for n in ns) + " |"]
        out.append("|---|" + "---:|" * len(ns))
        for op in ops:
            cells = []
            for n in ns:
                c = best.get((op, mode, n), {})
                if "ours_ms" not in c:
                    cells.append("—")
                elif "peer_ms" not in c:
                    cells.append(f"{c['ours_pct']:.0f} / —")
                else:
                    ratio = c["peer_ms"] / c["ours_ms"]
                    cells.append(f"{c['ours_pct']:.0f} / {c['peer_pct']:.0f} ({ratio:.2f})")
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
