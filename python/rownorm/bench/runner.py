"""The run: the configurations to measure (the seeds' workloads, then the grid), and the loop
that checks then times every implementation of each, within a time and memory budget."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gc
import math
import statistics
import time
from collections.abc import Sequence

import torch

from rownorm.bench import check
from rownorm.bench.check import TOLERANCE, check_impl
from rownorm.bench.impls import Fn, Impl, Unavailable, err_text
from rownorm.bench.specs import SHORT_DTYPE, OpSpec, Seed
from rownorm.bench.timer import COPY_BYTES_CUDA, SmallCall, Timer, measure_copy_time, time_impl

# The row lengths of DESIGN.md §5. Where a time budget cuts a run short, the first round (the
# long-standing coarse grid) is measured for every op before the second.
GRID_NS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65535, 65536, 131072, 262144)
FIRST_ROUND_NS = (256, 1024, 4096, 16384, 65535, 65536, 262144)
QUICK_NS = (1024, 4096, 65535)
GRID_ELEMS = 1 << 28  # M·N per grid point: 1 GiB of fp32, 20× an H100's L2
QUICK_ELEMS = 1 << 26
SAME_BYTES_COPY = "copy_same_bytes"  # the seeds' tables: a copy of the workload's own bytes
CSV_FIELDS = (
    "op",
    "mode",
    "dtype",
    "M",
    "N",
    "impl",
    "ms",
    "GB/s",
    "pct_of_copy",
    "bytes",
    "rel_err",
    "status",
    "workload",
    "note",
    "setup_s",
    "wall_s",
)


@dataclasses.dataclass
class _Checked:
    """An implementation that passed the check (or fails it, with ``--time-failing``), to be
    timed: its function, the check's error, status and note, and when its setup began."""

    fn: Fn
    err: float
    status: str
    note: str
    setup_s: float
    timing_s: float = 0.0  # the wall time of its rounds so far

    def finish(self, run: Runner, cfg: Config, impl: Impl, ms: float | None) -> Result:
        if ms is None:  # no round ran: an abort or the time budget came first
            res = run._result(cfg, impl, None, self.err, "skipped", run.aborted or "time budget")
        else:
            res = run._result(cfg, impl, ms, self.err, self.status, self.note)
        res.setup_s = self.setup_s
        res.wall_s = self.setup_s + self.timing_s
        return res


@dataclasses.dataclass
class Config:
    spec: OpSpec
    mode: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    dim: int
    kwargs: dict
    impls: tuple[Impl, ...]
    workload: str = "grid"  # "grid", or the seed's title
    seed: Seed | None = None

    @property
    def params(self) -> tuple[str, ...] | None:
        """The parameters to make (None: the op's own)."""
        return self.seed.params if self.seed is not None else None

    @property
    def n(self) -> int:
        return self.shape[self.dim]

    @property
    def m(self) -> int:
        return math.prod(self.shape) // max(self.n, 1)

    @property
    def elem(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def nbytes(self) -> int:
        return self.spec.nbytes(self.mode, self.m, self.n, self.elem)

    def describe(self) -> str:
        shape = "×".join(str(s) for s in self.shape)
        return f"{self.spec.name} {self.mode} {SHORT_DTYPE[self.dtype]} {shape} dim={self.dim}"


@dataclasses.dataclass
class Result:
    op: str
    mode: str
    dtype: str  # torch name: float32, bfloat16, ...
    M: int
    N: int
    impl: str
    ms: float | None
    gbps: float | None
    pct: float | None
    nbytes: int
    rel_err: float | None
    status: str  # ok | FAIL | error | skipped
    workload: str = "grid"
    note: str = ""
    setup_s: float | None = None  # make + first call + check (torch.compile's compile, ...)
    wall_s: float | None = None  # the whole measurement: setup + timing loop

    def csv_row(self) -> dict:
        def fmt(v: float | None, spec: str) -> str:
            return "" if v is None else format(v, spec)

        return {
            "op": self.op,
            "mode": self.mode,
            "dtype": self.dtype,
            "M": self.M,
            "N": self.N,
            "impl": self.impl,
            "ms": fmt(self.ms, ".5f"),
            "GB/s": fmt(self.gbps, ".1f"),
            "pct_of_copy": fmt(self.pct, ".1f"),
            "bytes": self.nbytes,
            "rel_err": fmt(self.rel_err, ".2e"),
            "status": self.status,
            "workload": self.workload,
            "note": self.note,
            "setup_s": fmt(self.setup_s, ".2f"),
            "wall_s": fmt(self.wall_s, ".2f"),
        }

    @classmethod
    def from_csv_row(cls, row: dict) -> Result:
        def num(key: str, kind: type = float):
            return kind(row[key]) if row.get(key) not in (None, "") else None

        return cls(
            op=row["op"],
            mode=row["mode"],
            dtype=row["dtype"],
            M=int(row["M"]),
            N=int(row["N"]),
            impl=row["impl"],
            ms=num("ms"),
            gbps=num("GB/s"),
            pct=num("pct_of_copy"),
            nbytes=int(row["bytes"]),
            rel_err=num("rel_err"),
            status=row["status"],
            workload=row.get("workload", "grid"),
            note=row.get("note", ""),
            setup_s=num("setup_s"),
            wall_s=num("wall_s"),
        )


@dataclasses.dataclass
class RunInfo:
    """What the report says about the run besides the results."""

    device_name: str
    copy_gbps: float | None
    command: str
    started: str
    torch_version: str = torch.__version__
    cuda_version: str | None = torch.version.cuda
    build: dict = dataclasses.field(default_factory=dict)
    flush_bytes: int = 0
    copy_bytes: int = COPY_BYTES_CUDA
    timer: str = "CUDA events around the op alone"
    rounds: int = 1  # interleaved rounds per configuration (--rounds)
    duration_s: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)
    ops: list[str] = dataclasses.field(default_factory=list)
    peers: str = ""  # versions of the peers' packages
    small_calls: list[SmallCall] = dataclasses.field(default_factory=list)


