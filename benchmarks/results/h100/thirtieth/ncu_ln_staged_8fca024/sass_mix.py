import csv, sys, collections, re
rows=[]
with open(sys.argv[1]) as f:
    lines=f.readlines()
i=[k for k,l in enumerate(lines) if l.startswith('"Address"')][0]
r=csv.DictReader(lines[i:])
for d in r:
    try: ex=int(d["Instructions Executed"].replace(',',''))
    except: continue
    rows.append((d["Address"], d["Source"].strip(), ex, int(d["Warp Stall Sampling (All Samples)"] or 0), d))
tot=sum(r[2] for r in rows); samp=sum(r[3] for r in rows)
print("instructions", tot, "samples", samp, "sass lines", len(rows))
op=collections.Counter(); ops=collections.Counter()
for a,s,ex,sm,d in rows:
    m=re.match(r'(@!?U?P\w+\s+)?([A-Z0-9_.]+)', s)
    o=m.group(2).split('.')[0] if m else s
    op[o]+=ex; ops[o]+=sm
print("by opcode (executed %, samples %):")
for o,c in op.most_common(30): print(f"  {o:10s} {100*c/tot:5.1f}%  {100*ops[o]/samp:5.1f}%")
# stall reasons total
keys=[k for k in rows[0][4] if k.startswith('stall_') and 'Not Issued' not in k]
st={k:sum(int(r[4][k] or 0) for r in rows) for k in keys}
print("stalls:", ", ".join(f"{k[6:]} {100*v/samp:.1f}%" for k,v in sorted(st.items(), key=lambda x:-x[1])[:10]))
# hot loop: lines with executed count > max/...
mx=max(r[2] for r in rows)
hot=[r for r in rows if r[2]>=mx*0.5]
print("lines executed >= half the max:", len(hot), "of", len(rows), "max", mx)
