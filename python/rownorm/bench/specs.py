"""The benchmark's ops, derived from the op table (:data:`rownorm.testing.OPS`).

Every op of the table appears here (its case with every parameter, ``families()``), with what
the table states once for the tests, the self-check and the sanitizer workload: its inputs
(arity and parameters), its call, its float64 reference (gradients: float64 autograd of it), the
PyTorch expression it replaces (timed eager and under torch.compile) and its byte formulas.
What only the benchmark needs is in :data:`EXTRAS`, by op, all of it optional: other eps or
options, more peers (the seeds' own expressions, Liger-Kernel), labels for the report, the
seeds' fixed workloads, and table cases benchmarked besides the families (``mean_abs``). An op
added to the table is benchmarked with no edit here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from rownorm.bench.impls import (
    Fn,
    Impl,
    compile_of,
    eager_and_compiled,
    liger_impl,
    liger_missing,
)
from rownorm.testing import OPS as TABLE
from rownorm.testing import OpInfo, families

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
    # The parameters to make: None, the op's own; else a prefix of them (() = no weight).
    params: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Extras:
    """What the benchmark adds to an op table case (every field optional)."""

    kwargs: dict = dataclasses.field(default_factory=dict)  # eps / options instead of the case's
    eager_name: str = "eager"  # the CSV name of the torch equivalent's eager implementation
    eager_label: str = ""  # its column header, after "eager " / "compile " (default: op name)
    eager_expr: str = ""  # the expression, for the legend
    peers: tuple[Impl, ...] = ()  # more implementations (e.g. a seed's own expression)
    liger: Impl | None = None  # Liger-Kernel's op (default: reported as not offered)
    seeds: tuple[Seed, ...] = ()
    output_names: tuple[str, ...] = ()
    default_grid: bool = True  # False: the grid runs only when --ops names the op


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One benchmarked op: an op table case, the benchmark's kwargs, implementations, seeds.

    Tensors are positional, as the implementations take them: the case's row inputs (x, and
    residual; x's shape, independent per row, split into chunks for the reference), then its
    parameters (weight, bias: shape ``(x.size(dim),)``, passed whole). ``nbytes(mode, M, N,
    elem)`` is the minimum traffic, with M = rows, N = x.size(dim), elem = bytes per element.
    """

    name: str
    case: OpInfo
    impls: tuple[Impl, ...]
    kwargs: dict
    baseline: str = "eager"  # the PyTorch eager implementation the report compares against
    seeds: tuple[Seed, ...] = ()
    output_names: tuple[str, ...] = ("out",)
    default_grid: bool = True

    @property
    def n_outputs(self) -> int:
        return self.case.n_outputs

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.case.input_names

    @property
    def last_dim_only(self) -> bool:
        return self.case.last_dim_only

    def impl(self, name: str) -> Impl:
        for impl in self.impls:
            if impl.name == name:
                return impl
        raise KeyError(f"{self.name}: no implementation named {name!r}")

    def ours(self) -> Impl:
        return next(i for i in self.impls if i.family == "rownorm")

    def make_inputs(self, shape, dim, dtype, device, generator, params=None) -> list[torch.Tensor]:
        """Standard-normal row inputs, drawn on ``device`` (the grid's inputs are GBs); a
        weight 1 + 0.1·N(0, 1) and a bias 0.1·N(0, 1) in x's dtype (the LLM case), so that
        parameter gradients are neither trivial nor cancelling (the op table's values)."""
        params = self.case.params if params is None else tuple(params)
        if params != self.case.params[: len(params)]:
            raise ValueError(f"{self.name}: params must be a prefix of {self.case.params}")
        tensors = [
            torch.randn(shape, dtype=dtype, device=device, generator=generator)
            for _ in self.case.row_inputs
        ]
        for name in params:
            noise = 0.1 * torch.randn(shape[dim], device=device, generator=generator)
            tensors.append((noise + 1.0 if name == "weight" else noise).to(dtype))
        return tensors

    def reference(self, *tensors: torch.Tensor, dim: int, **kwargs) -> tuple[torch.Tensor, ...]:
        """The float64 reference of the op table, differentiable in float64."""
        return _case(self.case, kwargs).reference(_named(self.case, tensors), dim)

    def nbytes(self, mode: str, m: int, n: int, elem: int) -> int:
        f = self.case.fwd_bytes if mode == "fwd" else self.case.fwdbwd_bytes
        return f(m, n, elem)

    def fwd_bytes(self, m: int, n: int, elem: int) -> int:
        return self.case.fwd_bytes(m, n, elem)

    def fwdbwd_bytes(self, m: int, n: int, elem: int) -> int:
        return self.case.fwdbwd_bytes(m, n, elem)

    def bytes_text(self, mode: str) -> str:
        return self.case.fwd_bytes_text if mode == "fwd" else self.case.fwdbwd_bytes_text


