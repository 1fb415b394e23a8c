"""The instruction mix and stall samples of one kernel from ncu's per-instruction source page.

Usage: python sass_mix.py ncu_src.csv  (ncu --section SourceCounters --page source
--print-source sass --csv; the .csv.xz files beside this script, decompressed)."""

import collections
import csv
import re
import sys


def main(path: str) -> None:
    with open(path) as f:
        lines = f.readlines()
    start = next(k for k, line in enumerate(lines) if line.startswith('"Address"'))
    rows = []
    for d in csv.DictReader(lines[start:]):
        executed = d["Instructions Executed"].replace(",", "")
        if not executed.isdigit():
            continue
        samples = int(d["Warp Stall Sampling (All Samples)"] or 0)
        rows.append((d["Source"].strip(), int(executed), samples, d))
    total = sum(r[1] for r in rows)
    sampled = sum(r[2] for r in rows)
    print("instructions", total, "samples", sampled, "sass lines", len(rows))
    executed_by_op, samples_by_op = collections.Counter(), collections.Counter()
    for source, executed, samples, _ in rows:
        m = re.match(r"(@!?U?P\w+\s+)?([A-Z0-9_.]+)", source)
        op = m.group(2).split(".")[0] if m else source
        executed_by_op[op] += executed
        samples_by_op[op] += samples
    print("by opcode (executed %, samples %):")
    for op, count in executed_by_op.most_common(30):
        print(f"  {op:10s} {100 * count / total:5.1f}%  {100 * samples_by_op[op] / sampled:5.1f}%")
    keys = [k for k in rows[0][3] if k.startswith("stall_") and "Not Issued" not in k]
    stalls = {k: sum(int(r[3][k] or 0) for r in rows) for k in keys}
    top = sorted(stalls.items(), key=lambda kv: -kv[1])[:10]
    print("stalls:", ", ".join(f"{k[6:]} {100 * v / sampled:.1f}%" for k, v in top))
    most = max(r[1] for r in rows)
    hot = sum(r[1] >= most * 0.5 for r in rows)
    print("lines executed >= half the max:", hot, "of", len(rows), "max", most)


if __name__ == "__main__":
    main(sys.argv[1])
