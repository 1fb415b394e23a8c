"""Benchmark harness shared by every rownorm op: ``python -m rownorm.bench``.

For each op × mode (fwd, fwd+bwd) × dtype × row length N on a fixed grid (M·N ≥ 2^28 elements,
far beyond L2), every implementation (rownorm, eager PyTorch, torch.compile of the eager
expression, Liger-Kernel when importable and offering the op) is first checked against the
float64 reference and then timed: median of many reps with CUDA events, the L2 cache flushed
before each rep by writing a buffer of at least twice its size, only the op inside the events
(the method of ``triton.testing.do_bench``, without the triton dependency). Bandwidth is counted
from an explicit per-op byte formula (the minimum traffic: fwd reads x and writes y once;
fwd+bwd also reads x and dy and writes dx once; weights and biases are not counted) and reported
as a share of the device-to-device copy bandwidth (``dst.copy_(src)`` of 2 GiB, bytes read +
written) measured in the same run. fwd+bwd is a training step: the gradient of x and of every
parameter (weight, bias) is computed.

Results go to ``--out`` (default ``benchmarks/results/<gpu>``): ``results.csv``,
``results.md`` (one table per op × mode, then the seeds' workloads), ``<op>.png`` (GB/s vs N,
when matplotlib is importable) and ``COMMAND.txt``.

Adding an op = one :class:`OpSpec` in :data:`OPS`: how to make inputs, its implementations, its
byte formulas and its float64 reference (the backward reference is float64 autograd of it).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import gc
import importlib
import importlib.metadata
import math
import os
import re
import shlex
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from rownorm import build_info
from rownorm import reference as ref_impl

# The row lengths of DESIGN.md §5 / ANCHORS.md. Where a time budget cuts a run short, the
# first round (the long-standing coarse grid) is measured for every op before the second.
GRID_NS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65535, 65536, 131072, 262144)
FIRST_ROUND_NS = (256, 1024, 4096, 16384, 65535, 65536, 262144)
QUICK_NS = (1024, 4096, 65535)
GRID_ELEMS = 1 << 28  # M·N per grid point: 1 GiB of fp32, 20× an H100's L2
QUICK_ELEMS = 1 << 26
MODES = ("fwd", "fwdbwd")
FAMILIES = ("rownorm", "eager", "compile", "liger")
COPY_BYTES_CUDA = 1 << 31  # the copy-limit buffer: 2 GiB read + 2 GiB written
SAME_BYTES_COPY = "copy_same_bytes"  # the seeds' tables: a copy of the workload's own bytes
COPY_BYTES_CPU = 1 << 28
FLUSH_BYTES_MIN = 256 << 20
# Correctness tolerance of any implementation in the benchmark: ‖out − ref‖ / ‖ref‖.
TOLERANCE = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 1e-2,
    torch.bfloat16: 1e-2,
}
DTYPE_ALIASES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "f32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "f16": torch.float16,
    "half": torch.float16,
    "float64": torch.float64,
    "fp64": torch.float64,
    "double": torch.float64,
}
SHORT_DTYPE = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float64: "fp64",
}
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
# A reference chunk holds at most this many elements of one float64 tensor (256 MiB), so the
# check of an 8.6 GB input needs only a few GB beside it.
_CHUNK_ELEMS = 1 << 25


# --------------------------------------------------------------------------------------------
# Op specifications
# --------------------------------------------------------------------------------------------

Fn = Callable[..., Any]  # fn(*tensors) -> Tensor | tuple[Tensor, ...]
Make = Callable[[int, dict], Fn]  # make(dim, kwargs) -> fn


class Unavailable(Exception):
    """An implementation that cannot run here (package missing, op not offered); not a failure."""


@dataclasses.dataclass(frozen=True)
class Impl:
    """One implementation of an op.

    ``make(dim, kwargs)`` returns ``fn(*tensors)`` (called once per configuration, so
    torch.compile sees one static shape) or raises :class:`Unavailable`.
    """

    name: str  # CSV key and column: rownorm, eager_norm, compile, ...
    family: str  # what --impls selects: rownorm | eager | compile | liger
    label: str  # column header in the markdown tables
    expr: str  # the expression timed, for the legend
    make: Make
    grid: bool = True  # part of the default grid (False: seeds only, or when named in --impls)
    cuda_only: bool = False  # reported as unavailable on a CPU run


@dataclasses.dataclass(frozen=True)
class Seed:
    """A fixed workload from the seeds, reported in ms against eager, compile and the limit."""

    title: str
    mode: str
    shape: tuple[int, ...]
    dim: int
    dtype: torch.dtype
    impls: tuple[str, ...]
    kwargs: dict = dataclasses.field(default_factory=dict)
    target_ms_h100: float | None = None
    params: tuple[str, ...] | None = None  # None: the op's own (e.g. () = no weight)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """Everything the harness needs to know about one op.

    - ``make_inputs(shape, dim, dtype, device, generator, params=None)``: the op's tensors,
      positional, as the implementations take them: ``rows`` tensors of x's shape ("row"
      tensors, independent per row, split into chunks for the reference), then the parameters
      named in ``params`` (weight, bias: shape ``(x.size(dim),)``, passed whole). Every
      floating tensor is differentiable in fwd+bwd mode.
    - ``reference(*tensors, dim=, **kwargs)``: float64 truth; must be differentiable in float64
      (the backward reference is its float64 autograd).
    - ``fwd_bytes(M, N, elem)`` / ``fwdbwd_bytes(M, N, elem)``: minimum traffic in bytes,
      with M = rows, N = x.size(dim), elem = bytes per element.
    """

    name: str
    make_inputs: Callable[..., list[torch.Tensor]]
    reference: Callable[..., Any]
    impls: tuple[Impl, ...]
    fwd_bytes: Callable[[int, int, int], int]
    fwdbwd_bytes: Callable[[int, int, int], int]
    fwd_bytes_text: str
    fwdbwd_bytes_text: str
    kwargs: dict = dataclasses.field(default_factory=dict)
    n_outputs: int = 1  # outputs, each of x's shape and dtype (each gets a dy in fwd+bwd)
    baseline: str = "eager"  # the PyTorch eager impl that `python -m rownorm` compares against
    seeds: tuple[Seed, ...] = ()
    input_names: tuple[str, ...] = ("x",)  # names of make_inputs' tensors, for error details
    output_names: tuple[str, ...] = ("out",)
    last_dim_only: bool = False  # the op reduces over the last dim only (no `dim` argument)
    default_grid: bool = True  # False: the grid runs only when --ops names the op

    def impl(self, name: str) -> Impl:
        for impl in self.impls:
            if impl.name == name:
                return impl
        raise KeyError(f"{self.name}: no implementation named {name!r}")

    def ours(self) -> Impl:
        return next(i for i in self.impls if i.family == "rownorm")


def _inputs(rows: int = 1, params: tuple[str, ...] = ()) -> Callable[..., list[torch.Tensor]]:
    """``make_inputs`` of an op taking ``rows`` tensors of x's shape, then ``params``.

    Row tensors are standard normal. A weight is 1 + 0.1·N(0, 1) and a bias 0.1·N(0, 1), both
    in x's dtype (the LLM case), so parameter gradients are neither trivial nor cancelling."""
    default_params = params

    def make(shape, dim, dtype, device, generator, params=None) -> list[torch.Tensor]:
        tensors = [
            torch.randn(shape, dtype=dtype, device=device, generator=generator) for _ in range(rows)
        ]
        for name in default_params if params is None else params:
            noise = 0.1 * torch.randn(shape[dim], device=device, generator=generator)
            tensors.append((noise + 1.0 if name == "weight" else noise).to(dtype))
        return tensors

    return make


_randn_inputs = _inputs()


def _compiled(fn: Fn) -> Fn:
    # Each configuration gets a fresh compile of one static shape; resetting first keeps the
    # recompile limit from silently sending later shapes to eager.
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def _compile_of(make: Make) -> Make:
    return lambda dim, kw: _compiled(make(dim, kw))


def _last_dim(dim: int, what: str) -> None:
    if dim != -1:
        raise Unavailable(f"{what} reduces over the last dim only")


def _rownorm_api(name: str) -> Fn:
    """``rownorm.<name>`` (the public function), else the registered ``torch.ops.rownorm``
    op of the same signature; an error (not Unavailable) when neither exists."""
    import rownorm

    fn = getattr(rownorm, name, None)
    if fn is None and hasattr(torch.ops.rownorm, name):
        fn = getattr(torch.ops.rownorm, name)
    if fn is None:
        raise RuntimeError(f"rownorm has no {name} (neither rownorm.{name} nor torch.ops.rownorm)")
    return fn


