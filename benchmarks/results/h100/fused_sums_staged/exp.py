"""The experiment of NOTES.md §24 (calls 1-2): fused parameter-gradient variants switched by
the ROWNORM_EXP_* variables of experiment_knobs.patch (a build of branch exp-fused, not main).

    python exp.py check | time CASES_JSON ROUNDS | prof OP N CFG_JSON
"""

import json
import os
import statistics
import sys

import rownorm
import torch


def setup(op, n, dtype=torch.bfloat16, elems=1 << 27, m=None):
    m = elems // n if m is None else m
    x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    b = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    r = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    leaves = [x, w] + ([b] if op == "layer_norm" else []) + ([r] if op == "add_rms_norm" else [])

    def step():
        if op == "rms_norm":
            y = rownorm.rms_norm(x, w)
        elif op == "layer_norm":
            y = rownorm.layer_norm(x, w, b)
        else:
            y = rownorm.add_rms_norm(x, r, w)[0]
        y.backward(dy)
        for t in leaves:
            t.grad = None

    return step


def timeit(step, iters=10, samples=3):
    for _ in range(2):
        step()
    ts = []
    for _ in range(samples):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            step()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / iters)
    return statistics.median(ts)


def copy_gbps():
    a = torch.empty(1 << 29, dtype=torch.int8, device="cuda")
    b = torch.empty_like(a)
    t = timeit(lambda: b.copy_(a), iters=20)
    return 2 * a.numel() / t / 1e3


def setenv(cfg):
    for k in [k for k in os.environ if k.startswith("ROWNORM_EXP_")]:
        os.environ.pop(k, None)
    for k, v in cfg.items():
        os.environ[k] = str(v)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "check":  # staged vs unstaged bits
        import itertools

        bad = 0
        for op, dt, (m, n), chunk in itertools.product(
            ("rms_norm", "layer_norm", "add_rms_norm"),
            (torch.bfloat16, torch.float32),
            ((4099, 2048), (4099, 4096), (1031, 8192), (7, 4096), (200, 1024)),
            (16, 64),
        ):
            grads = {}
            for st in ("0", "2", "3", "4"):
                setenv(
                    {
                        "ROWNORM_EXP_STAGES": st,
                        "ROWNORM_EXP_CHUNK": chunk,
                        "ROWNORM_EXP_LN_FUSED": 1,
                    }
                )
                torch.manual_seed(1)
                x = torch.randn(m, n, device="cuda", dtype=dt, requires_grad=True)
                w = torch.randn(n, device="cuda", dtype=dt, requires_grad=True)
                b = torch.randn(n, device="cuda", dtype=dt, requires_grad=True)
                r = torch.randn(m, n, device="cuda", dtype=dt, requires_grad=True)
                dy = torch.randn(m, n, device="cuda", dtype=dt)
                if op == "rms_norm":
                    y = rownorm.rms_norm(x, w)
                    L = [x, w]
                elif op == "layer_norm":
                    y = rownorm.layer_norm(x, w, b)
                    L = [x, w, b]
                else:
                    y = rownorm.add_rms_norm(x, r, w)[0]
                    L = [x, r, w]
                y.backward(dy)
                grads[st] = [t.grad for t in L]
            ref = grads["0"]
            for st in ("2", "3", "4"):
                same = all(torch.equal(a, b) for a, b in zip(ref, grads[st], strict=False))
                if not same:
                    bad += 1
                    print(
                        "DIFF",
                        op,
                        dt,
                        m,
                        n,
                        chunk,
                        st,
                        [
                            float((a.float() - b.float()).abs().max())
                            for a, b in zip(ref, grads[st], strict=False)
                        ],
                    )
        print("check done, bad =", bad)
        sys.exit(0)
    if mode == "prof":  # prof op n cfgjson
        op, n, cfg = sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
        setenv(cfg)
        step = setup(op, n)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        step()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        sys.exit(0)
    # time: interleaved rounds
    a = torch.randn(8192, 8192, device="cuda")
    for _ in range(200):
        a = a @ a.T
        a = a / a.norm()
    torch.cuda.synchronize()
    cases = json.loads(sys.argv[2])
    reps = int(sys.argv[3])
    res = {}
    for r in range(reps):
        cbw = copy_gbps()
        res.setdefault("copy", []).append(cbw)
        order = cases if r % 2 == 0 else cases[::-1]
        for c in order:
            setenv(c["cfg"])
            dt = getattr(torch, c.get("dtype", "bfloat16"))
            step = setup(c["op"], c["n"], dt, (1 << 27) if dt == torch.bfloat16 else (1 << 26))
            t = timeit(step)
            res.setdefault(json.dumps(c), []).append(t)
            del step
            torch.cuda.empty_cache()
    cbw = statistics.median(res.pop("copy"))
    print(f"copy {cbw:.0f} GB/s")
    for k, ts in res.items():
        c = json.loads(k)
        med = statistics.median(ts)
        gb = 5 * (1 << 27) * 2 / 1e9
        pct = gb / med * 1e6 / cbw * 100
        spread = (max(ts) - min(ts)) / med * 100
        what = f"{c['op']:12s} {c.get('dtype', 'bfloat16')[:4]} n={c['n']:6d}"
        print(
            f"{what} {json.dumps(c['cfg']):45s} {med:8.1f} us  {pct:5.1f}% copy  "
            f"spread {spread:4.1f}%"
        )