def _case(case: OpInfo, kwargs: dict) -> OpInfo:
    """The case with the public function's keyword arguments ``kwargs`` (eps, options)."""
    options = {k: v for k, v in kwargs.items() if k != "eps"}
    eps = kwargs.get("eps", case.eps)
    if eps == case.eps and options == case.options:
        return case
    return dataclasses.replace(case, eps=eps, options=options)


def _named(case: OpInfo, tensors) -> dict[str, torch.Tensor]:
    return dict(zip(case.input_names, tensors, strict=False))  # parameters may be left out


def _table_impls(case: OpInfo, extras: Extras) -> tuple[Impl, ...]:
    """rownorm (the table's call), then the table's torch equivalent eager and compiled."""

    def ours(dim: int, kw: dict) -> Fn:
        c = _case(case, kw)
        return lambda *t: c.call(_named(c, t), dim)

    def eager(dim: int, kw: dict) -> Fn:
        c = _case(case, kw)
        return lambda *t: c.torch_equivalent(_named(c, t), dim)

    args = ", ".join((*case.input_names, *(() if case.last_dim_only else ("dim",)), *case.kwargs))
    label = extras.eager_label or case.name
    expr = extras.eager_expr or f"rownorm.testing.OPS[{case.id!r}].torch_equivalent"
    return (
        Impl("rownorm", "rownorm", "rownorm", f"rownorm.{case.name}({args})", ours),
        Impl(extras.eager_name, "eager", f"eager {label}", expr, eager),
        Impl(
            "compile",
            "compile",
            f"compile {label}",
            f"torch.compile({expr}, dynamic=False)",
            compile_of(eager),
        ),
    )


def _spec(name: str, case: OpInfo, extras: Extras) -> OpSpec:
    liger = extras.liger or liger_missing(name)
    return OpSpec(
        name=name,
        case=case,
        impls=(*_table_impls(case, extras), *extras.peers, liger),
        kwargs={**case.kwargs, **extras.kwargs},
        baseline=extras.eager_name,
        seeds=extras.seeds,
        output_names=extras.output_names or ("out",),
        default_grid=extras.default_grid,
    )


def _bcast(p: torch.Tensor | None, x: torch.Tensor, dim: int) -> torch.Tensor | None:
    """A (N,) parameter shaped to broadcast against x along ``dim``."""
    if p is None or dim % x.ndim == x.ndim - 1:
        return p
    return p.view([-1 if i == dim % x.ndim else 1 for i in range(x.ndim)])


def _l2_by_norm(dim: int, kw: dict) -> Fn:
    return lambda x: x / torch.norm(x, p=2, dim=dim, keepdim=True)


def _rms_by_mean(dim: int, kw: dict) -> Fn:
    eps = kw["eps"]

    def fn(x, w=None):
        y = x / torch.sqrt(torch.mean(x**2, dim=dim, keepdim=True) + eps)
        return y if w is None else y * _bcast(w, x, dim)

    return fn


def _liger_eps(attr: str, args: str, call: Callable[[Fn, float], Fn]) -> Impl:
    return liger_impl(attr, lambda f, kw: call(f, kw["eps"]), args)


_L2_BY_NORM = "x / torch.norm(x, p=2, dim=dim, keepdim=True)"
_l2_eager_norm, _l2_compile_norm = eager_and_compiled("x/norm", _L2_BY_NORM, _l2_by_norm, "_norm")