def _rownorm_impl(api: str, expr: str, pass_dim: bool = True) -> Impl:
    """rownorm's implementation: ``rownorm.<api>(*tensors, dim=dim, **kwargs)``."""

    def make(dim: int, kw: dict) -> Fn:
        fn = _rownorm_api(api)
        extra = {"dim": dim} if pass_dim else {}
        return lambda *t: fn(*t, **extra, **kw)

    return Impl("rownorm", "rownorm", "rownorm", expr, make)


def _liger_module():
    try:
        from liger_kernel.transformers import functional
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] == "liger_kernel":
            raise Unavailable("liger_kernel is not installed") from err
        raise Unavailable(f"liger_kernel does not import: {err}") from err
    except Exception as err:  # noqa: BLE001  (a broken optional peer is not a failure)
        raise Unavailable(f"liger_kernel does not import: {type(err).__name__}: {err}") from err
    return functional


def peer_versions() -> str:
    """torch / triton / Liger-Kernel versions, for the report."""
    parts = [f"torch {torch.__version__}"]
    try:
        parts.append(f"triton {importlib.metadata.version('triton')}")
    except importlib.metadata.PackageNotFoundError:
        parts.append("triton not installed")
    liger = liger_version()
    parts.append(f"Liger-Kernel {liger}" if liger else "Liger-Kernel not installed")
    return ", ".join(parts)


def liger_version() -> str | None:
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return None


def _liger_missing(op: str) -> Make:
    def make(dim: int, kw: dict) -> Fn:
        _liger_module()
        raise Unavailable(f"Liger-Kernel has no {op} op")

    return make


def _liger_impl(
    op: str, attr: str | None, call: Callable[[Fn, dict], Fn] | None = None, args: str = "x"
) -> Impl:
    """Liger-Kernel's ``liger_kernel.transformers.functional.<attr>`` (last dim only), or a
    placeholder reported as unavailable when Liger has no such op."""
    if attr is None or call is None:
        return Impl("liger", "liger", "Liger", "Liger-Kernel", _liger_missing(op), cuda_only=True)

    def make(dim: int, kw: dict) -> Fn:
        fn = getattr(_liger_module(), attr, None)
        if fn is None:
            raise Unavailable(f"liger_kernel {liger_version()} has no {attr}")
        _last_dim(dim, "Liger-Kernel")
        return call(fn, kw)

    return Impl(
        "liger",
        "liger",
        "Liger",
        f"liger_kernel.transformers.functional.{attr}({args})",
        make,
        cuda_only=True,
    )


def _peers(
    label: str, expr: str, make: Make, suffix: str = "", grid: bool = True
) -> tuple[Impl, ...]:
    """An eager PyTorch expression and torch.compile of the same expression."""
    return (
        Impl(f"eager{suffix}", "eager", f"eager {label}", expr, make, grid),
        Impl(
            f"compile{suffix}",
            "compile",
            f"compile {label}",
            f"torch.compile({expr}, dynamic=False)",
            _compile_of(make),
            grid,
        ),
    )


def _reference(name: str, pass_dim: bool = True) -> Callable[..., Any]:
    def ref(*tensors, dim: int, **kw):
        fn = getattr(ref_impl, name)
        return fn(*tensors, dim=dim, **kw) if pass_dim else fn(*tensors, **kw)

    return ref


def _bcast(p: torch.Tensor | None, x: torch.Tensor, dim: int) -> torch.Tensor | None:
    """A (N,) parameter shaped to broadcast against x along ``dim``."""
    if p is None or dim % x.ndim == x.ndim - 1:
        return p
    return p.view([-1 if i == dim % x.ndim else 1 for i in range(x.ndim)])


# Byte formulas (b = bytes per element; weights/biases are N·b, negligible, not counted).
def _rw2(m: int, n: int, b: int) -> int:
    return 2 * m * n * b


def _rw5(m: int, n: int, b: int) -> int:
    return 5 * m * n * b


_FWD_TEXT = "2·M·N·b (read x, write y)"
_FWDBWD_TEXT = "5·M·N·b (fwd: read x, write y; bwd: read x, read dy, write dx)"
_PARAM_NOTE = "; weight/bias and their gradients (N elements) not counted"

# ---- l2_normalize ---------------------------------------------------------------------------


def _l2_eager_norm(dim: int, kw: dict) -> Fn:
    return lambda x: x / torch.norm(x, p=2, dim=dim, keepdim=True)


def _l2_eager_normalize(dim: int, kw: dict) -> Fn:
    eps = kw["eps"]
    return lambda x: F.normalize(x, p=2, dim=dim, eps=eps)


_L2_EXPR_NORM = "x / torch.norm(x, p=2, dim=dim, keepdim=True)"
_L2_EXPR = "F.normalize(x, p=2, dim=dim, eps=eps)"
_eager_norm, _compile_norm = _peers("x/norm", _L2_EXPR_NORM, _l2_eager_norm, "_norm")
_eager_normalize, _compile_normalize = _peers("F.normalize", _L2_EXPR, _l2_eager_normalize)

L2_NORMALIZE = OpSpec(
    name="l2_normalize",
    make_inputs=_randn_inputs,
    reference=_reference("l2_normalize"),
    impls=(
        _rownorm_impl("l2_normalize", "rownorm.l2_normalize(x, dim, eps)"),
        _eager_norm,
        dataclasses.replace(_eager_normalize, name="eager_normalize"),
        _compile_normalize,
        dataclasses.replace(_compile_norm, grid=False),
        _liger_impl("l2_normalize", None),
    ),
    fwd_bytes=_rw2,
    fwdbwd_bytes=_rw5,
    fwd_bytes_text=_FWD_TEXT,
    fwdbwd_bytes_text=_FWDBWD_TEXT,
    kwargs={"eps": 1e-12},
    baseline="eager_normalize",
    # The seeds' `x / torch.norm(x, p=2, dim=1, keepdim=True)`: eps = 0 (ANCHORS.md targets).
    seeds=tuple(
        Seed(
            title=title,
            mode=mode,
            shape=shape,
            dim=1,
            dtype=torch.float32,
            impls=("rownorm", "eager_norm", "eager_normalize", "compile_norm", "compile"),
            kwargs={"eps": 0.0},
            target_ms_h100=target,
        )
        for title, mode, shape, target in (
            ("L2 normalize dim=1, 32768×65535 fp32 (seeds 000/002)", "fwd", (32768, 65535), 6.0),
            ("L2 normalize dim=1 fwd+bwd, 16384×65535 fp32", "fwdbwd", (16384, 65535), 8.0),
        )
    ),
)

# ---- l1_normalize and mean-abs normalize ----------------------------------------------------


def _l1_eager(dim: int, kw: dict) -> Fn:
    eps = kw["eps"]
    return lambda x: F.normalize(x, p=1, dim=dim, eps=eps)


def _mean_abs_eager(dim: int, kw: dict) -> Fn:
    eps = kw["eps"]
    if eps > 0:
        return lambda x: x / torch.mean(torch.abs(x), dim=dim, keepdim=True).clamp_min(eps)
    return lambda x: x / torch.mean(torch.abs(x), dim=dim, keepdim=True)


L1_NORMALIZE = OpSpec(
    name="l1_normalize",
    make_inputs=_randn_inputs,
    reference=_reference("l1_normalize"),
    impls=(
        _rownorm_impl("l1_normalize", "rownorm.l1_normalize(x, dim, eps)"),
        *_peers("F.normalize(p=1)", "F.normalize(x, p=1, dim=dim, eps=eps)", _l1_eager),
        _liger_impl("l1_normalize", None),
    ),
    fwd_bytes=_rw2,
    fwdbwd_bytes=_rw5,
    fwd_bytes_text=_FWD_TEXT,
    fwdbwd_bytes_text=_FWDBWD_TEXT,
    kwargs={"eps": 1e-12, "mean": False},
)

