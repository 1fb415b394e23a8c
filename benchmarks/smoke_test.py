"""Smoke test of the benchmark harness that needs no GPU: ``python benchmarks/smoke_test.py``.

Checks the parts of :mod:`rownorm.bench` that do not measure anything: argument parsing, the
grid and its order, every op's table entry (inputs, byte formulas, seeds), the correctness
check (it must catch a wrong forward, a wrong input gradient and a wrong weight gradient, for
every op), and the reports (CSV, markdown, plot) written from made-up numbers. With ``--run``
it also runs the whole harness on the CPU on a tiny grid of every op, and the seeds' workloads
shrunk to CPU size. Needs a built rownorm (``PYTHONPATH=python``); the plot is skipped when
matplotlib is not importable. Its functions are pytest tests too.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from rownorm import bench

CPU = torch.device("cpu")
GRID_OPS = [s.name for s in bench.OPS.values() if s.default_grid]


def _fake_results() -> list[bench.Result]:
    """A grid of two ops (one with two outputs) and the seeds, with one failure, one error and
    one skip, numbers made up."""
    copy = 3000.0
    out = []
    for op, impls, factors in (
        ("l2_normalize", ("rownorm", "eager_norm", "eager_normalize", "compile"), (2, 5)),
        ("add_rms_norm", ("rownorm", "eager", "compile", "liger"), (4, 8)),
    ):
        for mode, factor in zip(bench.MODES, factors, strict=True):
            for dtype, elem in (("float32", 4), ("bfloat16", 2)):
                for n in bench.GRID_NS:
                    m, _ = bench.grid_shape(n, bench.GRID_ELEMS)
                    nbytes = factor * m * n * elem
                    for k, impl in enumerate(impls):
                        gbps = copy * (0.95 - 0.2 * k) * (1 - 0.1 * math.log2(n) / 18)
                        status, ms, note = "ok", nbytes / (gbps * 1e6), ""
                        if impl == "compile" and n == 262144 and mode == "fwdbwd":
                            status, ms, gbps, note = "FAIL", None, None, "rel err out 1e-3 > tol"
                        if impl == "eager_norm" and n == 65535 and dtype == "bfloat16":
                            status, ms, gbps, note = "error", None, None, "RuntimeError: boom"
                        pct = 100 * gbps / copy if gbps else None
                        out.append(
                            bench.Result(
                                op,
                                mode,
                                dtype,
                                m,
                                n,
                                impl,
                                ms,
                                gbps,
                                pct,
                                nbytes,
                                {"ok": 1e-7, "FAIL": 1e-3}.get(status),
                                status,
                                "grid",
                                note,
                                setup_s=0.5,
                                wall_s=1.0,
                            )
                        )
    for spec in bench.OPS.values():
        for seed in spec.seeds:
            m = math.prod(seed.shape) // seed.shape[seed.dim]
            n = seed.shape[seed.dim]
            f = spec.fwd_bytes if seed.mode == "fwd" else spec.fwdbwd_bytes
            nbytes = f(m, n, 4)
            for k, impl in enumerate(seed.impls):
                ms = nbytes / (copy * 1e6) * (1.05 + 0.5 * k)
                status = "skipped" if impl == "compile_norm" else "ok"
                out.append(
                    bench.Result(
                        spec.name,
                        seed.mode,
                        "float32",
                        m,
                        n,
                        impl,
                        ms if status == "ok" else None,
                        nbytes / (ms * 1e6) if status == "ok" else None,
                        100 / (1.05 + 0.5 * k) if status == "ok" else None,
                        nbytes,
                        1e-7,
                        status,
                        seed.title,
                        "time budget exhausted" if status == "skipped" else "",
                    )
                )
    return out


def test_parse_args_defaults() -> None:
    args = bench.parse_args([])
    assert args.ns == list(bench.GRID_NS) and len(bench.GRID_NS) == 12
    assert args.dtypes == [torch.float32, torch.bfloat16]
    assert args.modes == ["fwd", "fwdbwd"] and args.seeds and args.elems == 1 << 28
    assert args.ops == list(bench.OPS) and args.ops_named == []
    quick = bench.parse_args(["--quick"])
    assert quick.ns == list(bench.QUICK_NS) and not quick.seeds and quick.elems == 1 << 26
    custom = bench.parse_args(["--dtypes", "bf16,fp16", "--ns", "2**10,64k", "--seeds-only"])
    assert custom.dtypes == [torch.bfloat16, torch.float16]
    assert custom.ns == [1024, 65536] and custom.seeds
    for bad in (["--ops", "nope"], ["--modes", "bwd"], ["--impls", "cudnn"], ["--dtypes", "x"]):
        with contextlib.redirect_stderr(open(os.devnull, "w")):  # noqa: SIM115
            try:
                bench.parse_args(bad)
            except SystemExit as exit_:
                assert exit_.code == 2
            else:
                raise AssertionError(f"{bad} was accepted")


def test_op_table() -> None:
    """Every op: inputs of the right shapes and dtypes, byte formulas, names, seeds."""
    expect_params = {
        "rms_norm": ("weight",),
        "layer_norm": ("weight", "bias"),
        "add_rms_norm": ("weight",),
    }
    for spec in bench.OPS.values():
        gen = torch.Generator().manual_seed(0)
        tensors = spec.make_inputs((6, 10), -1, torch.bfloat16, CPU, gen)
        rows = 2 if spec.name == "add_rms_norm" else 1
        params = expect_params.get(spec.name, ())
        assert len(tensors) == rows + len(params), spec.name
        assert all(t.shape == (6, 10) for t in tensors[:rows]), spec.name
        assert all(t.shape == (10,) for t in tensors[rows:]), spec.name
        assert all(t.dtype == torch.bfloat16 for t in tensors), spec.name
        assert len(spec.input_names) == len(tensors) and len(spec.output_names) == spec.n_outputs
        assert spec.make_inputs((4, 6, 5), 1, torch.float32, CPU, gen, params=())[0].shape == (
            4,
            6,
            5,
        )
        if "weight" in params:  # a weight near 1 (not a random sign) and a bias near 0
            assert 0.5 < tensors[rows].float().mean() < 1.5
        fwd, fwdbwd = (4, 8) if spec.name == "add_rms_norm" else (2, 5)
        assert spec.fwd_bytes(3, 7, 2) == fwd * 42 and spec.fwdbwd_bytes(3, 7, 2) == fwdbwd * 42
        assert spec.impl(spec.baseline).family == "eager" and spec.ours().name == "rownorm"
        assert {i.family for i in spec.impls} == set(bench.FAMILIES), spec.name
        for seed in spec.seeds:
            assert set(seed.impls) <= {i.name for i in spec.impls}, seed.title
    seeds = {s.title: s for spec in bench.OPS.values() for s in spec.seeds}
    assert len(seeds) == 6
    channel = next(s for t, s in seeds.items() if "seed 001" in t)
    assert channel.shape == (112, 64, 512, 512) and channel.dim == 1 and channel.params == ()
    assert channel.kwargs == {"eps": 1e-5} and channel.dtype == torch.float32
    mean_abs = bench.OPS["mean_abs"]
    assert mean_abs.kwargs == {"eps": 0.0, "mean": True} and not mean_abs.default_grid
    assert bench.OPS["rms_norm"].kwargs == {"eps": 1e-6}
    assert all(s.dtype == torch.float32 for s in seeds.values())


def test_grid_shapes() -> None:
    for n in bench.GRID_NS:
        m, n2 = bench.grid_shape(n, bench.GRID_ELEMS)
        assert n2 == n and m * n >= bench.GRID_ELEMS and (m - 1) * n < bench.GRID_ELEMS
    args = bench.parse_args(["--impls", "rownorm,eager"])
    configs = bench.build_configs(args, list(bench.OPS.values()))
    seeds = [c for c in configs if c.workload != "grid"]
    assert configs[: len(seeds)] == seeds  # the seeds of every op come first
    assert [c.shape for c in seeds[:2]] == [(32768, 65535), (16384, 65535)]
    assert seeds[0].nbytes == 2 * 32768 * 65535 * 4 and seeds[1].nbytes == 5 * 16384 * 65535 * 4
    assert seeds[0].kwargs["eps"] == 0.0
    by_title = {c.workload: c for c in seeds}
    channel = next(c for t, c in by_title.items() if "seed 001" in t)
    assert (channel.m, channel.n) == (112 * 512 * 512, 64) and channel.params == ()
    assert [i.name for i in channel.impls] == ["rownorm", "eager_expr"]
    grid = [c for c in configs if c.workload == "grid"]
    assert len(grid) == len(GRID_OPS) * 2 * 2 * len(bench.GRID_NS)
    assert "mean_abs" not in {c.spec.name for c in grid}
    # First round (the coarse grid) for every op before any in-between N.
    first = len(GRID_OPS) * 2 * 2 * len(bench.FIRST_ROUND_NS)
    assert {c.n for c in grid[:first]} == set(bench.FIRST_ROUND_NS)
    assert not {c.n for c in grid[first:]} & set(bench.FIRST_ROUND_NS)
    l2 = [c for c in grid if c.spec.name == "l2_normalize"]
    assert {i.name for i in l2[0].impls} == {"rownorm", "eager_norm", "eager_normalize"}
    named = bench.parse_args(["--impls", "compile_norm", "--no-seeds"])
    assert {i.name for c in bench.build_configs(named, [bench.L2_NORMALIZE]) for i in c.impls} == {
        "compile_norm"
    }
    mean_abs = bench.parse_args(["--ops", "mean_abs", "--no-seeds", "--dtypes", "fp32"])
    grid = bench.build_configs(mean_abs, [bench.OPS["mean_abs"]])
    assert len(grid) == 2 * len(bench.GRID_NS) and grid[0].kwargs["mean"] is True
    add = [c for c in bench.build_configs(args, [bench.ADD_RMS_NORM]) if c.n == 4096]
    assert add[0].nbytes == 4 * add[0].m * 4096 * 4 and add[-1].nbytes == 8 * add[-1].m * 4096 * 2


def test_liger_is_optional() -> None:
    """No liger_kernel (or a CPU run): the peer is reported as unavailable, never an error."""
    missing = bench.probe_impls(list(bench.OPS.values()), ["liger"], CPU)
    assert set(missing) == {(op, "liger") for op in bench.OPS}
    assert all("CUDA only" in why for why in missing.values())
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        missing = bench.probe_impls(list(bench.OPS.values()), ["liger"])
        assert all("not installed" in why for why in missing.values()), missing
    else:  # installed: the ops Liger lacks are unavailable, the others are offered
        missing = bench.probe_impls(list(bench.OPS.values()), ["liger"])
        assert {op for op, _ in missing} == {
            "l2_normalize",
            "l1_normalize",
            "mean_abs",
            "log_softmax",
        }, missing


def _wrong_weight_grad(fn):
    """fn with its weight gradient (the last input) scaled by 1.1."""

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, w):
            return w.view_as(w)

        @staticmethod
        def backward(ctx, g):
            return g * 1.1

    return lambda *t: fn(*t[:-1], Scale.apply(t[-1]))


def test_check_catches_wrong_results() -> None:
    """For every op, its eager implementation passes and a wrong output or gradient fails."""
    gen = torch.Generator().manual_seed(0)
    for spec in bench.OPS.values():
        eager = spec.impl(spec.baseline).make(-1, dict(spec.kwargs))
        has_weight = "weight" in spec.input_names
        for dtype in (torch.float32, torch.bfloat16):
            tol = bench.TOLERANCE[dtype]
            inputs = spec.make_inputs((64, 300), -1, dtype, CPU, gen)
            dys = [torch.randn(64, 300, dtype=dtype, generator=gen) for _ in spec.output_names]
            for mode in bench.MODES:
                err, detail = bench.check_impl(spec, eager, inputs, -1, spec.kwargs, mode, dys)
                assert err <= tol, (spec.name, dtype, mode, detail)

            def off(*t, eager=eager):
                outs = bench._as_tuple(eager(*t))
                return tuple(o * 1.05 for o in outs) if len(outs) > 1 else outs[0] * 1.05

            err, _ = bench.check_impl(spec, off, inputs, -1, spec.kwargs, "fwd", dys)
            assert err > tol, spec.name
            nan = lambda *t: bench._as_tuple(eager(*t))[0] * float("nan")  # noqa: B023
            if spec.n_outputs == 1:
                err, _ = bench.check_impl(spec, nan, inputs, -1, spec.kwargs, "fwd", dys)
                assert not err <= tol, spec.name
            if has_weight:
                bad = _wrong_weight_grad(eager)
                err, detail = bench.check_impl(spec, bad, inputs, -1, spec.kwargs, "fwd", dys)
                assert err <= tol, detail
                err, detail = bench.check_impl(spec, bad, inputs, -1, spec.kwargs, "fwdbwd", dys)
                assert err > tol and "dweight" in detail, (spec.name, detail)

    class WrongBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return F.normalize(t, dim=-1)

        @staticmethod
        def backward(ctx, g):
            return g  # forgets the projection

    spec = bench.L2_NORMALIZE
    x = torch.randn(64, 300, generator=gen)
    dy = [torch.randn(64, 300, generator=gen)]
    err, detail = bench.check_impl(spec, WrongBackward.apply, [x], -1, spec.kwargs, "fwd", dy)
    assert err <= 1e-5, detail
    err, detail = bench.check_impl(spec, WrongBackward.apply, [x], -1, spec.kwargs, "fwdbwd", dy)
    assert err > 1e-5 and "dx" in detail, detail


def test_check_chunks_rows() -> None:
    """Rows are split into reference chunks; the error must not depend on the split (a
    weight gradient, a sum over every row, included)."""
    gen = torch.Generator().manual_seed(1)
    for spec in (bench.L2_NORMALIZE, bench.RMS_NORM, bench.ADD_RMS_NORM):
        inputs = spec.make_inputs((40, 1000), -1, torch.float32, CPU, gen)
        dy = [torch.randn(40, 1000, generator=gen) for _ in spec.output_names]
        eager = spec.impl(spec.baseline).make(-1, dict(spec.kwargs))

        def fn(*t, eager=eager):
            outs = bench._as_tuple(eager(*t))
            return tuple(o * 1.001 for o in outs) if len(outs) > 1 else outs[0] * 1.001

        whole = bench.check_impl(spec, fn, inputs, -1, spec.kwargs, "fwdbwd", dy)[0]
        saved = bench._CHUNK_ELEMS
        bench._CHUNK_ELEMS = 3000  # 3 rows a chunk, the last one short
        try:
            assert len(bench._row_chunks(inputs[0].shape, -1)) == 14
            chunked = bench.check_impl(spec, fn, inputs, -1, spec.kwargs, "fwdbwd", dy)[0]
        finally:
            bench._CHUNK_ELEMS = saved
        assert math.isclose(whole, chunked, rel_tol=1e-9), (spec.name, whole, chunked)


def test_time_impl_fwdbwd_leaves_inputs_alone() -> None:
    """fwd+bwd timing computes every gradient without touching the inputs' .grad or dy."""
    spec = bench.ADD_RMS_NORM
    gen = torch.Generator().manual_seed(2)
    inputs = spec.make_inputs((8, 64), -1, torch.float32, CPU, gen)
    dys = [torch.randn(8, 64, generator=gen) for _ in spec.output_names]
    before = [d.clone() for d in dys]
    calls = []

    def fn(x, res, w):
        calls.append([t.requires_grad for t in (x, res, w)])
        return spec.impl("eager").make(-1, dict(spec.kwargs))(x, res, w)

    timer = bench.Timer(CPU, flush_bytes=1 << 20)
    ms = bench.time_impl(timer, fn, inputs, "fwdbwd", dys, warmup_ms=1, rep_ms=1, min_reps=2)
    assert ms > 0 and all(c == [True, True, True] for c in calls)
    assert all(t.grad is None and not t.requires_grad for t in inputs)
    assert all(torch.equal(a, b) for a, b in zip(dys, before, strict=True))


