"""The benchmark's op table: for each op, its inputs, implementations, byte formulas, float64
reference and the seeds' fixed workloads.

Adding an op = one :class:`OpSpec` in :data:`OPS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from rownorm import reference as ref_impl
from rownorm.bench.impls import (
    Fn,
    Impl,
    eager_and_compiled,
    last_dim,
    liger_impl,
    rownorm_impl,
)

MODES = ("fwd", "fwdbwd")
SHORT_DTYPE = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float64: "fp64",
}


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
    - ``nbytes(mode, M, N, elem)``: minimum traffic in bytes, with M = rows, N = x.size(dim),
      elem = bytes per element (weights, biases and their gradients, N elements each, are not
      counted).
    """

    name: str
    make_inputs: Callable[..., list[torch.Tensor]]
    reference: Callable[..., Any]
    impls: tuple[Impl, ...]
    # Minimum traffic as a count of M×N tensors read or written once (the bytes are that times
    # M·N·b), and the formula as the report prints it.
    fwd_tensors: int
    fwdbwd_tensors: int
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

    def nbytes(self, mode: str, m: int, n: int, elem: int) -> int:
        tensors = self.fwd_tensors if mode == "fwd" else self.fwdbwd_tensors
        return tensors * m * n * elem

    def fwd_bytes(self, m: int, n: int, elem: int) -> int:
        return self.nbytes("fwd", m, n, elem)

    def fwdbwd_bytes(self, m: int, n: int, elem: int) -> int:
        return self.nbytes("fwdbwd", m, n, elem)

    def bytes_text(self, mode: str) -> str:
        return self.fwd_bytes_text if mode == "fwd" else self.fwdbwd_bytes_text


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
_eager_norm, _compile_norm = eager_and_compiled("x/norm", _L2_EXPR_NORM, _l2_eager_norm, "_norm")
_eager_normalize, _compile_normalize = eager_and_compiled(
    "F.normalize", _L2_EXPR, _l2_eager_normalize
)

L2_NORMALIZE = OpSpec(
    name="l2_normalize",
    make_inputs=_randn_inputs,
    reference=_reference("l2_normalize"),
    impls=(
        rownorm_impl("l2_normalize", "rownorm.l2_normalize(x, dim, eps)"),
        _eager_norm,
        dataclasses.replace(_eager_normalize, name="eager_normalize"),
        _compile_normalize,
        dataclasses.replace(_compile_norm, grid=False),
        liger_impl("l2_normalize", None),
    ),
    fwd_tensors=2,
    fwdbwd_tensors=5,
    fwd_bytes_text=_FWD_TEXT,
    fwdbwd_bytes_text=_FWDBWD_TEXT,
    kwargs={"eps": 1e-12},
    baseline="eager_normalize",
    # The seeds' `x / torch.norm(x, p=2, dim=1, keepdim=True)`: eps = 0.
    seeds=tuple(
        Seed(
            title=title,
            mode=mode,
            shape=shape,
            dim=1,
            dtype=torch.float32,
            impls=("rownorm", "eager_norm", "eager_normalize", "compile_norm", "compile"),
            kwargs={"eps": 0.0},
        )
        for title, mode, shape in (
            ("L2 normalize dim=1, 32768×65535 fp32 (seeds 000/002)", "fwd", (32768, 65535)),
            ("L2 normalize dim=1 fwd+bwd, 16384×65535 fp32", "fwdbwd", (16384, 65535)),
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
        rownorm_impl("l1_normalize", "rownorm.l1_normalize(x, dim, eps)"),
        *eager_and_compiled("F.normalize(p=1)", "F.normalize(x, p=1, dim=dim, eps=eps)", _l1_eager),
        liger_impl("l1_normalize", None),
    ),
    fwd_tensors=2,
    fwdbwd_tensors=5,
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
        rownorm_impl("l1_normalize", "rownorm.l1_normalize(x, dim, eps=0, mean=True)"),
        *eager_and_compiled(
            "x/mean|x|", "x / torch.mean(torch.abs(x), dim=dim, keepdim=True)", _mean_abs_eager
        ),
        liger_impl("mean_abs", None),
    ),
    fwd_tensors=2,
    fwdbwd_tensors=5,
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
        ),
    ),
)

# ---- rms_norm -------------------------------------------------------------------------------