# The seed 003 expression; the same kernel as l1_normalize (a different scale), so its grid
# runs only when named (--ops mean_abs).
MEAN_ABS = OpSpec(
    name="mean_abs",
    make_inputs=_randn_inputs,
    reference=_reference("l1_normalize"),
    impls=(
        _rownorm_impl("l1_normalize", "rownorm.l1_normalize(x, dim, eps=0, mean=True)"),
        *_peers(
            "x/mean|x|", "x / torch.mean(torch.abs(x), dim=dim, keepdim=True)", _mean_abs_eager
        ),
        _liger_impl("mean_abs", None),
    ),
    fwd_bytes=_rw2,
    fwdbwd_bytes=_rw5,
    fwd_bytes_text=_FWD_TEXT,
    fwdbwd_bytes_text=_FWDBWD_TEXT,
    kwargs={"eps": 0.0, "mean": True},
    default_grid=False,
    seeds=(
        Seed(
            title="mean-abs normalize dim=1, 32768×65535 fp32 (seed 003)",
            mode="fwd",
            shape=(32768, 65535),
            dim=1,
            dtype=torch.float32,
            impls=("rownorm", "eager", "compile"),
            target_ms_h100=6.0,
        ),
    ),
)

# ---- rms_norm -------------------------------------------------------------------------------


def _rms_eager(dim: int, kw: dict) -> Fn:
    _last_dim(dim, "F.rms_norm")
    eps = kw["eps"]
    return lambda x, w=None: F.rms_norm(x, (x.shape[-1],), w, eps)


def _rms_eager_expr(dim: int, kw: dict) -> Fn:
    eps = kw["eps"]

    def fn(x, w=None):
        y = x / torch.sqrt(torch.mean(x**2, dim=dim, keepdim=True) + eps)
        return y if w is None else y * _bcast(w, x, dim)

    return fn


RMS_NORM = OpSpec(
    name="rms_norm",
    make_inputs=_inputs(params=("weight",)),
    reference=_reference("rms_norm"),
    impls=(
        _rownorm_impl("rms_norm", "rownorm.rms_norm(x, w, dim, eps)"),
        *_peers("F.rms_norm", "F.rms_norm(x, (N,), w, eps)", _rms_eager),
        *_peers(
            "x/sqrt(mean(x²)+eps)",
            "x / torch.sqrt(torch.mean(x ** 2, dim=dim, keepdim=True) + eps) [* w]",
            _rms_eager_expr,
            suffix="_expr",
            grid=False,
        ),
        _liger_impl(
            "rms_norm",
            "liger_rms_norm",
            lambda f, kw: lambda x, w: f(x, w, kw["eps"], in_place=False),
            "x, w, eps, in_place=False",
        ),
    ),
    fwd_bytes=_rw2,
    fwdbwd_bytes=_rw5,
    fwd_bytes_text=_FWD_TEXT + _PARAM_NOTE,
    fwdbwd_bytes_text=_FWDBWD_TEXT + _PARAM_NOTE,
    kwargs={"eps": 1e-6},
    input_names=("x", "weight"),
    seeds=(
        Seed(
            title="RMSNorm over channels dim=1, 112×64×512×512 fp32, eps 1e-5 (seed 001)",
            mode="fwd",
            shape=(112, 64, 512, 512),
            dim=1,
            dtype=torch.float32,
            impls=("rownorm", "eager_expr", "compile_expr"),
            kwargs={"eps": 1e-5},
            target_ms_h100=5.15,
            params=(),
        ),
    ),
)

# ---- layer_norm -----------------------------------------------------------------------------


def _ln_eager(dim: int, kw: dict) -> Fn:
    _last_dim(dim, "F.layer_norm")
    eps = kw["eps"]
    return lambda x, w=None, b=None: F.layer_norm(x, (x.shape[-1],), w, b, eps)


LAYER_NORM = OpSpec(
    name="layer_norm",
    make_inputs=_inputs(params=("weight", "bias")),
    reference=_reference("layer_norm"),
    impls=(
        _rownorm_impl("layer_norm", "rownorm.layer_norm(x, w, b, dim, eps)"),
        *_peers("F.layer_norm", "F.layer_norm(x, (N,), w, b, eps)", _ln_eager),
        _liger_impl(
            "layer_norm",
            "liger_layer_norm",
            lambda f, kw: lambda x, w, b: f(x, w, b, kw["eps"]),
            "x, w, b, eps",
        ),
    ),
    fwd_bytes=_rw2,
    fwdbwd_bytes=_rw5,
    fwd_bytes_text=_FWD_TEXT + _PARAM_NOTE,
    fwdbwd_bytes_text=_FWDBWD_TEXT + _PARAM_NOTE,
    kwargs={"eps": 1e-5},
    input_names=("x", "weight", "bias"),
    seeds=(
        Seed(
            title="LayerNorm 10000×768 fp32, weight and bias (seed 004)",
            mode="fwd",
            shape=(10000, 768),
            dim=-1,
            dtype=torch.float32,
            impls=("rownorm", "eager", "compile", "liger"),
            target_ms_h100=0.023,
        ),
    ),
)

# ---- softmax / log_softmax ------------------------------------------------------------------

_SOFTMAX_BWD_TEXT = "5·M·N·b (fwd: read x, write y; bwd: read y, read dy, write dx)"

SOFTMAX = OpSpec(
    name="softmax",
    make_inputs=_randn_inputs,
    reference=_reference("softmax"),
    impls=(
        _rownorm_impl("softmax", "rownorm.softmax(x, dim)"),
        *_peers(
            "softmax", "torch.softmax(x, dim)", lambda dim, kw: lambda x: torch.softmax(x, dim)
        ),
        _liger_impl("softmax", "liger_softmax", lambda f, kw: f),
    ),
    fwd_bytes=_rw2,
    fwdbwd_bytes=_rw5,
    fwd_bytes_text=_FWD_TEXT,
    fwdbwd_bytes_text=_SOFTMAX_BWD_TEXT,
    seeds=(
        Seed(
            title="softmax 100000×32 fp32 (seed 004)",
            mode="fwd",
            shape=(100000, 32),
            dim=-1,
            dtype=torch.float32,
            impls=("rownorm", "eager", "compile", "liger"),
            target_ms_h100=0.011,
        ),
    ),
)

LOG_SOFTMAX = OpSpec(
    name="log_softmax",
    make_inputs=_randn_inputs,
    reference=_reference("log_softmax"),
    impls=(
        _rownorm_impl("log_softmax", "rownorm.log_softmax(x, dim)"),
        *_peers(
            "log_softmax",
            "torch.log_softmax(x, dim)",
            lambda dim, kw: lambda x: torch.log_softmax(x, dim),
        ),
        _liger_impl("log_softmax", None),
    ),
    fwd_bytes=_rw2,
    fwdbwd_bytes=_rw5,
    fwd_bytes_text=_FWD_TEXT,
    fwdbwd_bytes_text=_SOFTMAX_BWD_TEXT,
)

# ---- add_rms_norm ---------------------------------------------------------------------------


def _add_rms_eager(dim: int, kw: dict) -> Fn:
    _last_dim(dim, "add_rms_norm")
    eps = kw["eps"]

    def fn(x, residual, w=None):
        r = x + residual
        return F.rms_norm(r, (r.shape[-1],), w, eps), r

    return fn


def _rw4(m: int, n: int, b: int) -> int:
    return 4 * m * n * b


def _rw8(m: int, n: int, b: int) -> int:
    return 8 * m * n * b


ADD_RMS_NORM = OpSpec(
    name="add_rms_norm",
    make_inputs=_inputs(rows=2, params=("weight",)),
    reference=_reference("add_rms_norm", pass_dim=False),
    impls=(
        _rownorm_impl("add_rms_norm", "rownorm.add_rms_norm(x, residual, w, eps)", pass_dim=False),
        *_peers(
            "x+res, F.rms_norm",
            "r = x + residual; (F.rms_norm(r, (N,), w, eps), r)",
            _add_rms_eager,
        ),
        _liger_impl(
            "add_rms_norm",
            "liger_fused_add_rms_norm",
            lambda f, kw: lambda x, res, w: f(x, res, w, kw["eps"], in_place=False),
            "x, residual, w, eps, in_place=False",
        ),
    ),
    fwd_bytes=_rw4,
    fwdbwd_bytes=_rw8,
    fwd_bytes_text="4·M·N·b (read x and residual, write out and r = x + residual)" + _PARAM_NOTE,
    # Both outputs get a gradient (r feeds the next block's residual stream). The minimum
    # backward reads dout, dr and r (rstd per row is saved) and writes ONE tensor,
    # d(x) = d(residual) = dr + d(rms_norm)/dr: dx and dresidual are the same values.
    fwdbwd_bytes_text="8·M·N·b (fwd: read x and residual, write out and r; bwd: read dout, dr "
    "and r, write d(x) = d(residual) once)" + _PARAM_NOTE,
    kwargs={"eps": 1e-6},
    n_outputs=2,
    input_names=("x", "residual", "weight"),
    output_names=("out", "r"),
    last_dim_only=True,
)

OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        L2_NORMALIZE,
        L1_NORMALIZE,
        MEAN_ABS,
        RMS_NORM,
        LAYER_NORM,
        SOFTMAX,
        LOG_SOFTMAX,
        ADD_RMS_NORM,
    )
}

# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


class Timer:
    """Median time of ``fn`` in ms, L2 flushed before every rep (do_bench's method).

    On CUDA the time is taken with events around ``fn`` alone; ``pre`` (e.g. clearing grads)
    runs before the start event. On CPU it is wall time (for smoke runs only).
    """

    def __init__(self, device: torch.device, flush_bytes: int | None = None) -> None:
        self.device = device
        if flush_bytes is None:
            if device.type == "cuda":
                l2 = torch.cuda.get_device_properties(device).L2_cache_size
                flush_bytes = max(FLUSH_BYTES_MIN, 2 * l2)
            else:
                flush_bytes = 64 << 20
        self.flush_bytes = flush_bytes
        self._flush = torch.empty(flush_bytes // 4, dtype=torch.int32, device=device)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(
        self,
        fn: Callable[[], Any],
        pre: Callable[[], None] | None = None,
        warmup_ms: float = 25.0,
        rep_ms: float = 100.0,
        min_reps: int = 10,
        max_reps: int = 1000,
    ) -> tuple[float, int]:
        pre = pre or (lambda: None)
        pre()
        fn()
        self._sync()
        # Estimate one rep (flush included) to size warm-up and rep counts.
        n_est = 3
        t0 = time.perf_counter()
        for _ in range(n_est):
            self._flush.zero_()
            pre()
            fn()
        self._sync()
        est_ms = max((time.perf_counter() - t0) * 1e3 / n_est, 1e-3)
        n_warmup = max(1, min(int(warmup_ms / est_ms), 100))
        n_reps = max(min_reps, min(int(rep_ms / est_ms), max_reps))
        for _ in range(n_warmup):
            pre()
            fn()
        if self.device.type == "cuda":
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_reps)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_reps)]
            for i in range(n_reps):
                self._flush.zero_()
                pre()
                starts[i].record()
                fn()
                ends[i].record()
            self._sync()
            times = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
        else:
            times = []
            for _ in range(n_reps):
                self._flush.zero_()
                pre()
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), n_reps


def measure_copy_time(timer: Timer, nbytes: int, quick: bool = False) -> tuple[float, int]:
    """Device-to-device copy of ``nbytes`` (``dst.copy_(src)``): (median ms, reps)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=timer.device)
    dst = torch.empty_like(src)
    src.fill_(1)
    return timer(lambda: dst.copy_(src), rep_ms=50.0 if quick else 200.0, min_reps=10)


def measure_copy_bandwidth(timer: Timer, nbytes: int, quick: bool = False) -> tuple[float, float]:
    """Device-to-device copy of ``nbytes``: returns (GB/s counting bytes read + written, ms)."""
    ms, _ = measure_copy_time(timer, nbytes, quick)
    return 2 * nbytes / (ms * 1e6), ms


@dataclasses.dataclass
class SmallCall:
    """One implementation's cost on a tiny input, where the launch path is the whole cost."""

    label: str
    expr: str
    host_us: float  # per call in a loop synchronized once: the host's cost (or the GPU's)
    graph_us: float | None  # per call replayed from a CUDA graph: the GPU work alone


SMALL_CALL_SHAPE = (1, 4096)


def measure_small_calls(device: torch.device, calls: int = 2000) -> list[SmallCall]:
    """rms_norm on a 1×4096 bf16 tensor with a bf16 weight, eager and under a CUDA graph.

    host_us: mean wall time per call over ``calls`` back-to-back calls (one synchronize at the
    end), best of 5 loops; the GPU needs a few µs per call, so this is the host's cost wherever
    that is larger. graph_us: a graph of 100 calls replayed, CUDA events around the replay,
    per call (median of 20 replays)."""
    import torch.nn.functional as F

    import rownorm

    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    x = torch.randn(SMALL_CALL_SHAPE, dtype=torch.bfloat16, device=device, generator=gen)
    w = torch.randn(SMALL_CALL_SHAPE[-1:], dtype=torch.bfloat16, device=device, generator=gen)
    eps = 1e-6
    impls = [
        (
            "torch.ops.rownorm.rms_norm",
            "torch.ops.rownorm.rms_norm(x, w, -1, eps)",
            lambda: torch.ops.rownorm.rms_norm(x, w, -1, eps),
        ),
        (
            "rownorm.rms_norm",
            "rownorm.rms_norm(x, w, eps=eps)",
            lambda: rownorm.rms_norm(x, w, eps=eps),
        ),
        (
            "F.rms_norm",
            "F.rms_norm(x, (4096,), w, eps)",
            lambda: F.rms_norm(x, SMALL_CALL_SHAPE[-1:], w, eps),
        ),
    ]
    out = []
    for label, expr, fn in impls:
        for _ in range(50):
            fn()
        torch.cuda.synchronize(device)
        best = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize(device)
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        graph_us = None
        try:
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(100):
                    fn()
            graph.replay()
            torch.cuda.synchronize(device)
            times = []
            for _ in range(20):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3 / 100)
            graph_us = statistics.median(times)
        except Exception as exc:  # noqa: BLE001  (reported in the table)
            print(f"small calls: {label} under a CUDA graph failed: {_err_text(exc)}", flush=True)
        out.append(SmallCall(label, expr, best, graph_us))
    return out


def _small_call_table(calls: Sequence[SmallCall]) -> list[str]:
    base = next((c for c in calls if c.label == "F.rms_norm"), None)
    lines = [
        "## Small calls — rms_norm on a 1×4096 bf16 tensor (bf16 weight)",
        "",
        "eager: µs per call of 2000 back-to-back calls synchronized once (best of 5 loops): the "
        "host's cost per call (dispatch, checks, allocation, launch); CUDA graph: µs per call "
        "of a captured graph of 100 calls, CUDA events around the replay (the GPU work alone)",
        "",
        "| implementation | eager µs/call | vs F.rms_norm | CUDA graph µs/call |",
        "|---|---:|---:|---:|",
    ]
    for c in calls:
        vs = f"{c.host_us - base.host_us:+.2f} µs" if base is not None else "—"
        graph = f"{c.graph_us:.2f}" if c.graph_us is not None else "failed"
        lines.append(f"| `{c.expr}` | {c.host_us:.2f} | {vs} | {graph} |")
    return lines + [""]