def test_reports_from_fake_numbers() -> None:
    results = _fake_results()
    info = bench.RunInfo(
        device_name="NVIDIA H100 80GB HBM3 (fake)",
        copy_gbps=3000.0,
        command="python -m rownorm.bench --fake",
        started="2026-01-01T00:00:00",
        build={"version": "0.1.0", "revision": "abc", "arch_list": "9.0"},
        flush_bytes=256 << 20,
        notes=["l2_normalize liger: not run (liger_kernel is not installed)"],
        peers="torch 2.11.0, triton 3.6.0, Liger-Kernel 0.8.5",
    )
    with tempfile.TemporaryDirectory() as tmp:
        paths = bench.write_reports(results, info, tmp)
        names = sorted(os.path.basename(p) for p in paths)
        assert {"results.csv", "results.md", "COMMAND.txt"} <= set(names), names
        with open(os.path.join(tmp, "results.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        assert tuple(rows[0]) == bench.CSV_FIELDS and len(rows) == len(results)
        back = [bench.Result.from_csv_row(r) for r in rows]
        assert [(r.impl, r.N, r.status, r.setup_s) for r in back] == [
            (r.impl, r.N, r.status, r.setup_s) for r in results
        ]
        with open(os.path.join(tmp, "results.md")) as f:
            md = f.read()
        for needle in (
            "## l2_normalize — forward",
            "## l2_normalize — forward + backward",
            "## l2_normalize — the seeds' workloads",
            "## add_rms_norm — forward + backward",
            "8·M·N·b",
            "## softmax — the seeds' workloads",
            "## rms_norm — the seeds' workloads",
            "## mean_abs — the seeds' workloads",
            "| 65535 | bf16 |",
            "| 131072 | fp32 |",
            "FAIL (err",
            "**3000 GB/s**",
            "≤ 6.00",
            "≤ 0.0110",  # the softmax seed's target: µs-sized times keep their digits
            "Liger-Kernel 0.8.5",
            "liger_kernel is not installed",
            "2 measurement(s) skipped: time budget exhausted",
            "time per family",
        ):
            assert needle in md, needle
        # Ops in the order of OPS (l2 before mean_abs before add_rms_norm).
        pos = [md.index(f"## {op} —") for op in ("l2_normalize", "mean_abs", "add_rms_norm")]
        assert pos == sorted(pos), pos
        # 12 N × 2 dtypes rows in each of the four grid tables.
        table_rows = [ln for ln in md.splitlines() if ln[:3] in {f"| {d}" for d in "123456789"}]
        assert len(table_rows) == 2 * 2 * 2 * len(bench.GRID_NS), len(table_rows)
        with open(os.path.join(tmp, "COMMAND.txt")) as f:
            assert f.read().strip() == info.command
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("  (matplotlib not importable: plot not checked)")
        else:
            for op in ("l2_normalize", "add_rms_norm"):
                png = os.path.join(tmp, f"{op}.png")
                assert os.path.getsize(png) > 10_000
                with open(png, "rb") as f:
                    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_device_slug() -> None:
    assert bench.device_slug(CPU) == "cpu"


_RUN_ARGS = ["--device", "cpu", "--rep-ms", "2", "--warmup-ms", "1", "--min-reps", "3"]


def _rows(out_dir: str) -> list[dict]:
    with open(os.path.join(out_dir, "results.csv"), newline="") as f:
        return list(csv.DictReader(f))


def run_cpu_end_to_end() -> None:
    """The whole harness on the CPU: tiny grid of every op, every default implementation."""
    with tempfile.TemporaryDirectory() as tmp:
        rc = bench.main(
            [*_RUN_ARGS, "--ns", "33,1000", "--elems", "4096", "--no-seeds", "--out", tmp]
        )
        assert rc == 0, rc
        rows = _rows(tmp)
        bad = [r for r in rows if r["status"] != "ok"]
        assert rows and not bad, bad
        impls = {(r["op"], r["impl"]) for r in rows}
        for op in GRID_OPS:
            assert {(op, "rownorm"), (op, "compile")} <= impls, op
        assert ("l2_normalize", "eager_norm") in impls and ("rms_norm", "eager") in impls
        assert {r["mode"] for r in rows} == {"fwd", "fwdbwd"}
        assert all(float(r["setup_s"]) >= 0 for r in rows)


def run_cpu_seeds() -> None:
    """The seeds' workloads (shrunk to CPU size, same dims, dtypes, kwargs and params)."""
    saved = dict(bench.OPS)
    try:
        for name, spec in saved.items():
            seeds = tuple(
                dataclasses.replace(s, shape=tuple(max(2, d // 64) for d in s.shape))
                for s in spec.seeds
            )
            bench.OPS[name] = dataclasses.replace(spec, seeds=seeds)
        with tempfile.TemporaryDirectory() as tmp:
            rc = bench.main([*_RUN_ARGS, "--seeds-only", "--out", tmp])
            assert rc == 0, rc
            rows = _rows(tmp)
            bad = [r for r in rows if r["status"] != "ok"]
            assert rows and not bad, bad
            assert len({r["workload"] for r in rows}) == 6
            channel = [r for r in rows if "seed 001" in r["workload"]]
            assert {r["impl"] for r in channel} == {
                "rownorm",
                "eager_expr",
                "compile_expr",
                bench.SAME_BYTES_COPY,  # a copy of the workload's own bytes, timed alike
            }
            copies = [r for r in rows if r["impl"] == bench.SAME_BYTES_COPY]
            assert len(copies) == 6 and all(float(r["ms"]) > 0 for r in copies), copies
            assert all(r["N"] == "2" for r in channel)  # 64 // 64 channels, dim=1
    finally:
        bench.OPS.clear()
        bench.OPS.update(saved)


def main() -> int:
    tests = [(name, fn) for name, fn in globals().items() if name.startswith("test_")]
    if "--run" in sys.argv[1:]:
        tests += [("run_cpu_end_to_end", run_cpu_end_to_end), ("run_cpu_seeds", run_cpu_seeds)]
    failed = 0
    for name, fn in tests:
        try:
            fn()
            print(f"PASS {name}", flush=True)
        except Exception as exc:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
    print(f"{len(tests) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