EXTRAS: dict[str, Extras] = {
    "l2_normalize": Extras(
        eager_name="eager_normalize",
        eager_label="F.normalize",
        eager_expr="F.normalize(x, p=2, dim=dim, eps=eps)",
        peers=(_l2_eager_norm, dataclasses.replace(_l2_compile_norm, grid=False)),
        # The seeds' `x / torch.norm(x, p=2, dim=1, keepdim=True)`: eps = 0.
        seeds=(
            Seed(
                "L2 normalize dim=1, 32768×65535 fp32 (seeds 000/002)",
                "fwd",
                (32768, 65535),
                1,
                torch.float32,
                ("rownorm", "eager_norm", "eager_normalize", "compile_norm", "compile"),
                {"eps": 0.0},
            ),
            Seed(
                "L2 normalize dim=1 fwd+bwd, 16384×65535 fp32",
                "fwdbwd",
                (16384, 65535),
                1,
                torch.float32,
                ("rownorm", "eager_norm", "eager_normalize", "compile_norm", "compile"),
                {"eps": 0.0},
            ),
        ),
    ),
    "l1_normalize": Extras(
        eager_label="F.normalize(p=1)", eager_expr="F.normalize(x, p=1, dim=dim, eps=eps)"
    ),
    # The seed 003 expression; the same kernel as l1_normalize (a different scale), so its grid
    # runs only when named (--ops mean_abs).
    "mean_abs": Extras(
        kwargs={"eps": 0.0, "mean": True},
        eager_label="x/mean|x|",
        eager_expr="x / torch.mean(torch.abs(x), dim=dim, keepdim=True)",
        default_grid=False,
        seeds=(
            Seed(
                "mean-abs normalize dim=1, 32768×65535 fp32 (seed 003)",
                "fwd",
                (32768, 65535),
                1,
                torch.float32,
                ("rownorm", "eager", "compile"),
            ),
        ),
    ),
    "rms_norm": Extras(
        kwargs={"eps": 1e-6},
        eager_label="F.rms_norm",
        eager_expr="F.rms_norm(x, (N,), w, eps)",
        peers=eager_and_compiled(
            "x/sqrt(mean(x²)+eps)",
            "x / torch.sqrt(torch.mean(x ** 2, dim=dim, keepdim=True) + eps) [* w]",
            _rms_by_mean,
            suffix="_expr",
            grid=False,
        ),
        liger=_liger_eps(
            "liger_rms_norm",
            "x, w, eps, in_place=False",
            lambda f, eps: lambda x, w: f(x, w, eps, in_place=False),
        ),
        seeds=(
            Seed(
                "RMSNorm over channels dim=1, 112×64×512×512 fp32, eps 1e-5 (seed 001)",
                "fwd",
                (112, 64, 512, 512),
                1,
                torch.float32,
                ("rownorm", "eager_expr", "compile_expr"),
                {"eps": 1e-5},
                params=(),
            ),
        ),
    ),
    "layer_norm": Extras(
        eager_label="F.layer_norm",
        eager_expr="F.layer_norm(x, (N,), w, b, eps)",
        liger=_liger_eps(
            "liger_layer_norm", "x, w, b, eps", lambda f, eps: lambda x, w, b: f(x, w, b, eps)
        ),
        seeds=(
            Seed(
                "LayerNorm 10000×768 fp32, weight and bias (seed 004)",
                "fwd",
                (10000, 768),
                -1,
                torch.float32,
                ("rownorm", "eager", "compile", "liger"),
            ),
        ),
    ),
    "softmax": Extras(
        eager_label="softmax",
        eager_expr="torch.softmax(x, dim)",
        liger=liger_impl("liger_softmax", lambda f, kw: f, "x"),
        seeds=(
            Seed(
                "softmax 100000×32 fp32 (seed 004)",
                "fwd",
                (100000, 32),
                -1,
                torch.float32,
                ("rownorm", "eager", "compile", "liger"),
            ),
        ),
    ),
    "log_softmax": Extras(eager_label="log_softmax", eager_expr="torch.log_softmax(x, dim)"),
    "add_rms_norm": Extras(
        kwargs={"eps": 1e-6},
        eager_label="x+res, F.rms_norm",
        eager_expr="r = x + residual; (F.rms_norm(r, (N,), w, eps), r)",
        liger=_liger_eps(
            "liger_fused_add_rms_norm",
            "x, residual, w, eps, in_place=False",
            lambda f, eps: lambda x, res, w: f(x, res, w, eps, in_place=False),
        ),
        output_names=("out", "r"),
    ),
}


def _benchmarked() -> dict[str, OpSpec]:
    """The table's family cases (named by their op) and the cases named in EXTRAS (by id),
    in table order."""
    family_ids = {case.id for case in families().values()}
    family_names = {case.name for case in families().values()}
    specs = {}
    for case in TABLE.values():
        if case.id in family_ids:
            name = case.name
        elif case.id in EXTRAS and case.id not in family_names:
            name = case.id
        else:
            continue
        specs[name] = _spec(name, case, EXTRAS.get(name, Extras()))
    unknown = set(EXTRAS) - set(specs)
    if unknown:
        raise RuntimeError(f"rownorm.bench EXTRAS name ops not in the op table: {unknown}")
    return specs


OPS: dict[str, OpSpec] = _benchmarked()