# --------------------------------------------------------------------------------------------
# Correctness
# --------------------------------------------------------------------------------------------


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _row_chunks(shape: Sequence[int], dim: int) -> list[slice]:
    """Slices along dim 0 that keep every reduced row whole (one slice when dim is 0)."""
    if len(shape) < 2 or dim % len(shape) == 0 or shape[0] == 0:
        return [slice(None)]
    per_row = math.prod(shape[1:])
    step = max(1, _CHUNK_ELEMS // max(per_row, 1))
    return [slice(r, min(r + step, shape[0])) for r in range(0, shape[0], step)]


class _ErrAcc:
    """Accumulates ‖a − b‖² and ‖b‖² in float64 over chunks."""

    def __init__(self) -> None:
        self.num = 0.0
        self.den = 0.0

    def add(self, got: torch.Tensor, want: torch.Tensor) -> None:
        want = want.detach().double()
        self.num += torch.linalg.vector_norm(got.detach().double() - want).item() ** 2
        self.den += torch.linalg.vector_norm(want).item() ** 2

    def rel(self, floor: float = 0.0) -> float:
        """‖a − b‖ / max(‖b‖, floor)."""
        if math.isnan(self.num) or math.isnan(self.den):
            return math.nan
        den = max(math.sqrt(self.den), floor)
        return math.sqrt(self.num) / den if den > 0 else math.sqrt(self.num)


def _name(names: Sequence[str], i: int, kind: str) -> str:
    return names[i] if i < len(names) else f"{kind}{i}"


def check_impl(
    spec: OpSpec,
    fn: Fn,
    inputs: Sequence[torch.Tensor],
    dim: int,
    kwargs: dict,
    mode: str,
    dys: Sequence[torch.Tensor] | None = None,
) -> tuple[float, str]:
    """Runs ``fn`` once and compares outputs (and, for fwdbwd, the gradients of every input:
    x, residual, weight, bias) with the float64 reference. Returns (max relative error,
    per-tensor detail).

    Each tensor's error is ‖out − ref‖/‖ref‖. A row-tensor gradient is divided by
    max(‖ref‖, ‖dy‖·‖y‖/‖x‖) instead: that is the gradient's natural scale (the Jacobian of a
    normalization scales like ‖y‖/‖x‖), so a gradient that is zero in exact arithmetic (a row
    of one element) is judged against that scale, not against its own rounding noise.
    """
    x_shape = inputs[0].shape
    diff = [i for i, t in enumerate(inputs) if t.is_floating_point()]
    grads: tuple[torch.Tensor | None, ...] = ()
    if mode == "fwd":
        with torch.no_grad():
            outs = _as_tuple(fn(*inputs))
    else:
        # Fresh leaves, so the timed tensors' .grad is not touched.
        leaves = [t.detach().requires_grad_(i in diff) for i, t in enumerate(inputs)]
        outs = _as_tuple(fn(*leaves))
        if dys is None:
            raise ValueError("check_impl: fwdbwd needs dys")
        grads = torch.autograd.grad(outs, [leaves[i] for i in diff], list(dys), allow_unused=True)
        outs = tuple(o.detach() for o in outs)
        del leaves
    out_acc = [_ErrAcc() for _ in outs]
    row_grad_acc = {j: _ErrAcc() for j, i in enumerate(diff) if inputs[i].shape == x_shape}
    param_ref: dict[int, torch.Tensor] = {}
    scale = {"dy": _ErrAcc(), "y": _ErrAcc(), "x": _ErrAcc()}  # only the .den sums are used

    def pick(t: torch.Tensor, sl: slice) -> torch.Tensor:
        return t[sl] if t.shape == x_shape else t

    for sl in _row_chunks(x_shape, dim):
        t64 = [
            pick(t, sl).detach().double() if t.is_floating_point() else pick(t, sl) for t in inputs
        ]
        if mode == "fwd":
            with torch.no_grad():
                refs = _as_tuple(spec.reference(*t64, dim=dim, **kwargs))
        else:
            for i in diff:
                t64[i].requires_grad_(True)
            refs = _as_tuple(spec.reference(*t64, dim=dim, **kwargs))
        if len(refs) != len(outs):
            raise RuntimeError(f"{spec.name}: {len(outs)} outputs, reference gives {len(refs)}")
        for acc, out, r in zip(out_acc, outs, refs, strict=True):
            acc.add(pick(out, sl), r)
        if mode != "fwd":
            scale["y"].den += torch.linalg.vector_norm(refs[0].detach()).item() ** 2
            scale["x"].den += torch.linalg.vector_norm(t64[0].detach()).item() ** 2
            scale["dy"].den += sum(
                torch.linalg.vector_norm(pick(d, sl).double()).item() ** 2 for d in dys
            )
        if mode != "fwd":
            rgrads = torch.autograd.grad(
                refs, [t64[i] for i in diff], [pick(d, sl).double() for d in dys]
            )
            for j in range(len(diff)):
                if j in row_grad_acc:
                    g = grads[j]
                    row_grad_acc[j].add(
                        pick(g, sl) if g is not None else torch.zeros_like(rgrads[j]), rgrads[j]
                    )
                else:  # parameter gradients are sums over rows: add up the chunks
                    param_ref[j] = rgrads[j] if j not in param_ref else param_ref[j] + rgrads[j]
        del t64, refs
    errs: list[tuple[str, float]] = []
    for k, acc in enumerate(out_acc):
        errs.append((_name(spec.output_names, k, "out"), acc.rel()))
    for j, i in enumerate(diff if mode != "fwd" else ()):
        name = "d" + _name(spec.input_names, i, "input")
        if j in row_grad_acc:
            x_norm = math.sqrt(scale["x"].den)
            floor = (math.sqrt(scale["dy"].den * scale["y"].den) / x_norm) if x_norm > 0 else 0.0
            errs.append((name, row_grad_acc[j].rel(floor)))
        elif j in param_ref:
            acc = _ErrAcc()
            g = grads[j]
            acc.add(g if g is not None else torch.zeros_like(param_ref[j]), param_ref[j])
            errs.append((name, acc.rel()))
    worst = math.nan if any(math.isnan(e) for _, e in errs) else max(e for _, e in errs)
    return worst, ", ".join(f"{n} {e:.1e}" for n, e in errs)


# --------------------------------------------------------------------------------------------
# Configurations and results
# --------------------------------------------------------------------------------------------


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
        f = self.spec.fwd_bytes if self.mode == "fwd" else self.spec.fwdbwd_bytes
        return f(self.m, self.n, self.elem)

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


class _Terminated(KeyboardInterrupt):
    """SIGTERM (e.g. from `timeout`): stop, but still write what was measured."""


def _on_sigterm(signum, frame) -> None:
    raise _Terminated()


def _is_fatal_device_error(err: BaseException) -> bool:
    """A sticky CUDA error (illegal address, ...) poisons the context: nothing after it runs."""
    accel = getattr(torch, "AcceleratorError", None)
    if accel is not None and isinstance(err, accel):
        return True
    text = str(err)
    return "CUDA error" in text and "out of memory" not in text


def _err_text(exc: BaseException) -> str:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first[:200]}"


def _free(device: torch.device, full: bool = False) -> None:
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
    return copies * cfg.spec.n_outputs * x + 6 * _CHUNK_ELEMS * 8


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
                    _free(self.device, full=True)
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
                _free(self.device, full=True)
            finally:
                _free(self.device)

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
        for impl in cfg.impls:
            done += 1
            tag = f"[{done:>{width}}/{total}] {cfg.describe()} {impl.name}"
            if self.aborted:
                self._skip(cfg, impl, self.aborted)
                continue
            if self.remaining_s() < self.args.reserve_s:
                self._skip(cfg, impl, "time budget exhausted")
                print(f"{tag}: skipped (time budget)", flush=True)
                continue
            try:
                res = self._measure(cfg, impl, inputs, dys)
            except torch.cuda.OutOfMemoryError as exc:
                res = self._result(
                    cfg,
                    impl,
                    None,
                    None,
                    "skipped",
                    "out of memory: " + _err_text(exc)[len("OutOfMemoryError: ") :][:120],
                )
            except Exception as exc:  # noqa: BLE001  (reported, not hidden)
                res = self._result(cfg, impl, None, None, "error", _err_text(exc))
                if _is_fatal_device_error(exc):
                    self.aborted = f"aborted after a CUDA error in {impl.name}"
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
            if self.aborted:
                print(f"    {self.aborted}: nothing more can run in this process", flush=True)
            if res.status == "skipped":
                _free(self.device, full=True)  # after an OOM, before the next implementation
        del inputs, dys
        if cfg.seed is not None and not self.aborted and self.remaining_s() >= self.args.reserve_s:
            self.add(self._same_bytes_copy(cfg))
        return done

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

    def _measure(
        self, cfg: Config, impl: Impl, inputs: list[torch.Tensor], dys: list[torch.Tensor] | None
    ) -> Result:
        """Checks one implementation against the reference, then times it if it passed.

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
        else:
            ms = self._time(cfg, fn, inputs, dys)
            res = self._result(cfg, impl, ms, err, "ok" if passed else "FAIL", note)
        res.setup_s = setup_s
        res.wall_s = time.perf_counter() - t0
        return res

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _time(
        self, cfg: Config, fn: Fn, inputs: list[torch.Tensor], dys: list[torch.Tensor] | None
    ) -> float:
        args = self.args
        return time_impl(
            self._timer(),
            fn,
            inputs,
            cfg.mode,
            dys,
            warmup_ms=args.warmup_ms,
            rep_ms=args.rep_ms,
            min_reps=args.min_reps,
        )


def time_impl(
    timer: Timer,
    fn: Fn,
    inputs: Sequence[torch.Tensor],
    mode: str,
    dys: Sequence[torch.Tensor] | None = None,
    **timer_kw: Any,
) -> float:
    """Median ms of ``fn(*inputs)`` (fwd, under no_grad) or of a training step (fwdbwd):
    ``fn`` then ``torch.autograd.grad(outputs, inputs, dys)``, the gradient of every floating
    input (x, residual, weight, bias). The gradients are returned, not accumulated into
    ``.grad``, so no accumulation kernel (nor the copy autograd makes when one gradient tensor
    feeds two leaves, as add_rms_norm's d(x) = d(residual)) is timed."""
    if mode == "fwd":
        with torch.no_grad():
            return timer(lambda: fn(*inputs), **timer_kw)[0]
    if dys is None:
        raise ValueError("time_impl: fwdbwd needs dys")
    leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
    grad_leaves = [t for t in leaves if t.requires_grad]
    grad_outputs = list(dys)

    def step() -> None:
        torch.autograd.grad(_as_tuple(fn(*leaves)), grad_leaves, grad_outputs)

    return timer(step, **timer_kw)[0]


# --------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------


def _short(dtype_name: str) -> str:
    return SHORT_DTYPE.get(getattr(torch, dtype_name, None), dtype_name)


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:g} MiB"


