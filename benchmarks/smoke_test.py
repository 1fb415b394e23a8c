"""Smoke test of the benchmark harness that needs no GPU: ``python benchmarks/smoke_test.py``.

Checks the parts of :mod:`rownorm.bench` that do not measure anything: argument parsing and the
grid, the correctness check (it must catch a wrong forward and a wrong backward), and the
reports (CSV, markdown, plot) written from made-up numbers. With ``--run`` it also runs the
whole harness on the CPU on a tiny grid. Needs a built rownorm (``PYTHONPATH=python``); the
plot is skipped when matplotlib is not importable. Its functions are pytest tests too.
"""

from __future__ import annotations

import csv
import math
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from rownorm import bench


def _fake_results() -> list[bench.Result]:
    """A grid and the seeds, with one failure, one error and one skip, numbers made up."""
    copy = 3000.0
    out = []
    for mode, factor in (("fwd", 2), ("fwdbwd", 5)):
        for dtype, elem in (("float32", 4), ("bfloat16", 2)):
            for n in bench.GRID_NS:
                m, _ = bench.grid_shape(n, bench.GRID_ELEMS)
                nbytes = factor * m * n * elem
                for k, impl in enumerate(("rownorm", "eager_norm", "eager_normalize", "compile")):
                    gbps = copy * (0.95 - 0.2 * k) * (1 - 0.1 * math.log2(n) / 18)
                    status, ms, note = "ok", nbytes / (gbps * 1e6), ""
                    if impl == "compile" and n == 262144 and mode == "fwdbwd":
                        status, ms, gbps, note = "FAIL", None, None, "rel err out 1e-3 > tol"
                    if impl == "eager_norm" and n == 65535 and dtype == "bfloat16":
                        status, ms, gbps, note = "error", None, None, "RuntimeError: boom"
                    pct = 100 * gbps / copy if gbps else None
                    out.append(
                        bench.Result(
                            "l2_normalize",
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
                        )
                    )
    for seed in bench.L2_NORMALIZE.seeds:
        m, n = seed.shape
        nbytes = (2 if seed.mode == "fwd" else 5) * m * n * 4
        for k, impl in enumerate(seed.impls):
            ms = nbytes / (copy * 1e6) * (1.05 + 0.5 * k)
            status = "skipped" if impl == "compile_norm" else "ok"
            out.append(
                bench.Result(
                    "l2_normalize",
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
    assert args.ns == list(bench.GRID_NS)
    assert args.dtypes == [torch.float32, torch.bfloat16]
    assert args.modes == ["fwd", "fwdbwd"] and args.seeds and args.elems == 1 << 28
    quick = bench.parse_args(["--quick"])
    assert quick.ns == list(bench.QUICK_NS) and not quick.seeds and quick.elems == 1 << 26
    custom = bench.parse_args(["--dtypes", "bf16,fp16", "--ns", "2**10,64k", "--seeds-only"])
    assert custom.dtypes == [torch.bfloat16, torch.float16]
    assert custom.ns == [1024, 65536] and custom.seeds
    for bad in (["--ops", "nope"], ["--modes", "bwd"], ["--impls", "cudnn"], ["--dtypes", "x"]):
        try:
            bench.parse_args(bad)
        except SystemExit as exit_:
            assert exit_.code == 2
        else:
            raise AssertionError(f"{bad} was accepted")


def test_grid_shapes() -> None:
    for n in bench.GRID_NS:
        m, n2 = bench.grid_shape(n, bench.GRID_ELEMS)
        assert n2 == n and m * n >= bench.GRID_ELEMS and (m - 1) * n < bench.GRID_ELEMS
    args = bench.parse_args(["--impls", "rownorm,eager"])
    configs = bench.build_configs(args, [bench.L2_NORMALIZE])
    seeds = [c for c in configs if c.workload != "grid"]
    assert [c.shape for c in seeds] == [(32768, 65535), (16384, 65535)]
    assert seeds[0].nbytes == 2 * 32768 * 65535 * 4 and seeds[1].nbytes == 5 * 16384 * 65535 * 4
    assert seeds[0].kwargs["eps"] == 0.0
    grid = [c for c in configs if c.workload == "grid"]
    assert len(grid) == 2 * 2 * len(bench.GRID_NS)
    assert {i.name for i in grid[0].impls} == {"rownorm", "eager_norm", "eager_normalize"}
    named = bench.parse_args(["--impls", "compile_norm", "--no-seeds"])
    assert {i.name for c in bench.build_configs(named, [bench.L2_NORMALIZE]) for i in c.impls} == {
        "compile_norm"
    }


def test_check_catches_wrong_results() -> None:
    spec = bench.L2_NORMALIZE
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(64, 300, dtype=dtype, generator=gen)
        dy = [torch.randn(64, 300, dtype=dtype, generator=gen)]
        tol = bench.TOLERANCE[dtype]
        good = lambda t: F.normalize(t, dim=-1)
        for mode in ("fwd", "fwdbwd"):
            err, _ = bench.check_impl(spec, good, [x], -1, spec.kwargs, mode, dy)
            assert err <= tol, (dtype, mode, err)
        off = lambda t: F.normalize(t, dim=-1) * 1.05
        err, _ = bench.check_impl(spec, off, [x], -1, spec.kwargs, "fwd", dy)
        assert err > tol
        nan = lambda t: F.normalize(t, dim=-1) * float("nan")
        err, _ = bench.check_impl(spec, nan, [x], -1, spec.kwargs, "fwd", dy)
        assert not err <= tol

    class WrongBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return F.normalize(t, dim=-1)

        @staticmethod
        def backward(ctx, g):
            return g  # forgets the projection

    x = torch.randn(64, 300, generator=gen)
    dy = [torch.randn(64, 300, generator=gen)]
    err, detail = bench.check_impl(spec, WrongBackward.apply, [x], -1, spec.kwargs, "fwd", dy)
    assert err <= 1e-5, detail
    err, detail = bench.check_impl(spec, WrongBackward.apply, [x], -1, spec.kwargs, "fwdbwd", dy)
    assert err > 1e-5 and "dx" in detail, detail


def test_check_chunks_rows() -> None:
    """Rows are split into reference chunks; the error must not depend on the split."""
    spec = bench.L2_NORMALIZE
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(40, 1000, generator=gen)
    dy = [torch.randn(40, 1000, generator=gen)]
    fn = lambda t: F.normalize(t, dim=-1) * 1.001
    whole = bench.check_impl(spec, fn, [x], -1, spec.kwargs, "fwdbwd", dy)[0]
    saved = bench._CHUNK_ELEMS
    bench._CHUNK_ELEMS = 3000  # 3 rows a chunk, the last one short
    try:
        assert len(bench._row_chunks(x.shape, -1)) == 14
        chunked = bench.check_impl(spec, fn, [x], -1, spec.kwargs, "fwdbwd", dy)[0]
    finally:
        bench._CHUNK_ELEMS = saved
    assert math.isclose(whole, chunked, rel_tol=1e-9), (whole, chunked)


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
    )
    with tempfile.TemporaryDirectory() as tmp:
        paths = bench.write_reports(results, info, tmp)
        names = sorted(os.path.basename(p) for p in paths)
        assert {"results.csv", "results.md", "COMMAND.txt"} <= set(names), names
        with open(os.path.join(tmp, "results.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        assert tuple(rows[0]) == bench.CSV_FIELDS and len(rows) == len(results)
        back = [bench.Result.from_csv_row(r) for r in rows]
        assert [(r.impl, r.N, r.status) for r in back] == [(r.impl, r.N, r.status) for r in results]
        md = open(os.path.join(tmp, "results.md")).read()
        for needle in (
            "## l2_normalize — forward",
            "## l2_normalize — forward + backward",
            "## l2_normalize — the seeds' workloads",
            "| 65535 | bf16 |",
            "FAIL (err",
            "**3000 GB/s**",
            "≤ 6.0",
            "liger_kernel is not installed",
            "2 measurement(s) skipped: time budget exhausted",
        ):
            assert needle in md, needle
        # 7 N × 2 dtypes rows in each of the two grid tables.
        table_rows = [
            ln
            for ln in md.splitlines()
            if ln.startswith("| 2")
            or ln.startswith("| 1")
            or ln.startswith("| 4")
            or ln.startswith("| 6")
        ]
        assert len(table_rows) == 2 * 2 * len(bench.GRID_NS), len(table_rows)
        assert open(os.path.join(tmp, "COMMAND.txt")).read().strip() == info.command
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("  (matplotlib not importable: plot not checked)")
        else:
            png = os.path.join(tmp, "l2_normalize.png")
            assert os.path.getsize(png) > 10_000
            with open(png, "rb") as f:
                assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_device_slug() -> None:
    assert bench.device_slug(torch.device("cpu")) == "cpu"


def run_cpu_end_to_end() -> None:
    """The whole harness on the CPU: tiny grid, every default implementation, no seeds."""
    with tempfile.TemporaryDirectory() as tmp:
        rc = bench.main(
            [
                "--device",
                "cpu",
                "--ns",
                "33,1000",
                "--elems",
                "4096",
                "--no-seeds",
                "--rep-ms",
                "2",
                "--warmup-ms",
                "1",
                "--min-reps",
                "3",
                "--out",
                tmp,
            ]
        )
        assert rc == 0, rc
        rows = list(csv.DictReader(open(os.path.join(tmp, "results.csv"), newline="")))
        assert rows and all(r["status"] == "ok" for r in rows), [
            r for r in rows if r["status"] != "ok"
        ]
        impls = {r["impl"] for r in rows}
        assert {"rownorm", "eager_norm", "eager_normalize", "compile"} <= impls, impls


def main() -> int:
    tests = [(name, fn) for name, fn in globals().items() if name.startswith("test_")]
    if "--run" in sys.argv[1:]:
        tests.append(("run_cpu_end_to_end", run_cpu_end_to_end))
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