def _rms_eager(dim: int, kw: dict) -> Fn:
    last_dim(dim, "F.rms_norm")
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
        rownorm_impl("rms_norm", "rownorm.rms_norm(x, w, dim, eps)"),
        *eager_and_compiled("F.rms_norm", "F.rms_norm(x, (N,), w, eps)", _rms_eager),
        *eager_and_compiled(
            "x/sqrt(mean(x²)+eps)",
            "x / torch.sqrt(torch.mean(x ** 2, dim=dim, keepdim=True) + eps) [* w]",
            _rms_eager_expr,
            suffix="_expr",
            grid=False,
        ),
        liger_impl(
            "rms_norm",
            "liger_rms_norm",
            lambda f, kw: lambda x, w: f(x, w, kw["eps"], in_place=False),
            "x, w, eps, in_place=False",
        ),
    ),
    fwd_tensors=2,
    fwdbwd_tensors=5,
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
            params=(),
        ),
    ),
)

# ---- layer_norm -----------------------------------------------------------------------------


def _ln_eager(dim: int, kw: dict) -> Fn:
    last_dim(dim, "F.layer_norm")
    eps = kw["eps"]
    return lambda x, w=None, b=None: F.layer_norm(x, (x.shape[-1],), w, b, eps)


LAYER_NORM = OpSpec(
    name="layer_norm",
    make_inputs=_inputs(params=("weight", "bias")),
    reference=_reference("layer_norm"),
    impls=(
        rownorm_impl("layer_norm", "rownorm.layer_norm(x, w, b, dim, eps)"),
        *eager_and_compiled("F.layer_norm", "F.layer_norm(x, (N,), w, b, eps)", _ln_eager),
        liger_impl(
            "layer_norm",
            "liger_layer_norm",
            lambda f, kw: lambda x, w, b: f(x, w, b, kw["eps"]),
            "x, w, b, eps",
        ),
    ),
    fwd_tensors=2,
    fwdbwd_tensors=5,
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
        rownorm_impl("softmax", "rownorm.softmax(x, dim)"),
        *eager_and_compiled(
            "softmax", "torch.softmax(x, dim)", lambda dim, kw: lambda x: torch.softmax(x, dim)
        ),
        liger_impl("softmax", "liger_softmax", lambda f, kw: f),
    ),
    fwd_tensors=2,
    fwdbwd_tensors=5,
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
        ),
    ),
)

LOG_SOFTMAX = OpSpec(
    name="log_softmax",
    make_inputs=_randn_inputs,
    reference=_reference("log_softmax"),
    impls=(
        rownorm_impl("log_softmax", "rownorm.log_softmax(x, dim)"),
        *eager_and_compiled(
            "log_softmax",
            "torch.log_softmax(x, dim)",
            lambda dim, kw: lambda x: torch.log_softmax(x, dim),
        ),
        liger_impl("log_softmax", None),
    ),
    fwd_tensors=2,
    fwdbwd_tensors=5,
    fwd_bytes_text=_FWD_TEXT,
    fwdbwd_bytes_text=_SOFTMAX_BWD_TEXT,
)

# ---- add_rms_norm ---------------------------------------------------------------------------


def _add_rms_eager(dim: int, kw: dict) -> Fn:
    last_dim(dim, "add_rms_norm")
    eps = kw["eps"]

    def fn(x, residual, w=None):
        r = x + residual
        return F.rms_norm(r, (r.shape[-1],), w, eps), r

    return fn


ADD_RMS_NORM = OpSpec(
    name="add_rms_norm",
    make_inputs=_inputs(rows=2, params=("weight",)),
    reference=_reference("add_rms_norm", pass_dim=False),
    impls=(
        rownorm_impl("add_rms_norm", "rownorm.add_rms_norm(x, residual, w, eps)", pass_dim=False),
        *eager_and_compiled(
            "x+res, F.rms_norm",
            "r = x + residual; (F.rms_norm(r, (N,), w, eps), r)",
            _add_rms_eager,
        ),
        liger_impl(
            "add_rms_norm",
            "liger_fused_add_rms_norm",
            lambda f, kw: lambda x, res, w: f(x, res, w, kw["eps"], in_place=False),
            "x, residual, w, eps, in_place=False",
        ),
    ),
    fwd_tensors=4,
    fwdbwd_tensors=8,
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