def _num(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _cell(r: Result | None) -> str:
    if r is None:
        return "—"
    if r.status == "ok":
        return f"{_num(r.gbps)} ({r.pct:.0f}%)" if r.pct is not None else _num(r.gbps)
    if r.status == "FAIL":
        err = f"err {r.rel_err:.0e}" if r.rel_err is not None else ""
        timed = f", {_num(r.gbps)} GB/s" if r.gbps else ""
        return f"FAIL ({err}{timed})"
    return r.status


def _ms(v: float) -> str:
    """Milliseconds with 3–4 significant digits: 6.05, 0.0140."""
    return f"{v:.2f}" if v >= 1 else f"{v:.3f}" if v >= 0.1 else f"{v:.4f}"


def _ms_cell(r: Result | None) -> str:
    if r is None:
        return "—"
    if r.status == "ok":
        return f"{_ms(r.ms)} ({r.pct:.0f}%)" if r.pct is not None else _ms(r.ms)
    return _cell(r)


def _impl_meta(op: str) -> dict[str, Impl]:
    spec = OPS.get(op)
    return {i.name: i for i in spec.impls} if spec else {}


def _is_ours(r: Result) -> bool:
    impl = _impl_meta(r.op).get(r.impl)
    return impl is not None and impl.family == "rownorm"


def _label(op: str, impl: str) -> str:
    meta = _impl_meta(op).get(impl)
    return meta.label if meta else impl


def _ordered_impls(op: str, results: Sequence[Result]) -> list[str]:
    present = {r.impl for r in results}
    order = list(_impl_meta(op))
    return [n for n in order if n in present] + sorted(present - set(order))


def _best_peer(by_impl: dict[str, Result]) -> tuple[Result | None, Result | None]:
    """(rownorm's result, the fastest correct peer's result) of one configuration."""
    ours = next((r for r in by_impl.values() if _is_ours(r)), None)
    ok = [
        r
        for r in by_impl.values()
        if not _is_ours(r) and r.impl != SAME_BYTES_COPY and r.status == "ok" and r.ms
    ]
    return ours, min(ok, key=lambda r: r.ms) if ok else None


def _vs(ours: Result | None, best: Result | None) -> str:
    """rownorm's speed-up over the best peer (> 1: rownorm is faster)."""
    if ours is None or best is None or ours.status != "ok" or not ours.ms:
        return "—"
    return f"{best.ms / ours.ms:.2f}×"


def _grid_table(op: str, mode: str, rows: Sequence[Result]) -> list[str]:
    spec = OPS.get(op)
    formula = ""
    if spec:
        formula = spec.fwd_bytes_text if mode == "fwd" else spec.fwdbwd_bytes_text
    title = "forward" if mode == "fwd" else "forward + backward"
    impls = _ordered_impls(op, rows)
    heads = " | ".join(_label(op, i) for i in impls)
    lines = [
        f"## {op} — {title}",
        "",
        f"bytes = {formula}; cells: GB/s (% of the copy limit)",
        "",
        f"| N | dtype | M | {heads} | best peer | rownorm vs best |",
        "|---:|---|---:|" + "---|" * len(impls) + "---|---:|",
    ]
    dtypes = list(dict.fromkeys(r.dtype for r in rows))
    keys = sorted(
        dict.fromkeys((r.dtype, r.N, r.M) for r in rows),
        key=lambda k: (dtypes.index(k[0]), k[1]),
    )
    for dt, n, m in keys:
        by = {r.impl: r for r in rows if (r.dtype, r.N, r.M) == (dt, n, m)}
        ours, best = _best_peer(by)
        best_txt = f"{_label(op, best.impl)} {_num(best.gbps)}" if best else "—"
        cells = " | ".join(_cell(by.get(i)) for i in impls)
        lines.append(f"| {n} | {_short(dt)} | {m} | {cells} | {best_txt} | {_vs(ours, best)} |")
    return lines + [""]


def _seed_table(op: str, rows: Sequence[Result], copy_gbps: float | None) -> list[str]:
    spec = OPS.get(op)
    targets = {s.title: s.target_ms_h100 for s in spec.seeds} if spec else {}
    impls = [i for i in _ordered_impls(op, rows) if i != SAME_BYTES_COPY]
    heads = " | ".join(_label(op, i) for i in impls)
    lines = [
        f"## {op} — the seeds' workloads",
        "",
        "cells: ms (% of the copy limit); copy limit = bytes / copy bandwidth; same-size "
        "copy = `dst.copy_(src)` moving the workload's bytes, timed like the ops (launch and "
        "ramp included: the floor for a small workload)",
        "",
        f"| workload | bytes | copy limit | same-size copy | {heads} | target (H100) "
        "| rownorm vs best |",
        "|---|---:|---:|---:|" + "---:|" * len(impls) + "---:|---:|",
    ]
    for wl in dict.fromkeys(r.workload for r in rows):
        by = {r.impl: r for r in rows if r.workload == wl}
        nbytes = next(iter(by.values())).nbytes
        limit = _ms(nbytes / (copy_gbps * 1e6)) if copy_gbps else "—"
        same = by.get(SAME_BYTES_COPY)
        same_cell = _ms(same.ms) if same is not None and same.ms else "—"
        ours, best = _best_peer(by)
        tgt = targets.get(wl)
        cells = " | ".join(_ms_cell(by.get(i)) for i in impls)
        lines.append(
            f"| {wl} | {nbytes / 1e9:.3g} GB | {limit} | {same_cell} | {cells} | "
            f"{f'≤ {_ms(tgt)}' if tgt else '—'} | {_vs(ours, best)} |"
        )
    return lines + [""]


def _time_spent(results: Sequence[Result]) -> str:
    """Where the run's time went, per implementation family (to plan --time-budget)."""
    fams: dict[str, list[float]] = {}
    for r in results:
        if r.wall_s is None:
            continue
        meta = _impl_meta(r.op).get(r.impl)
        acc = fams.setdefault(meta.family if meta else r.impl, [0.0, 0.0, 0])
        acc[0] += r.setup_s or 0.0
        acc[1] += r.wall_s
        acc[2] += 1
    if not fams:
        return ""
    parts = [
        f"{fam} {v[0]:.0f} s / {v[1]:.0f} s ({v[2]})"
        for fam, v in sorted(
            fams.items(), key=lambda kv: FAMILIES.index(kv[0]) if kv[0] in FAMILIES else 9
        )
    ]
    return (
        "time per family, setup (make + first call + check: torch.compile, Triton JIT, the "
        "float64 reference) / whole measurement (measurements): " + ", ".join(parts)
    )


def _is_bulk_skip(note: str) -> bool:
    return note == "time budget exhausted" or note.startswith("aborted")


def render_markdown(results: Sequence[Result], info: RunInfo) -> str:
    """The report: run facts, one table per op × mode, the seeds' workloads, notes."""
    build = info.build
    copy = f"**{info.copy_gbps:.0f} GB/s**" if info.copy_gbps else "not measured"
    lines = [
        f"# rownorm benchmark — {info.device_name}",
        "",
        f"- command: `{info.command}`",
        f"- started {info.started}, took {info.duration_s:.0f} s; torch {info.torch_version}, "
        f"CUDA {info.cuda_version}; rownorm {build.get('version', '?')} "
        f"rev {build.get('revision', '?')} (arch {build.get('arch_list', '?')})",
        f"- copy limit: {copy} (`dst.copy_(src)` of {_size(info.copy_bytes)}, bytes read + "
        "written, same run)",
        f"- time: median over reps, {info.timer}; the cache flushed before every rep by "
        f"writing {_size(info.flush_bytes)}",
        "- every implementation is checked against the float64 reference first "
        "(‖out − ref‖/‖ref‖ ≤ 1e-5 fp32, 1e-2 bf16/fp16, outputs and the gradients of x and "
        "of every parameter); one that fails is shown as FAIL and not timed",
        "- fwd: the op under no_grad; fwd+bwd: the op, then the gradients of x (and residual) "
        "and of weight/bias (torch.autograd.grad), as in a training step",
        "- b = bytes per element; M rows of N elements, reduced over N",
    ]
    if info.peers:
        lines.append(f"- peers: {info.peers}")
    spent = _time_spent(results)
    if spent:
        lines.append(f"- {spent}")
    lines.append("")
    order = list(OPS)
    ops = sorted(
        dict.fromkeys(r.op for r in results),
        key=lambda o: (o not in OPS, order.index(o) if o in OPS else 0),
    )
    for op in ops:
        op_rows = [r for r in results if r.op == op]
        grid = [r for r in op_rows if r.workload == "grid"]
        for mode in dict.fromkeys(r.mode for r in grid):
            lines += _grid_table(op, mode, [r for r in grid if r.mode == mode])
        seeds = [r for r in op_rows if r.workload != "grid"]
        if seeds:
            lines += _seed_table(op, seeds, info.copy_gbps)
        meta = _impl_meta(op)
        named = [i for i in _ordered_impls(op, op_rows) if i in meta]
        if named:
            lines += ["Implementations:", ""]
            lines += [f"- {meta[i].label}: `{meta[i].expr}`" for i in named]
            lines.append("")
    if info.small_calls:
        lines += _small_call_table(info.small_calls)
    problems = [r for r in results if r.status != "ok"]
    if problems or info.notes:
        lines += ["## Notes", ""]
        lines += [f"- {n}" for n in info.notes]
        bulk = [r for r in problems if r.status == "skipped" and _is_bulk_skip(r.note)]
        for note in dict.fromkeys(r.note for r in bulk):
            count = sum(r.note == note for r in bulk)
            lines.append(f"- {count} measurement(s) skipped: {note}")
        problems = [r for r in problems if r not in bulk]
        grouped: dict[tuple[str, str, str], list[str]] = {}
        for r in problems:
            where = f"{r.op} {r.mode} {_short(r.dtype)} M={r.M} N={r.N}"
            if r.workload != "grid":
                where = f"{r.op} [{r.workload}]"
            grouped.setdefault((where, r.status, r.note), []).append(r.impl)
        for (where, status, note), impls in grouped.items():
            why = f" — {note}" if note else ""
            lines.append(f"- {where}, {', '.join(impls)}: {status}{why}")
        lines.append("")
    return "\n".join(lines)


def write_plots(results: Sequence[Result], info: RunInfo, out_dir: str) -> list[str]:
    """One PNG per op: GB/s vs N, one line per implementation, one panel per mode × dtype."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not importable: no plots written", flush=True)
        return []
    written = []
    for op in dict.fromkeys(r.op for r in results):
        rows = [r for r in results if r.op == op and r.workload == "grid"]
        if not rows:
            continue
        modes = list(dict.fromkeys(r.mode for r in rows))
        dtypes = list(dict.fromkeys(r.dtype for r in rows))
        fig, axes = plt.subplots(
            len(modes), len(dtypes), figsize=(6.5 * len(dtypes), 4.2 * len(modes)), squeeze=False
        )
        for a, mode in enumerate(modes):
            for b, dt in enumerate(dtypes):
                ax = axes[a][b]
                sub = [r for r in rows if r.mode == mode and r.dtype == dt]
                for impl in _ordered_impls(op, sub):
                    pts = sorted(
                        (r.N, r.gbps) for r in sub if r.impl == impl and r.gbps and r.status == "ok"
                    )
                    if not pts:
                        continue
                    is_ours = any(_is_ours(r) for r in sub if r.impl == impl)
                    ax.plot(
                        [p[0] for p in pts],
                        [p[1] for p in pts],
                        marker="o",
                        linewidth=2.5 if is_ours else 1.3,
                        label=_label(op, impl),
                    )
                if info.copy_gbps:
                    ax.axhline(
                        info.copy_gbps,
                        color="black",
                        linestyle="--",
                        linewidth=1,
                        label=f"copy limit {info.copy_gbps:.0f}",
                    )
                ax.set_xscale("log", base=2)
                ns = sorted({r.N for r in sub})
                # 65535 and 65536 share one tick position on a log axis: label the power of 2.
                labels = ["" if n + 1 in ns and (n + 1) & n == 0 else str(n) for n in ns]
                ax.set_xticks(ns, labels, fontsize=8)
                ax.minorticks_off()
                ax.set_xlabel("N (row length)")
                ax.set_ylabel("GB/s")
                ax.set_ylim(bottom=0)
                ax.set_title(f"{op} {'fwd' if mode == 'fwd' else 'fwd+bwd'} {_short(dt)}")
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize=8, loc="best")
        fig.suptitle(f"rownorm {op} — {info.device_name}", fontsize=11)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{op}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def write_reports(
    results: Sequence[Result],
    info: RunInfo,
    out_dir: str,
    command_file: bool = True,
    csv_path: str | None = None,
) -> list[str]:
    """Writes results.md, the plots and COMMAND.txt (and results.csv unless it was streamed)."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    if csv_path is None:
        csv_path = os.path.join(out_dir, "results.csv")
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            w.writeheader()
            for r in results:
                w.writerow(r.csv_row())
    written.append(csv_path)
    md = os.path.join(out_dir, "results.md")
    with open(md, "w") as f:
        f.write(render_markdown(results, info))
    written.append(md)
    written += write_plots(results, info, out_dir)
    if command_file:
        path = os.path.join(out_dir, "COMMAND.txt")
        with open(path, "w") as f:
            f.write(info.command + "\n")
        written.append(path)
    return written


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def device_slug(device: torch.device) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; the results folder name."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device)
    m = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Za-z]?)\b", name.replace("NVIDIA", ""))
    if m:
        return m.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def _csv_list(kind: Callable[[str], Any]) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            return [kind(t.strip()) for t in text.split(",") if t.strip()]
        except (ValueError, KeyError) as err:
            raise argparse.ArgumentTypeError(f"bad value in {text!r}: {err}") from err

    return parse


