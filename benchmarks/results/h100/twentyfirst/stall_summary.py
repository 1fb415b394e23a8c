import csv, sys, collections
f = sys.argv[1]
rows = list(csv.reader(open(f)))
hdr = rows[1]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
stall_cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
tot = collections.Counter(); ops = collections.Counter(); opsamp = collections.Counter()
total_exec = 0
for r in data:
    src = r[ix["Source"]].strip()
    op = src.split()[0] if src else ""
    if op.startswith("@"): op = src.split()[1]
    opn = op.split(".")[0]
    ex = int(r[ix["Instructions Executed"]] or 0)
    total_exec += ex
    ops[opn] += ex
    s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
    opsamp[opn] += s
    for c in stall_cols:
        tot[c] += int(r[ix[c]] or 0)
print(f, "warp instrs", total_exec)
S = sum(tot.values())
print("stalls:", ", ".join(f"{k[6:]} {100*v/S:.1f}%" for k, v in tot.most_common(10)))
print("instr mix:", ", ".join(f"{k} {100*v/total_exec:.1f}" for k, v in ops.most_common(22)))
print("samples by op:", ", ".join(f"{k} {100*v/S:.1f}" for k, v in opsamp.most_common(12)))
# top stall instructions
top = sorted(data, key=lambda r: -int(r[ix["Warp Stall Sampling (All Samples)"]] or 0))[:25]
for r in top:
    st = sorted(((int(r[ix[c]] or 0), c[6:]) for c in stall_cols), reverse=True)[:2]
    print(f'{r[ix["Address"]][-5:]} {int(r[ix["Warp Stall Sampling (All Samples)"]])*100/S:5.1f}% {r[ix["Source"]].strip()[:60]:60s} {st}')
