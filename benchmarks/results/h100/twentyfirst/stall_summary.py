"""Summary of ncu's SASS stall sampling: the stall reasons, the instruction mix and the
instructions most sampled, from the CSV of
`ncu -i REPORT --page source --csv --print-source sass` (NOTES.md §38).

Usage: python stall_summary.py SASS.csv
"""

import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def main(path: str) -> None:
    rows = list(csv.reader(open(path)))
    header, data = rows[1], rows[2:]
    ix = {h: i for i, h in enumerate(header)}
    stall_cols = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    stalls: collections.Counter = collections.Counter()
    mix: collections.Counter = collections.Counter()
    sampled: collections.Counter = collections.Counter()
    executed = 0
    for r in data:
        src = r[ix["Source"]].strip()
        words = src.split()
        opcode = (words[1] if words and words[0].startswith("@") else words[0]) if words else ""
        opcode = opcode.split(".")[0]
        n = int(r[ix["Instructions Executed"]] or 0)
        executed += n
        mix[opcode] += n
        sampled[opcode] += int(r[ix[SAMPLES]] or 0)
        for c in stall_cols:
            stalls[c] += int(r[ix[c]] or 0)
    total = sum(stalls.values())
    print(path, "warp instrs", executed)
    print(
        "stalls:", ", ".join(f"{k[6:]} {100 * v / total:.1f}%" for k, v in stalls.most_common(10))
    )
    print("instr mix:", ", ".join(f"{k} {100 * v / executed:.1f}" for k, v in mix.most_common(22)))
    print(
        "samples by op:",
        ", ".join(f"{k} {100 * v / total:.1f}" for k, v in sampled.most_common(12)),
    )
    for r in sorted(data, key=lambda r: -int(r[ix[SAMPLES]] or 0))[:25]:
        top = sorted(((int(r[ix[c]] or 0), c[6:]) for c in stall_cols), reverse=True)[:2]
        share = int(r[ix[SAMPLES]]) * 100 / total
        print(f"{r[ix['Address']][-5:]} {share:5.1f}% {r[ix['Source']].strip()[:60]:60s} {top}")


if __name__ == "__main__":
    main(sys.argv[1])
