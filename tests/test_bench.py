"""The benchmark harness (``python -m rownorm.bench``), without measuring anything meaningful.

On the CPU: that ``import rownorm`` loads none of it, argument parsing, the grid and its order,
every op's table entry (inputs, byte formulas, seeds), the correctness check (it must catch a
wrong forward, a wrong input gradient and a wrong weight gradient, for every op), the reports
written from made-up numbers, and the whole harness end to end on a tiny grid and on the seeds'
workloads shrunk to a few rows. The same end-to-end runs, the timer and the small-call costs
run on CUDA where a GPU is present. torch.compile is left out of the end-to-end runs (minutes
of compilation on the CPU); its configurations are built and listed like the others.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from rownorm.bench import check, cli, impls, report, runner, specs, timer

CPU = torch.device("cpu")
HAS_CUDA = torch.cuda.is_available()
needs_cuda = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=needs_cuda)]
GRID_OPS = [s.name for s in specs.OPS.values() if s.default_grid]


def test_import_rownorm_loads_no_benchmark_code() -> None:
    code = (
        "import sys, rownorm\n"
        "print(sorted(m for m in sys.modules if m.startswith('rownorm.bench')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]", out


def test_parse_args_defaults() -> None:
    args = cli.parse_args([])
    assert args.ns == list(runner.GRID_NS) and len(runner.GRID_NS) == 12
    assert args.dtypes == [torch.float32, torch.bfloat16]
    assert args.modes == ["fwd", "fwdbwd"] and args.seeds and args.elems == 1 << 28
    assert args.ops == list(specs.OPS) and args.ops_named == []
    quick = cli.parse_args(["--quick"])
    assert quick.ns == list(runner.QUICK_NS) and not quick.seeds and quick.elems == 1 << 26
    custom = cli.parse_args(["--dtypes", "bf16,fp16", "--ns", "2**10,64k", "--seeds-only"])
    assert custom.dtypes == [torch.bfloat16, torch.float16]
    assert custom.ns == [1024, 65536] and custom.seeds


@pytest.mark.parametrize(
    "bad", [["--ops", "nope"], ["--modes", "bwd"], ["--impls", "cudnn"], ["--dtypes", "x"]]
)
def test_parse_args_rejects(bad: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(bad)
    assert exit_.value.code == 2
    assert bad[1] in capsys.readouterr().err


def test_list_names_every_op(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name}  (fwd bytes" in out for name in specs.OPS)


def test_op_table() -> None:
    """Every op: inputs of the right shapes and dtypes, byte formulas, names, seeds."""
    expect_params = {
        "rms_norm": ("weight",),
        "layer_norm": ("weight", "bias"),
        "add_rms_norm": ("weight",),
    }
    for spec in specs.OPS.values():
        gen = torch.Generator().manual_seed(0)
        tensors = spec.make_inputs((6, 10), -1, torch.bfloat16, CPU, gen)
        rows = 2 if spec.name == "add_rms_norm" else 1
        params = expect_params.get(spec.name, ())
        assert len(tensors) == rows + len(params), spec.name
        assert all(t.shape == (6, 10) for t in tensors[:rows]), spec.name
        assert all(t.shape == (10,) for t in tensors[rows:]), spec.name
        assert all(t.dtype == torch.bfloat16 for t in tensors), spec.name
        assert len(spec.input_names) == len(tensors) and len(spec.output_names) == spec.n_outputs
        x = spec.make_inputs((4, 6, 5), 1, torch.float32, CPU, gen, params=())[0]
        assert x.shape == (4, 6, 5)
        if "weight" in params:  # a weight near 1 (not a random sign) and a bias near 0
            assert 0.5 < tensors[rows].float().mean() < 1.5
        fwd, fwdbwd = (4, 8) if spec.name == "add_rms_norm" else (2, 5)
        assert spec.fwd_bytes(3, 7, 2) == fwd * 42 and spec.fwdbwd_bytes(3, 7, 2) == fwdbwd * 42
        assert spec.bytes_text("fwd").startswith(f"{fwd}·M·N·b")
        assert spec.impl(spec.baseline).family == "eager" and spec.ours().name == "rownorm"
        assert {i.family for i in spec.impls} == set(impls.FAMILIES), spec.name
        for seed in spec.seeds:
            assert set(seed.impls) <= {i.name for i in spec.impls}, seed.title
    seeds = {s.title: s for spec in specs.OPS.values() for s in spec.seeds}
    assert len(seeds) == 6
    channel = next(s for t, s in seeds.items() if "seed 001" in t)
    assert channel.shape == (112, 64, 512, 512) and channel.dim == 1 and channel.params == ()
    assert channel.kwargs == {"eps": 1e-5} and channel.dtype == torch.float32
    mean_abs = specs.OPS["mean_abs"]
    assert mean_abs.kwargs == {"eps": 0.0, "mean": True} and not mean_abs.default_grid
    assert specs.OPS["rms_norm"].kwargs == {"eps": 1e-6}
    assert all(s.dtype == torch.float32 for s in seeds.values())


def test_grid_shapes_and_order() -> None:
    for n in runner.GRID_NS:
        m, n2 = runner.grid_shape(n, runner.GRID_ELEMS)
        assert n2 == n and m * n >= runner.GRID_ELEMS and (m - 1) * n < runner.GRID_ELEMS
    args = cli.parse_args(["--impls", "rownorm,eager"])
    configs = runner.build_configs(args, list(specs.OPS.values()))
    seeds = [c for c in configs if c.workload != "grid"]
    assert configs[: len(seeds)] == seeds  # the seeds of every op come first
    assert [c.shape for c in seeds[:2]] == [(32768, 65535), (16384, 65535)]
    assert seeds[0].nbytes == 2 * 32768 * 65535 * 4 and seeds[1].nbytes == 5 * 16384 * 65535 * 4
    assert seeds[0].kwargs["eps"] == 0.0
    channel = next(c for c in seeds if "seed 001" in c.workload)
    assert (channel.m, channel.n) == (112 * 512 * 512, 64) and channel.params == ()
    assert [i.name for i in channel.impls] == ["rownorm", "eager_expr"]
    grid = [c for c in configs if c.workload == "grid"]
    assert len(grid) == len(GRID_OPS) * 2 * 2 * len(runner.GRID_NS)
    assert "mean_abs" not in {c.spec.name for c in grid}
    # First round (the coarse grid) for every op before any in-between N.
    first = len(GRID_OPS) * 2 * 2 * len(runner.FIRST_ROUND_NS)
    assert {c.n for c in grid[:first]} == set(runner.FIRST_ROUND_NS)
    assert not {c.n for c in grid[first:]} & set(runner.FIRST_ROUND_NS)
    l2 = [c for c in grid if c.spec.name == "l2_normalize"]
    assert {i.name for i in l2[0].impls} == {"rownorm", "eager_norm", "eager_normalize"}
    named = cli.parse_args(["--impls", "compile_norm", "--no-seeds"])
    l2_configs = runner.build_configs(named, [specs.OPS["l2_normalize"]])
    assert {i.name for c in l2_configs for i in c.impls} == {"compile_norm"}
    mean_abs = cli.parse_args(["--ops", "mean_abs", "--no-seeds", "--dtypes", "fp32"])
    grid = runner.build_configs(mean_abs, [specs.OPS["mean_abs"]])
    assert len(grid) == 2 * len(runner.GRID_NS) and grid[0].kwargs["mean"] is True
    add = [c for c in runner.build_configs(args, [specs.OPS["add_rms_norm"]]) if c.n == 4096]
    assert add[0].nbytes == 4 * add[0].m * 4096 * 4 and add[-1].nbytes == 8 * add[-1].m * 4096 * 2


def test_liger_is_optional() -> None:
    """No liger_kernel (or a CPU run): the peer is reported as unavailable, never an error."""
    all_specs = list(specs.OPS.values())
    missing = runner.probe_impls(all_specs, ["liger"], CPU)
    assert set(missing) == {(op, "liger") for op in specs.OPS}
    assert all("CUDA only" in why for why in missing.values())
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        missing = runner.probe_impls(all_specs, ["liger"])
        assert all("not installed" in why for why in missing.values()), missing
    else:  # installed: the ops Liger lacks are unavailable, the others are offered
        missing = runner.probe_impls(all_specs, ["liger"])
        lacking = {"l2_normalize", "l1_normalize", "mean_abs", "log_softmax"}
        assert {op for op, _ in missing} == lacking, missing


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


def _scaled(fn, factor: float):
    """fn with every output multiplied by ``factor``."""

    def scaled(*t):
        outs = check.as_tuple(fn(*t))
        return tuple(o * factor for o in outs) if len(outs) > 1 else outs[0] * factor

    return scaled


@pytest.mark.parametrize("name", list(specs.OPS))
def test_check_catches_wrong_results(name: str) -> None:
    """The op's eager implementation passes; a wrong output or weight gradient fails."""
    spec = specs.OPS[name]
    gen = torch.Generator().manual_seed(0)
    eager = spec.impl(spec.baseline).make(-1, dict(spec.kwargs))
    for dtype in (torch.float32, torch.bfloat16):
        tol = check.TOLERANCE[dtype]
        inputs = spec.make_inputs((64, 300), -1, dtype, CPU, gen)
        dys = [torch.randn(64, 300, dtype=dtype, generator=gen) for _ in spec.output_names]

        def run(fn, mode: str, inputs=inputs, dys=dys) -> tuple[float, str]:
            return check.check_impl(spec, fn, inputs, -1, spec.kwargs, mode, dys)

        for mode in specs.MODES:
            err, detail = run(eager, mode)
            assert err <= tol, (dtype, mode, detail)
        assert run(_scaled(eager, 1.05), "fwd")[0] > tol
        if spec.n_outputs == 1:
            assert not run(_scaled(eager, math.nan), "fwd")[0] <= tol  # NaN never passes
        if "weight" in spec.input_names:
            bad = _wrong_weight_grad(eager)
            assert run(bad, "fwd")[0] <= tol
            err, detail = run(bad, "fwdbwd")
            assert err > tol and "dweight" in detail, detail