def grid_shape(n: int, elems: int) -> tuple[int, int]:
    """M × N with M·N ≥ elems (M = ceil(elems / N))."""
    return (max(-(-elems // n), 1), n)


def probe_impls(
    specs: Sequence[OpSpec], wanted: Sequence[str], device: torch.device | None = None
) -> dict[tuple[str, str], str]:
    """Implementations that cannot run here, {(op, impl): why}; asked once, before the run.

    Only :class:`Unavailable` counts: any other error of ``make`` (rownorm missing an op, say)
    is left to surface as an error at measurement time."""
    missing = {}
    for spec in specs:
        for impl in spec.impls:
            if not (_selected(impl, wanted, True)):
                continue
            if impl.cuda_only and device is not None and device.type != "cuda":
                missing[(spec.name, impl.name)] = f"{impl.label} runs on CUDA only"
                continue
            try:
                impl.make(-1, dict(spec.kwargs))
            except Unavailable as why:
                missing[(spec.name, impl.name)] = str(why)
            except Exception:  # noqa: BLE001,S110  (reported per measurement instead)
                pass
    return missing


def grid_rounds(ns: Sequence[int]) -> list[list[int]]:
    """The N of the grid in the order they are measured: FIRST_ROUND_NS, then the rest, each
    in the given order, so a time budget that runs out drops the in-between row lengths."""
    first = [n for n in ns if n in FIRST_ROUND_NS]
    rest = [n for n in ns if n not in FIRST_ROUND_NS]
    return [r for r in (first, rest) if r]


def build_configs(
    args: argparse.Namespace,
    specs: Sequence[OpSpec],
    unavailable: dict[tuple[str, str], str] | None = None,
) -> list[Config]:
    """The seeds' workloads of every op first (the headline numbers), then the grid, round by
    round (:func:`grid_rounds`), each round by N, op, mode, dtype: where a time budget runs out,
    every op has the same row lengths measured.

    An op with ``default_grid=False`` runs its grid only when ``--ops`` names it."""
    unavailable = unavailable or {}
    named = set(getattr(args, "ops_named", ()) or ())

    def usable(spec: OpSpec, impl: Impl, seed: bool) -> bool:
        return (spec.name, impl.name) not in unavailable and _selected(impl, args.impls, seed)

    configs: list[Config] = []
    for spec in specs:
        for seed in spec.seeds if args.seeds else ():
            impls = tuple(spec.impl(n) for n in seed.impls if usable(spec, spec.impl(n), True))
            if seed.mode in args.modes and impls:
                kwargs = {**spec.kwargs, **seed.kwargs}
                configs.append(
                    Config(
                        spec,
                        seed.mode,
                        seed.dtype,
                        seed.shape,
                        seed.dim,
                        kwargs,
                        impls,
                        workload=seed.title,
                        seed=seed,
                    )
                )
    if args.seeds_only:
        return configs
    grid_specs = [
        (spec, impls)
        for spec in specs
        if (spec.default_grid or spec.name in named)
        and (impls := tuple(i for i in spec.impls if usable(spec, i, False)))
    ]
    for ns in grid_rounds(args.ns):
        for n in ns:
            for spec, impls in grid_specs:
                for mode in args.modes:
                    for dtype in args.dtypes:
                        shape = grid_shape(n, args.elems)
                        configs.append(
                            Config(spec, mode, dtype, shape, -1, dict(spec.kwargs), impls)
                        )
    return configs


def _selected(impl: Impl, wanted: Sequence[str], seed: bool) -> bool:
    if impl.name in wanted:
        return True
    return impl.family in wanted and (impl.grid or seed)


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


class Terminated(KeyboardInterrupt):
    """SIGTERM (e.g. from `timeout`): stop, but still write what was measured."""


def on_sigterm(signum, frame) -> None:
    raise Terminated()


def _is_fatal_device_error(err: BaseException) -> bool:
    """A sticky CUDA error (illegal address, ...) poisons the context: nothing after it runs."""
    accel = getattr(torch, "AcceleratorError", None)
    if accel is not None and isinstance(err, accel):
        return True
    text = str(err)
    return "CUDA error" in text and "out of memory" not in text


def free(device: torch.device, full: bool = False) -> None:
    # A full collection takes ~0.2 s once torch.compile is imported (hundreds of thousands of
    # objects), ~40 s over a whole run; the young generations hold what one configuration
    # made. The full one runs before a configuration is skipped for lack of memory.
    gc.collect() if full else gc.collect(1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _estimated_bytes(cfg: Config) -> int:
    """Device memory a configuration needs: its tensors, the eager peers' temporaries, and
    the float64 reference chunks."""
    x = math.prod(cfg.shape) * cfg.elem
    copies = 4 if cfg.mode == "fwd" else 9  # fwd: x, y, temps; fwdbwd: x, dy, y, dx, temps
    # add_rms_norm: twice the row tensors (x, residual; out, r; their dys and gradients).
    return copies * cfg.spec.n_outputs * x + 6 * check.CHUNK_ELEMS * 8


def _fits(cfg: Config, device: torch.device, max_mem_gb: float | None) -> str | None:
    need = _estimated_bytes(cfg)
    if max_mem_gb is not None and need > max_mem_gb * 1e9:
        return f"needs ~{need / 1e9:.1f} GB > --max-mem-gb {max_mem_gb:g}"
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if need > 0.95 * free:
            return f"needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB free"
    return None


class Runner:
    def __init__(self, args: argparse.Namespace, device: torch.device, info: RunInfo) -> None:
        self.args = args
        self.device = device
        self.info = info
        self.results: list[Result] = []
        self.timer: Timer | None = None
        self.t0 = time.monotonic()
        self.aborted: str | None = None
        self._csv_file = None
        self._csv = None

    # -- output ----------------------------------------------------------------------------
    def open_csv(self, path: str) -> None:
        self._csv_file = open(path, "w", newline="")  # noqa: SIM115  (closed in close_csv)
        self._csv = csv.DictWriter(self._csv_file, fieldnames=CSV_FIELDS)
        self._csv.writeheader()
        self._csv_file.flush()

    def close_csv(self) -> None:
        if self._csv_file is not None:
            self._csv_file.close()
            self._csv_file = None

    def add(self, result: Result) -> None:
        self.results.append(result)
        if self._csv is not None:
            self._csv.writerow(result.csv_row())
            self._csv_file.flush()

    # -- the loop --------------------------------------------------------------------------
    def remaining_s(self) -> float:
        if self.args.time_budget is None:
            return math.inf
        return self.args.time_budget - (time.monotonic() - self.t0)

    def run(self, configs: list[Config]) -> None:
        total = sum(len(c.impls) for c in configs)
        width = len(str(total))
        done = 0
        for cfg in configs:
            if self.aborted:
                reason = self.aborted
            elif self.remaining_s() < self.args.reserve_s:
                reason = "time budget exhausted"
            else:
                reason = _fits(cfg, self.device, self.args.max_mem_gb)
                if reason:
                    free(self.device, full=True)
                    reason = _fits(cfg, self.device, self.args.max_mem_gb)
            if reason:
                for impl in cfg.impls:
                    done += 1
                    self._skip(cfg, impl, reason)
                print(f"[{done:>{width}}/{total}] skip {cfg.describe()}: {reason}", flush=True)
                continue
            try:
                done = self._run_config(cfg, done, total, width)
            except torch.cuda.OutOfMemoryError as err:
                msg = "out of memory: " + str(err).splitlines()[0][:120]
                done = self._skip_rest(cfg, msg, done)
                print(f"    skip rest of {cfg.describe()}: {msg}", flush=True)
                free(self.device, full=True)
            finally:
                free(self.device)

    def _skip(self, cfg: Config, impl: Impl, reason: str) -> None:
        self.add(self._result(cfg, impl, None, None, "skipped", reason))

    def _skip_rest(self, cfg: Config, reason: str, done: int) -> int:
        have = {(r.impl) for r in self.results if self._same(r, cfg)}
        for impl in cfg.impls:
            if impl.name not in have:
                done += 1
                self._skip(cfg, impl, reason)
        return done

    @staticmethod
    def _same(r: Result, cfg: Config) -> bool:
        return (r.op, r.mode, r.dtype, r.M, r.N, r.workload) == (
            cfg.spec.name,
            cfg.mode,
            str(cfg.dtype).removeprefix("torch."),
            cfg.m,
            cfg.n,
            cfg.workload,
        )

    def _result(
        self,
        cfg: Config,
        impl: Impl | str,
        ms: float | None,
        err: float | None,
        status: str,
        note: str = "",
    ) -> Result:
        """The result of ``impl`` (an implementation, or a name such as SAME_BYTES_COPY)."""
        gbps = cfg.nbytes / (ms * 1e6) if ms else None
        copy = self.info.copy_gbps
        pct = 100.0 * gbps / copy if gbps and copy else None
        return Result(
            op=cfg.spec.name,
            mode=cfg.mode,
            dtype=str(cfg.dtype).removeprefix("torch."),
            M=cfg.m,
            N=cfg.n,
            impl=impl if isinstance(impl, str) else impl.name,
            ms=ms,
            gbps=gbps,
            pct=pct,
            nbytes=cfg.nbytes,
            rel_err=err,
            status=status,
            workload=cfg.workload,
            note=note,
        )

    def _run_config(self, cfg: Config, done: int, total: int, width: int) -> int:
        """Checks every implementation of ``cfg``, then times the ones that passed in
        ``--rounds`` interleaved rounds (each a median over ``rep_ms / rounds`` of reps, the
        implementations' order rotating from round to round) and reports each one's median
        over the rounds: drift of the GPU (clocks, temperature, the machine) falls on every
        implementation alike instead of on whichever was timed last."""
        gen = torch.Generator(device=self.device)
        gen.manual_seed(self.args.seed)
        inputs = cfg.spec.make_inputs(
            cfg.shape, cfg.dim, cfg.dtype, self.device, gen, params=cfg.params
        )
        dys = None
        if cfg.mode == "fwdbwd":
            x = inputs[0]
            dys = [
                torch.randn(x.shape, dtype=x.dtype, device=self.device, generator=gen)
                for _ in range(cfg.spec.n_outputs)
            ]
        tags = {}
        checked: dict[str, Result | _Checked] = {}
        for impl in cfg.impls:
            done += 1
            tags[impl.name] = f"[{done:>{width}}/{total}] {cfg.describe()} {impl.name}"
            if self.aborted:
                checked[impl.name] = self._result(cfg, impl, None, None, "skipped", self.aborted)
            elif self.remaining_s() < self.args.reserve_s:
                checked[impl.name] = self._result(
                    cfg, impl, None, None, "skipped", "time budget exhausted"
                )
            else:
                checked[impl.name] = self._guarded(cfg, impl, self._check, cfg, impl, inputs, dys)
        pending = [i for i in cfg.impls if isinstance(checked[i.name], _Checked)]
        times: dict[str, list[float]] = {i.name: [] for i in pending}
        rounds = self.args.rounds
        for r in range(rounds):
            for k in range(len(pending)):
                impl = pending[(k + r) % len(pending)]
                state = checked[impl.name]
                if not isinstance(state, _Checked) or self.aborted:
                    continue
                if r > 0 and self.remaining_s() < self.args.reserve_s:
                    continue  # a budget cut short: the rounds timed so far
                t0 = time.perf_counter()
                ms = self._guarded(cfg, impl, self._time, cfg, state.fn, inputs, dys, rounds)
                state.timing_s += time.perf_counter() - t0
                if isinstance(ms, Result):  # an error or out of memory while timing
                    checked[impl.name] = ms
                else:
                    times[impl.name].append(ms)
        for impl in cfg.impls:
            res = checked[impl.name]
            if isinstance(res, _Checked):
                ms_list = times[impl.name]
                res = res.finish(self, cfg, impl, statistics.median(ms_list) if ms_list else None)
            self._report(tags[impl.name], res)
        del inputs, dys
        if cfg.seed is not None and not self.aborted and self.remaining_s() >= self.args.reserve_s:
            self.add(self._same_bytes_copy(cfg))
        return done

    def _guarded(self, cfg: Config, impl: Impl, step, *args):
        """``step(*args)`` for ``impl``, or the Result of its failure: out of memory (skipped),
        any other error; a CUDA error ends the process's measurements (``self.aborted``)."""
        try:
            return step(*args)
        except torch.cuda.OutOfMemoryError as exc:
            free(self.device, full=True)  # before the next implementation
            why = err_text(exc)[len("OutOfMemoryError: ") :][:120]
            return self._result(cfg, impl, None, None, "skipped", "out of memory: " + why)
        except Exception as exc:  # noqa: BLE001  (reported, not hidden)
            if _is_fatal_device_error(exc):
                self.aborted = f"aborted after a CUDA error in {impl.name}"
            return self._result(cfg, impl, None, None, "error", err_text(exc))

    def _report(self, tag: str, res: Result) -> None:
        self.add(res)
        if res.status == "ok":
            pct = f" ({res.pct:.0f}%)" if res.pct is not None else ""
            print(
                f"{tag}: {res.ms:.4f} ms {res.gbps:.0f} GB/s{pct} err {res.rel_err:.1e}",
                flush=True,
            )
        else:
            timed = f" {res.ms:.4f} ms" if res.ms else ""
            print(f"{tag}: {res.status}{timed} {res.note}", flush=True)
        if self.aborted and res.status == "error":
            print(f"    {self.aborted}: nothing more can run in this process", flush=True)

    def _same_bytes_copy(self, cfg: Config) -> Result:
        """A copy moving a seed workload's bytes (half read, half written), timed like the ops:
        the floor for a problem this size, launch and ramp included, which the copy limit of
        the big buffer does not show for small workloads."""
        ms, _ = measure_copy_time(self._timer(), cfg.nbytes // 2)
        return self._result(cfg, SAME_BYTES_COPY, ms, None, "ok")

    def _timer(self) -> Timer:
        if self.timer is None:
            self.timer = Timer(self.device)
        return self.timer

    def _check(
        self, cfg: Config, impl: Impl, inputs: list[torch.Tensor], dys: list[torch.Tensor] | None
    ) -> Result | _Checked:
        """Checks one implementation against the reference: the Result of one that is not to be
        timed (unavailable, or failing without ``--time-failing``), else what timing it needs.

        ``setup_s`` is the wall time of making the function and its first (checked) call:
        torch.compile's compilation, Triton's JIT, the float64 reference."""
        if impl.cuda_only and self.device.type != "cuda":
            return self._result(cfg, impl, None, None, "skipped", "unavailable: CUDA only")
        t0 = time.perf_counter()
        try:
            fn = impl.make(cfg.dim, cfg.kwargs)
            err, detail = check_impl(cfg.spec, fn, inputs, cfg.dim, cfg.kwargs, cfg.mode, dys)
        except Unavailable as why:
            return self._result(cfg, impl, None, None, "skipped", f"unavailable: {why}")
        self._sync()
        setup_s = time.perf_counter() - t0
        tol = TOLERANCE[cfg.dtype]
        passed = err <= tol  # False for NaN
        note = "" if passed else f"rel err {detail} > tol {tol:.0e}"
        if not passed and not self.args.time_failing:
            res = self._result(cfg, impl, None, err, "FAIL", note + "; not timed")
            res.setup_s = setup_s
            res.wall_s = setup_s
            return res
        return _Checked(fn, err, "ok" if passed else "FAIL", note, setup_s)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _time(
        self,
        cfg: Config,
        fn: Fn,
        inputs: list[torch.Tensor],
        dys: list[torch.Tensor] | None,
        rounds: int = 1,
    ) -> float:
        """One round's median ms: ``rep_ms / rounds`` of timed reps (at least ``min_reps``)."""
        args = self.args
        return time_impl(
            self._timer(),
            fn,
            inputs,
            cfg.mode,
            dys,
            warmup_ms=args.warmup_ms,
            rep_ms=args.rep_ms / rounds,
            min_reps=args.min_reps,
        )