def _dtype(name: str) -> torch.dtype:
    try:
        return DTYPE_ALIASES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (one of {', '.join(DTYPE_ALIASES)})") from None


def _int_expr(text: str) -> int:
    """'65536', '2**16', '1<<16' or '64k'."""
    t = text.lower().replace("_", "")
    if re.fullmatch(r"\d+", t):
        return int(t)
    if m := re.fullmatch(r"(\d+)\*\*(\d+)", t):
        return int(m.group(1)) ** int(m.group(2))
    if m := re.fullmatch(r"(\d+)<<(\d+)", t):
        return int(m.group(1)) << int(m.group(2))
    if m := re.fullmatch(r"(\d+)([km])", t):
        return int(m.group(1)) * (1024 if m.group(2) == "k" else 1024 * 1024)
    raise ValueError(f"not an integer: {text!r}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m rownorm.bench",
        description="Bandwidth benchmark of the rownorm ops against eager PyTorch, "
        "torch.compile and Liger (correctness checked first).",
    )
    p.add_argument(
        "--ops",
        type=_csv_list(str),
        default=None,
        help=f"ops to run (default: all: {','.join(OPS)}; an op whose grid is off by default "
        "(mean_abs: the same kernel as l1_normalize) runs its grid only when named here)",
    )
    p.add_argument(
        "--dtypes",
        type=_csv_list(_dtype),
        default=None,
        help="dtypes of the grid (default float32,bfloat16)",
    )
    p.add_argument(
        "--ns",
        type=_csv_list(_int_expr),
        default=None,
        help=f"row lengths N (default {','.join(map(str, GRID_NS))}; "
        f"--quick: {','.join(map(str, QUICK_NS))}); {','.join(map(str, FIRST_ROUND_NS))} are "
        "measured first for every op, then the others",
    )
    p.add_argument(
        "--modes", type=_csv_list(str), default=list(MODES), help="fwd and/or fwdbwd (default both)"
    )
    p.add_argument(
        "--impls",
        type=_csv_list(str),
        default=list(FAMILIES),
        help="families (rownorm,eager,compile,liger) or implementation names "
        "(e.g. compile_norm); default all families",
    )
    p.add_argument(
        "--elems",
        type=_int_expr,
        default=None,
        help="M·N elements per grid point (default 2**28; --quick 2**26); M = ceil(elems / N)",
    )
    p.add_argument("--out", default=None, help="output folder (default benchmarks/results/<gpu>)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="small grid (N 1024,4096,65535; 2**26 elements), short timing, no seeds",
    )
    p.add_argument(
        "--seeds",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the seeds' workloads (default: on, off with --quick)",
    )
    p.add_argument("--seeds-only", action="store_true", help="only the seeds' workloads")
    p.add_argument(
        "--small-calls",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure the per-call cost of rms_norm on a 1×4096 bf16 tensor, eager and under "
        "a CUDA graph, against F.rms_norm (default: on, off with --quick; CUDA only)",
    )
    p.add_argument("--device", default=None, help="cuda (default when available), cuda:1, cpu")
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="S",
        help="stop starting new measurements after S seconds (results so far written)",
    )
    p.add_argument(
        "--reserve-s",
        type=float,
        default=10.0,
        help="with --time-budget: do not start a measurement with less than this left",
    )
    p.add_argument(
        "--warmup-ms", type=float, default=None, help="warm-up time per measurement (default 10)"
    )
    p.add_argument(
        "--rep-ms", type=float, default=None, help="timed time per measurement (default 50)"
    )
    p.add_argument("--min-reps", type=int, default=10, help="at least this many timed reps")
    p.add_argument(
        "--max-mem-gb",
        type=float,
        default=None,
        help="skip configurations estimated to need more device memory",
    )
    p.add_argument(
        "--time-failing",
        action="store_true",
        help="also time implementations that fail the correctness check",
    )
    p.add_argument(
        "--command-file",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write COMMAND.txt beside the results (default on)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed of the inputs")
    p.add_argument("--list", action="store_true", help="list ops and implementations, then exit")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the configurations that would run (after probing the peers), then exit",
    )
    args = p.parse_args(argv)

    args.ops_named = list(args.ops or ())
    args.ops = args.ops or list(OPS)
    for op in args.ops:
        if op not in OPS:
            p.error(f"unknown op {op!r}; known: {', '.join(OPS)}")
    for mode in args.modes:
        if mode not in MODES:
            p.error(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    known = set(FAMILIES) | {i.name for s in OPS.values() for i in s.impls}
    for name in args.impls:
        if name not in known:
            p.error(f"unknown implementation {name!r}; known: {', '.join(sorted(known))}")
    args.dtypes = args.dtypes or [torch.float32, torch.bfloat16]
    args.ns = args.ns or list(QUICK_NS if args.quick else GRID_NS)
    if any(n < 1 for n in args.ns):
        p.error("--ns: every N must be >= 1")
    args.elems = args.elems or (QUICK_ELEMS if args.quick else GRID_ELEMS)
    if args.seeds is None:
        args.seeds = not args.quick or args.seeds_only
    if args.small_calls is None:
        args.small_calls = not args.quick
    if args.seeds_only:
        args.seeds = True
    # Modest on purpose: every op × N × dtype × mode × implementation is one measurement, and
    # a median of ≥ 50 reps of a ≥ 0.3 ms op is stable to about 1%.
    if args.warmup_ms is None:
        args.warmup_ms = 5.0 if args.quick else 10.0
    if args.rep_ms is None:
        args.rep_ms = 25.0 if args.quick else 50.0
    return args


def _command_line(argv: Sequence[str] | None) -> str:
    args = list(sys.argv[1:] if argv is None else argv)
    return "python -m rownorm.bench " + " ".join(shlex.quote(a) for a in args)


def list_ops() -> str:
    lines = []
    for spec in OPS.values():
        lines.append(
            f"{spec.name}  (fwd bytes {spec.fwd_bytes_text}; fwd+bwd bytes "
            f"{spec.fwdbwd_bytes_text})"
        )
        for i in spec.impls:
            extra = "" if i.grid else "  [seeds / when named]"
            lines.append(f"  {i.name:<16} {i.family:<8} {i.expr}{extra}")
        for s in spec.seeds:
            lines.append(f"  seed: {s.title} ({s.mode})")
        if not spec.default_grid:
            lines.append("  (grid only when named in --ops)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, command: str | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        print(list_ops())
        return 0
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)  # CUDA events record on the current device's stream
    if device.type == "cpu":
        print(
            "warning: no CUDA device; timing on the CPU with wall time (smoke runs only)",
            flush=True,
        )
    out_dir = args.out or os.path.join("benchmarks", "results", device_slug(device))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    info = RunInfo(
        device_name=name,
        copy_gbps=None,
        command=command or _command_line(argv),
        started=datetime.datetime.now().isoformat(timespec="seconds"),
        build=build_info(),
        ops=list(args.ops),
    )
    specs = [OPS[o] for o in args.ops]
    unavailable = probe_impls(specs, args.impls, device)
    for (op, impl), why in unavailable.items():
        print(f"{op} {impl}: not run ({why})", flush=True)
    configs = build_configs(args, specs, unavailable)
    n_meas = sum(len(c.impls) for c in configs)
    if args.dry_run:
        for cfg in configs:
            where = "" if cfg.workload == "grid" else f"  [{cfg.workload}]"
            print(f"  {cfg.describe()}: {', '.join(i.name for i in cfg.impls)}{where}")
        print(f"{len(configs)} configurations, {n_meas} measurements")
        return 0
    os.makedirs(out_dir, exist_ok=True)
    info.peers = peer_versions()
    print(
        f"rownorm.bench on {name}: {len(configs)} configurations, {n_meas} measurements "
        f"-> {out_dir}",
        flush=True,
    )
    runner = Runner(args, device, info)
    runner.open_csv(os.path.join(out_dir, "results.csv"))
    old_handler = signal.signal(signal.SIGTERM, _on_sigterm)
    interrupted = False
    t0 = time.monotonic()
    try:
        runner.timer = Timer(device)
        info.flush_bytes = runner.timer.flush_bytes
        nbytes = COPY_BYTES_CUDA if device.type == "cuda" else COPY_BYTES_CPU
        info.copy_bytes = nbytes
        if device.type != "cuda":
            info.timer = "wall time (CPU)"
        info.copy_gbps, copy_ms = measure_copy_bandwidth(runner.timer, nbytes, args.quick)
        print(
            f"copy limit: {info.copy_gbps:.0f} GB/s ({nbytes >> 20} MiB copy in {copy_ms:.3f} ms)",
            flush=True,
        )
        _free(device)
        if args.small_calls and device.type == "cuda":
            info.small_calls = measure_small_calls(device)
            for line in _small_call_table(info.small_calls)[4:]:
                print(line, flush=True)
        runner.run(configs)
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: writing the results measured so far", flush=True)
        info.notes.append("run interrupted (SIGTERM or Ctrl-C): later measurements missing")
    finally:
        signal.signal(signal.SIGTERM, old_handler)
        runner.close_csv()
        info.duration_s = time.monotonic() - t0
        for (op, impl), why in unavailable.items():
            info.notes.append(f"{op} {impl}: not run ({why})")
        if runner.aborted:
            info.notes.append(runner.aborted)
        if device.type == "cpu":
            info.notes.append("CPU wall-time smoke run: the numbers say nothing about GPUs")
        paths = write_reports(
            runner.results,
            info,
            out_dir,
            args.command_file,
            csv_path=os.path.join(out_dir, "results.csv"),
        )
        print("wrote " + ", ".join(paths), flush=True)
    bad = [r for r in runner.results if r.status in ("FAIL", "error") and _is_ours(r)]
    peers_bad = [r for r in runner.results if r.status in ("FAIL", "error") and r not in bad]
    if peers_bad:
        print(
            f"{len(peers_bad)} peer measurement(s) failed or errored (see results.md Notes)",
            flush=True,
        )
    if bad:
        print(f"rownorm FAILED {len(bad)} check(s):", flush=True)
        for r in bad:
            print(f"  {r.op} {r.mode} {r.dtype} M={r.M} N={r.N}: {r.status} {r.note}", flush=True)
        return 1
    return 143 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