def test_check_catches_wrong_input_grad() -> None:
    class WrongBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return F.normalize(t, dim=-1)

        @staticmethod
        def backward(ctx, g):
            return g  # forgets the projection

    spec = specs.OPS["l2_normalize"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 300, generator=gen)
    dy = [torch.randn(64, 300, generator=gen)]
    err, detail = check.check_impl(spec, WrongBackward.apply, [x], -1, spec.kwargs, "fwd", dy)
    assert err <= 1e-5, detail
    err, detail = check.check_impl(spec, WrongBackward.apply, [x], -1, spec.kwargs, "fwdbwd", dy)
    assert err > 1e-5 and "dx" in detail, detail


@pytest.mark.parametrize("name", ["l2_normalize", "rms_norm", "add_rms_norm"])
def test_check_chunks_rows(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are split into reference chunks; the error must not depend on the split (a
    weight gradient, a sum over every row, included)."""
    spec = specs.OPS[name]
    gen = torch.Generator().manual_seed(1)
    inputs = spec.make_inputs((40, 1000), -1, torch.float32, CPU, gen)
    dy = [torch.randn(40, 1000, generator=gen) for _ in spec.output_names]
    fn = _scaled(spec.impl(spec.baseline).make(-1, dict(spec.kwargs)), 1.001)
    whole = check.check_impl(spec, fn, inputs, -1, spec.kwargs, "fwdbwd", dy)[0]
    monkeypatch.setattr(check, "CHUNK_ELEMS", 3000)  # 3 rows a chunk, the last one short
    assert len(check.row_chunks(inputs[0].shape, -1)) == 14
    chunked = check.check_impl(spec, fn, inputs, -1, spec.kwargs, "fwdbwd", dy)[0]
    assert math.isclose(whole, chunked, rel_tol=1e-9), (whole, chunked)


def test_time_impl_fwdbwd_leaves_inputs_alone() -> None:
    """fwd+bwd timing computes every gradient without touching the inputs' .grad or dy."""
    spec = specs.OPS["add_rms_norm"]
    gen = torch.Generator().manual_seed(2)
    inputs = spec.make_inputs((8, 64), -1, torch.float32, CPU, gen)
    dys = [torch.randn(8, 64, generator=gen) for _ in spec.output_names]
    before = [d.clone() for d in dys]
    calls = []
    eager = spec.impl("eager").make(-1, dict(spec.kwargs))

    def fn(x, res, w):
        calls.append([t.requires_grad for t in (x, res, w)])
        return eager(x, res, w)

    t = timer.Timer(CPU, flush_bytes=1 << 20)
    ms = timer.time_impl(t, fn, inputs, "fwdbwd", dys, warmup_ms=1, rep_ms=1, min_reps=2)
    assert ms > 0 and all(c == [True, True, True] for c in calls)
    assert all(t.grad is None and not t.requires_grad for t in inputs)
    assert all(torch.equal(a, b) for a, b in zip(dys, before, strict=True))


def _fake_results() -> list[runner.Result]:
    """A grid of two ops (one with two outputs) and the seeds, with one failure, one error and
    one skip, numbers made up."""
    copy = 3000.0
    out = []
    for op, names, factors in (
        ("l2_normalize", ("rownorm", "eager_norm", "eager_normalize", "compile"), (2, 5)),
        ("add_rms_norm", ("rownorm", "eager", "compile", "liger"), (4, 8)),
    ):
        for mode, factor in zip(specs.MODES, factors, strict=True):
            for dtype, elem in (("float32", 4), ("bfloat16", 2)):
                for n in runner.GRID_NS:
                    m, _ = runner.grid_shape(n, runner.GRID_ELEMS)
                    nbytes = factor * m * n * elem
                    for k, impl in enumerate(names):
                        gbps = copy * (0.95 - 0.2 * k) * (1 - 0.1 * math.log2(n) / 18)
                        status, ms, note = "ok", nbytes / (gbps * 1e6), ""
                        if impl == "compile" and n == 262144 and mode == "fwdbwd":
                            status, ms, gbps, note = "FAIL", None, None, "rel err out 1e-3 > tol"
                        if impl == "eager_norm" and n == 65535 and dtype == "bfloat16":
                            status, ms, gbps, note = "error", None, None, "RuntimeError: boom"
                        out.append(
                            runner.Result(
                                op,
                                mode,
                                dtype,
                                m,
                                n,
                                impl,
                                ms,
                                gbps,
                                100 * gbps / copy if gbps else None,
                                nbytes,
                                {"ok": 1e-7, "FAIL": 1e-3}.get(status),
                                status,
                                "grid",
                                note,
                                setup_s=0.5,
                                wall_s=1.0,
                            )
                        )
    for spec in specs.OPS.values():
        for seed in spec.seeds:
            n = seed.shape[seed.dim]
            m = math.prod(seed.shape) // n
            nbytes = spec.nbytes(seed.mode, m, n, 4)
            for k, impl in enumerate(seed.impls):
                ms = nbytes / (copy * 1e6) * (1.05 + 0.5 * k)
                ok = impl != "compile_norm"
                out.append(
                    runner.Result(
                        spec.name,
                        seed.mode,
                        "float32",
                        m,
                        n,
                        impl,
                        ms if ok else None,
                        nbytes / (ms * 1e6) if ok else None,
                        100 / (1.05 + 0.5 * k) if ok else None,
                        nbytes,
                        1e-7,
                        "ok" if ok else "skipped",
                        seed.title,
                        "" if ok else "time budget exhausted",
                    )
                )
    return out


def test_reports_from_fake_numbers(tmp_path) -> None:
    results = _fake_results()
    info = runner.RunInfo(
        device_name="NVIDIA H100 80GB HBM3 (fake)",
        copy_gbps=3000.0,
        command="python -m rownorm.bench --fake",
        started="2026-01-01T00:00:00",
        build={"version": "0.1.0", "revision": "abc", "arch_list": "9.0"},
        flush_bytes=256 << 20,
        notes=["l2_normalize liger: not run (liger_kernel is not installed)"],
        peers="torch 2.11.0, triton 3.6.0, Liger-Kernel 0.8.5",
        small_calls=[
            timer.SmallCall("F.rms_norm", "F.rms_norm(x, (4096,), w, eps)", 9.5, 2.25),
            timer.SmallCall("rownorm.rms_norm", "rownorm.rms_norm(x, w)", 12.0, None, "boom"),
        ],
    )
    paths = report.write_reports(results, info, str(tmp_path))
    names = sorted(os.path.basename(p) for p in paths)
    assert {"results.csv", "results.md", "COMMAND.txt"} <= set(names), names
    with open(tmp_path / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == runner.CSV_FIELDS and len(rows) == len(results)
    back = [runner.Result.from_csv_row(r) for r in rows]
    assert [(r.impl, r.N, r.status, r.setup_s) for r in back] == [
        (r.impl, r.N, r.status, r.setup_s) for r in results
    ]
    md = (tmp_path / "results.md").read_text()
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
        "| 0.0090 (95%) |",  # the softmax seed's ms: µs-sized times keep their digits
        "Liger-Kernel 0.8.5",
        "liger_kernel is not installed",
        "2 measurement(s) skipped: time budget exhausted",
        "time per family",
        "| `F.rms_norm(x, (4096,), w, eps)` | 9.50 | +0.00 µs | 2.25 |",
        "| +2.50 µs | failed (boom) |",
    ):
        assert needle in md, needle
    # Ops in the order of OPS (l2 before mean_abs before add_rms_norm).
    pos = [md.index(f"## {op} —") for op in ("l2_normalize", "mean_abs", "add_rms_norm")]
    assert pos == sorted(pos), pos
    # 12 N × 2 dtypes rows in each of the four grid tables.
    table_rows = [ln for ln in md.splitlines() if ln[:3] in {f"| {d}" for d in "123456789"}]
    assert len(table_rows) == 2 * 2 * 2 * len(runner.GRID_NS), len(table_rows)
    assert (tmp_path / "COMMAND.txt").read_text().strip() == info.command
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not [p for p in paths if p.endswith(".png")]
    else:
        for op in ("l2_normalize", "add_rms_norm"):
            png = tmp_path / f"{op}.png"
            assert png.stat().st_size > 10_000
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_device_slug() -> None:
    assert cli.device_slug(CPU) == "cpu"


# Short timing: the numbers mean nothing, the run's path is what is tested.
_RUN_ARGS = ["--rep-ms", "2", "--warmup-ms", "1", "--min-reps", "3", "--quick"]


def _rows(out_dir) -> list[dict]:
    with open(os.path.join(out_dir, "results.csv"), newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("device", DEVICES)
def test_end_to_end(device: str, tmp_path) -> None:
    """The whole harness on a tiny grid of every op (rownorm and eager), checked then timed."""
    rc = cli.main(
        [*_RUN_ARGS, "--device", device, "--ns", "300", "--elems", "600"]
        + ["--dtypes", "fp32", "--impls", "rownorm,eager", "--out", str(tmp_path)]
    )
    assert rc == 0, rc
    rows = _rows(tmp_path)
    bad = [r for r in rows if r["status"] != "ok"]
    assert rows and not bad, bad
    got = {(r["op"], r["impl"], r["mode"], r["N"]) for r in rows}
    for op in GRID_OPS:
        for mode in specs.MODES:
            assert (op, "rownorm", mode, "300") in got, (op, mode)
    assert ("l2_normalize", "eager_norm", "fwd", "300") in got
    assert all(float(r["setup_s"]) >= 0 and float(r["ms"]) > 0 for r in rows)
    assert (tmp_path / "results.md").exists()


def test_rounds_interleave_the_implementations(tmp_path, monkeypatch) -> None:
    """With --rounds 3 each implementation that passed its check is timed once per round, the
    order rotating from round to round, and its median over the rounds is reported. (Each
    timing returns the next of 1, 2, 3, ... ms: rownorm gets 1, 4, 5 and eager 2, 3, 6.)"""
    calls = []

    def fake_time(self, cfg, fn, inputs, dys, rounds=1):
        assert rounds == 3
        calls.append(fn)
        return float(len(calls))

    monkeypatch.setattr(runner.Runner, "_time", fake_time)
    rc = cli.main(
        [*_RUN_ARGS, "--device", "cpu", "--ops", "rms_norm", "--modes", "fwd", "--rounds", "3"]
        + ["--ns", "300", "--elems", "600", "--dtypes", "fp32", "--impls", "rownorm,eager"]
        + ["--out", str(tmp_path), "--no-small-calls"]
    )
    assert rc == 0, rc
    assert len(calls) == 6 and calls[0] is calls[3] is calls[4] and calls[1] is calls[2]
    rows = {r["impl"]: float(r["ms"]) for r in _rows(tmp_path)}
    assert rows["rownorm"] == 4.0 and sorted(rows.values()) == [3.0, 4.0], rows
    assert "3 interleaved rounds" in (tmp_path / "results.md").read_text()


@pytest.mark.parametrize("device", DEVICES)
def test_end_to_end_seeds(device: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The seeds' workloads, shrunk to a few rows (same dims, dtypes, kwargs and params)."""
    for name, spec in list(specs.OPS.items()):
        small = tuple(
            dataclasses.replace(s, shape=tuple(max(2, d // 256) for d in s.shape))
            for s in spec.seeds
        )
        monkeypatch.setitem(specs.OPS, name, dataclasses.replace(spec, seeds=small))
    rc = cli.main(
        [*_RUN_ARGS, "--device", device, "--seeds-only", "--impls", "rownorm,eager"]
        + ["--out", str(tmp_path)]
    )
    assert rc == 0, rc
    rows = _rows(tmp_path)
    bad = [r for r in rows if r["status"] != "ok"]
    assert rows and not bad, bad
    assert len({r["workload"] for r in rows}) == 6
    channel = [r for r in rows if "seed 001" in r["workload"]]
    assert {r["impl"] for r in channel} == {"rownorm", "eager_expr", runner.SAME_BYTES_COPY}
    assert all(r["N"] == "2" for r in channel)  # 64 // 256 channels -> 2, dim=1
    copies = [r for r in rows if r["impl"] == runner.SAME_BYTES_COPY]
    assert len(copies) == 6 and all(float(r["ms"]) > 0 for r in copies), copies


@pytest.mark.parametrize("device", DEVICES)
def test_timer_counts_reps(device: str) -> None:
    t = timer.Timer(torch.device(device), flush_bytes=1 << 20)
    x = torch.ones(1 << 16, device=device)
    ms, reps = t(lambda: x.mul_(1.0), warmup_ms=1, rep_ms=1, min_reps=7, max_reps=9)
    assert ms > 0 and 7 <= reps <= 9


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_small_calls_cuda() -> None:
    calls = timer.measure_small_calls(torch.device("cuda", torch.cuda.current_device()), calls=50)
    assert [c.label for c in calls] == [
        "torch.ops.rownorm.rms_norm",
        "rownorm.rms_norm",
        "F.rms_norm",
    ]
    assert all(c.host_us > 0 for c in calls)
    try:
        import triton.testing  # noqa: F401
    except ImportError:
        assert all(c.graph_us is None and "triton" in c.graph_note for c in calls)
    else:
        assert all(c.graph_us is not None and c.graph_us > 0 for c in calls), calls


def test_an_op_added_to_the_table_is_benchmarked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark's ops come from the op table: a new op there needs no edit here."""
    import rownorm.testing

    new = dataclasses.replace(rownorm.testing.OPS["softmax"], id="new_op", name="new_op")
    monkeypatch.setitem(rownorm.testing.OPS, "new_op", new)
    ops = specs._benchmarked()
    assert list(ops)[: len(specs.OPS)] == list(specs.OPS)  # table order, the new op last
    spec = ops["new_op"]
    assert {i.name for i in spec.impls} == {"rownorm", "eager", "compile", "liger"}
    assert spec.nbytes("fwdbwd", 3, 7, 2) == new.fwdbwd_bytes(3, 7, 2)
    gen = torch.Generator().manual_seed(3)
    inputs = spec.make_inputs((8, 40), -1, torch.float32, CPU, gen)
    dys = [torch.randn(8, 40, generator=gen)]
    for impl in (spec.ours(), spec.impl(spec.baseline)):
        fn = impl.make(-1, dict(spec.kwargs))
        err, detail = check.check_impl(spec, fn, inputs, -1, spec.kwargs, "fwdbwd", dys)
        assert err <= check.TOLERANCE[torch.float32], (impl.name, detail)


# ---- the GPU check's scripts (scripts/gpu_check.sh runs them on the GPU machine) -----------

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SCRIPTS = os.path.join(_ROOT, "scripts")
needs_scripts = pytest.mark.skipif(
    not os.path.isdir(_SCRIPTS), reason="needs the source tree's scripts/"
)


def _script(name: str, folder: str = _SCRIPTS):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(folder, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@needs_scripts
def test_ptxas_report(tmp_path) -> None:
    log = tmp_path / "build.log"
    log.write_text(
        "ptxas info    : Compiling entry function '_ZN7rownorm1KIfEEvv' for 'sm_90'\n"
        "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem\n"
        "ptxas info    : Compiling entry function '_ZN7rownorm1KIdEEvv' for 'sm_90'\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 40 registers, 400 bytes cmem[0]\n"
    )
    report_py = _script("ptxas_report")
    kernels = report_py.parse(log.read_text())
    spill = kernels[("_ZN7rownorm1KIfEEvv", "sm_90")]
    assert (spill.regs, spill.spill_st, spill.spill_ld, spill.stack, spill.smem) == (
        255,
        4,
        12,
        8,
        1024,
    )
    assert kernels[("_ZN7rownorm1KIdEEvv", "sm_90")].regs == 40
    top = tmp_path / "top.md"
    assert report_py.main([str(log), str(top)]) == 0
    text = top.read_text()
    assert text.startswith("2 kernel(s), 1 with spills, at most 255 registers.")
    assert text.index("**spills** | sm_90 | 255 | 4/12 | 8 | 1024 |") < text.index("| 40 |")
    assert (
        report_py.short("void rownorm::K<rownorm::Op<float>, 4>(int, float*)") == "K<Op<float>, 4>"
    )


@needs_scripts
def test_sanitizer_workload_covers_the_table(monkeypatch, capsys) -> None:
    """The workload runs every op of the table (on the CPU here) on every tier of every dtype,
    extreme values included, and says when one is wrong."""
    import rownorm.testing
    from rownorm.testing.tiers import plan_row_tier

    workload = _script("sanitize_workload")
    for elem in (2, 4):  # a length in every configuration of the tier table, and streaming
        vec = 16 // elem
        lengths = workload.tier_lengths(elem)
        plans = {plan_row_tier(n, vec) for n in lengths}
        edges = rownorm.testing.tiers.tier_boundaries(elem)
        assert len(plans) == len(edges) + 1 and plan_row_tier(lengths[-1], vec).tier == "streaming"
    for dtype in rownorm.testing.DTYPES:
        assert any(c.special for c in workload.cases(dtype))
        assert {c.layout for c in workload.cases(dtype)} >= {"offset", "strided", "expanded"}
        assert {c.dim for c in workload.cases(dtype)} >= {-1, 0, 1}
    small = [
        workload.Case("rows", (6, 40), -1, "contiguous", True),
        workload.Case("odd stride", (4, 9), -1, "strided", False),
        workload.Case("dim 1", (2, 7, 3), 1, "offset", True),
    ]
    monkeypatch.setattr(workload, "cases", lambda dtype: small)
    called = []
    results = workload.results

    def spy(op, *args):
        called.append(op.name)
        return results(op, *args)

    monkeypatch.setattr(workload, "results", spy)
    assert workload.main(["--device", "cpu"]) == 0
    assert "sanitizer workload: results OK (12 cases" in capsys.readouterr().out
    assert set(called) == set(rownorm.testing.op_names())

    calls = []

    def wrong(op, case, dtype, device, *args):  # the device's result (each first call) off
        out = results(op, case, dtype, device, *args)
        calls.append(device)
        return [t * 1.01 for t in out] if len(calls) % 2 and dtype == torch.float32 else out

    monkeypatch.setattr(workload, "results", wrong)
    assert workload.main(["--device", "cpu", "--dtypes", "fp32,bf16"]) == 1
    assert "sanitizer workload: RESULTS WRONG" in capsys.readouterr().out


@pytest.mark.skipif(
    not os.path.isdir(os.path.join(_ROOT, "benchmarks")), reason="needs the source tree"
)
def test_ab_builds_side_env() -> None:
    """benchmarks/ab_builds.py's --a-env / --b-env: a side's workers get its PYTHONPATH and its
    VAR=value pairs over the caller's environment (the A/B of a planning knob in one build); a
    pair without '=' is refused with the option's name."""
    ab = _script("ab_builds", os.path.join(_ROOT, "benchmarks"))
    base = {"PATH": "/bin", "ROWNORM_PARAM_GRADS": "", "PYTHONPATH": "/elsewhere"}
    env = ab.worker_env(base, "/b/python", ["ROWNORM_PARAM_GRADS=two-pass", "X=a=b"])
    assert env == {
        "PATH": "/bin",
        "ROWNORM_PARAM_GRADS": "two-pass",
        "PYTHONPATH": "/b/python",
        "X": "a=b",
    }
    assert base["ROWNORM_PARAM_GRADS"] == ""  # the caller's environment untouched
    assert ab.worker_env(base, "/a/python", []) == dict(base, PYTHONPATH="/a/python")
    with pytest.raises(SystemExit, match="--a-env / --b-env takes VAR=value"):
        ab.worker_env(base, "/a/python", ["ROWNORM_PARAM_GRADS"])
