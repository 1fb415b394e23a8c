"""The op table's interface: what the tests, the self-check, the benchmark and the sanitizer
workload know of an op (the rows are in :mod:`rownorm.testing.table`; adding an op there is
what makes it appear in all four).

Each :class:`OpInfo` is one op with one choice of its options (weight or not, mean or sum,
...). It states:

* the arity: row inputs (``x``, and ``residual`` for add_rms_norm, each of the problem's
  shape), per-feature parameters (``weight`` / ``bias`` of shape ``(x.size(dim),)``) and
  outputs (each of x's shape and dtype);
* how to call it: ``call`` (the public function), ``raw`` (the ``torch.ops.rownorm`` op),
  ``module`` (the ``rownorm.nn`` module holding the same parameters), ``raw_backward``;
* its truth: ``reference`` / ``reference_grads`` (the float64 formulas of
  :mod:`rownorm.reference`, the one place they are written) and ``torch_equivalent`` (the
  eager PyTorch expression it replaces);
* how close it must come: :data:`TOL` per dtype, ``grad_magnitudes`` (the size of the terms a
  gradient is computed from, which errors are measured against), ``row_stat`` (a row property
  of the output with a known exact value);
* its traffic: ``fwd_bytes`` / ``fwdbwd_bytes`` (minimum bytes moved, M rows of N elements);
* ``sample_inputs(device, dtype)``: a few curated inputs (odd N, misaligned and strided rows,
  stride-0 rows, reductions over other dims, zero rows, spread norms, float32 parameters with
  16-bit x), iterated inside a test the way PyTorch's OpInfo ``sample_inputs`` are.

Inputs are a dict ``{name: tensor}``; every call returns a tuple of outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from rownorm._checks import resolve_eps
from rownorm.testing.samples import (
    DIM_CASES,
    LAYOUTS,
    randn,
    rows_of,
    scaled_rows,
    with_zero_rows,
)

Inputs = dict[str, torch.Tensor]

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
             torch.float64: "fp64"}  # fmt: skip
# Inputs of the problem's shape (gradients compared per row) vs per-feature parameters.
ROW_INPUTS = ("x", "residual")


@dataclass(frozen=True)
class Tol:
    """How close an output must be to the float64 reference, rounded to its dtype.

    rtol / atol: elementwise; atol is relative to the largest |magnitude| of the row (so long
        rows, whose values are ~1/sqrt(N), are held to the same standard as short ones).
    relerr: bound on ‖out − ref‖₂ / ‖magnitude‖₂ over the tensor (rows rescaled).
    unit: bound on the error of a row statistic whose exact value is known (‖y‖₂ = 1,
        Σ softmax = 1, the variance of a layer-normalized row, ...).
    """

    rtol: float
    atol: float
    relerr: float
    unit: float


# THE TOLERANCE TABLE. The kernels accumulate in float32 (float64 for float64) and round once
# to the output dtype, so the output differs from the rounded reference by about one unit in
# the last place: 2^-10 (fp16), 2^-7 (bf16), 2^-23 (fp32) relative. The relative error over a
# tensor averages those roundings and is held tighter.
TOL: dict[torch.dtype, Tol] = {
    torch.float32: Tol(rtol=1e-5, atol=1e-5, relerr=1e-6, unit=1e-5),
    torch.float16: Tol(rtol=1e-3, atol=1e-3, relerr=1e-3, unit=2e-3),
    torch.bfloat16: Tol(rtol=1e-2, atol=1e-2, relerr=8e-3, unit=1.6e-2),
    torch.float64: Tol(rtol=1e-12, atol=1e-12, relerr=1e-12, unit=1e-12),
}


class Arity(NamedTuple):
    inputs: int  # row inputs, of the problem's shape
    params: int  # per-feature parameters, of shape (N,)
    outputs: int


class Sample(NamedTuple):
    desc: str
    inputs: Inputs
    dim: int


def along(p: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """A (N,) tensor shaped to broadcast against x along dim."""
    shape = [1] * x.dim()
    shape[dim % x.dim()] = -1
    return p.reshape(shape)


def sum_rows(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Σ over every dim but ``dim``: the (N,) reduction of a parameter gradient."""
    return rows_of(t, dim).sum(0)


def moved(fn, x: torch.Tensor, dim: int) -> torch.Tensor:
    """Applies a last-dim torch function to x along ``dim``."""
    return fn(x.movedim(dim, -1)).movedim(-1, dim)


def _contiguous_scaled(rows, n, dtype, device):
    return scaled_rows(rows, n, dtype, device), -1


# (description, builder, builder args, on the CPU too): the samples of every op; ops reducing
# the last dim only skip the others. Row counts are odd so that multi-row CTAs end partial.
# The CPU makes every operand contiguous before its one row loop, so it runs the samples
# that differ there (lengths, values, inner == 1 or not) and not the pure layouts.
_SAMPLES = (
    ("n=1", LAYOUTS["contiguous"], (67, 1), True),
    ("n=7", LAYOUTS["contiguous"], (67, 7), True),
    ("n=33", LAYOUTS["contiguous"], (35, 33), True),
    ("n=1000 norms 1e-2..1e2", _contiguous_scaled, (19, 1000), True),
    ("n=4097 norms 1e-2..1e2", _contiguous_scaled, (5, 4097), False),
    ("misaligned rows n=1025", LAYOUTS["odd_offset"], (19, 1025), True),
    ("row stride n=256", LAYOUTS["row_strided"], (19, 256), False),
    ("stride-0 rows n=33", LAYOUTS["expanded_rows"], (9, 33), False),
    ("stride-0 along dim n=65", LAYOUTS["expanded_along_dim"], (9, 65), False),
    ("transposed n=129", LAYOUTS["transposed"], (19, 129), False),
    ("gapped 3-D n=33", LAYOUTS["3d_gapped"], (9, 33), False),
    ("size-1 dims n=64", LAYOUTS["size_one_dims"], (7, 64), False),
    ("1-D n=100", DIM_CASES["1d"], (100,), True),
    ("dim=0 n=33", DIM_CASES["first"], (33,), False),
    ("dim=-2 n=65", DIM_CASES["middle_negative"], (65,), True),
    ("NCHW channels n=33", DIM_CASES["nchw_wide"], (33,), False),
    ("NHWC channels n=5", DIM_CASES["nhwc_channels"], (5,), False),
)


@dataclass(frozen=True)
class OpInfo:
    id: str
    name: str  # torch.ops.rownorm.<name>
    params: tuple[str, ...] = ()
    eps: float | None = None
    options: dict = field(default_factory=dict)
    residual: bool = False  # a second same-shaped input (add_rms_norm)
    last_dim_only: bool = False
    n_outputs: int = 1
    has_eps: bool = True
    # The torch expression computes in x's dtype (not upcast internally): compare 16-bit x
    # with it evaluated in float32.
    torch_in_fp32: bool = False
    # The backward reads the forward's output y instead of x (softmax / log_softmax).
    backward_reads_output: bool = False
    # torch's CUDA kernel makes a row holding ±inf NaN everywhere, where rownorm keeps the
    # formula's IEEE result (0 at the finite entries) as torch's CPU kernel does (README,
    # "Extreme values"; H100, torch 2.11): torch is evaluated on the CPU for such inputs.
    torch_cuda_nan_inf_rows: bool = False

    # ---- arity, names, traffic --------------------------------------------------------------

    @property
    def row_inputs(self) -> tuple[str, ...]:
        return ("x", "residual") if self.residual else ("x",)

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.row_inputs + self.params

    @property
    def saved(self) -> str:
        """The tensor the backward op reads, by its name there: the output y (softmax), r =
        x + residual (add_rms_norm), or x."""
        return "y" if self.backward_reads_output else ("r" if self.residual else "x")

    @property
    def arity(self) -> Arity:
        return Arity(len(self.row_inputs), len(self.params), self.n_outputs)

    @property
    def kwargs(self) -> dict:
        """The public function's keyword arguments for this case (besides dim)."""
        return ({"eps": self.eps} if self.has_eps else {}) | self.options

    def fwd_bytes(self, m: int, n: int, elem: int) -> int:
        """Minimum forward traffic: read every row input, write every output (parameters, N
        elements each, are not counted)."""
        return (self.arity.inputs + self.n_outputs) * m * n * elem

    def fwdbwd_bytes(self, m: int, n: int, elem: int) -> int:
        """Forward, then a backward that reads the saved tensor (x, or y) and one gradient per
        output and writes one row gradient (add_rms_norm's dx = dresidual, written once)."""
        return self.fwd_bytes(m, n, elem) + (2 + self.n_outputs) * m * n * elem

    @property
    def fwd_bytes_text(self) -> str:
        k = self.arity.inputs + self.n_outputs
        return f"{k}·M·N·b (read {', '.join(self.row_inputs)}; write {self.n_outputs} output(s))"

    @property
    def fwdbwd_bytes_text(self) -> str:
        k = self.arity.inputs + 2 * self.n_outputs + 2
        return f"{k}·M·N·b (fwd; bwd: read {self.saved} and {self.n_outputs} dy, write dx once)"

    # ---- inputs -----------------------------------------------------------------------------

    def inputs(self, x, dim, *, param_dtype=None, residual=None, generator=None) -> Inputs:
        """x plus what the op needs: residual (random unless given) and parameters (weight
        1 + 0.1·N(0, 1), bias 0.1·N(0, 1): neither trivial nor cancelling)."""
        inp = {"x": x}
        if self.residual:
            inp["residual"] = (
                residual if residual is not None else randn(x.shape, x.dtype, x.device, generator)
            )
        n = x.shape[dim] if x.dim() else 1
        for p in self.params:
            noise = 0.1 * randn((n,), torch.float32, "cpu", generator)
            inp[p] = (
                (noise + 1.0 if p == "weight" else noise).to(param_dtype or x.dtype).to(x.device)
            )
        return inp

    def output_like(self, inp: Inputs, i: int) -> torch.Tensor:
        """The input whose shape and dtype output i has (x; add_rms_norm's r: the residual)."""
        return inp["x"]

    def make_inputs(self, shape, dim, dtype, device, generator=None, *, with_params=True):
        """Contiguous random inputs of ``shape`` (the benchmark's and the self-check's)."""
        x = randn(shape, dtype, device, generator)
        res = randn(shape, dtype, device, generator) if self.residual else None
        inp = self.inputs(x, dim, residual=res, generator=generator)
        return inp if with_params else {k: v for k, v in inp.items() if k in ROW_INPUTS}

    def supports(self, x: torch.Tensor, dim: int) -> bool:
        return not self.last_dim_only or dim % max(x.dim(), 1) == max(x.dim(), 1) - 1

    def sample_inputs(self, device, dtype: torch.dtype) -> Iterator[Sample]:
        """The op's curated samples (see _SAMPLES; the CPU's subset on the CPU and for
        float16), plus rows that are all zero and, for 16-bit x with parameters, float32
        parameters. Draws from torch's global generator."""
        # float16 plans and routes as bfloat16 does (same element size): the value samples only
        short = torch.device(device).type == "cpu" or dtype == torch.float16
        for desc, build, args, on_cpu in _SAMPLES:
            if short and not on_cpu:
                continue
            x, dim = build(*args, dtype, device)
            if not self.supports(x, dim):
                continue
            res = build(*args, dtype, device)[0] if self.residual else None
            yield Sample(desc, self.inputs(x, dim, residual=res), dim)
        x, dim = LAYOUTS["contiguous"](9, 33, dtype, device)
        yield Sample("zero rows n=33", self.with_zero_rows(self.inputs(x, dim), dim), dim)
        if self.params and dtype in (torch.float16, torch.bfloat16):
            x, dim = LAYOUTS["odd_offset"](7, 1025, dtype, device)
            inp = self.inputs(x, dim, param_dtype=torch.float32)
            yield Sample("float32 params, misaligned n=1025", inp, dim)

    def with_zero_rows(self, inp: Inputs, dim: int) -> Inputs:
        """Every third row of x zero (and of the residual there, so that x + residual is)."""
        inp = dict(inp)
        inp["x"] = with_zero_rows(inp["x"], dim)
        if self.residual:
            inp["residual"] = torch.where(
                (inp["x"] == 0).all(dim, keepdim=True), 0, inp["residual"]
            )
        return inp

    def without_params(self) -> OpInfo:
        """This case without its parameters (and without the options that need them)."""
        return dataclasses.replace(self, params=())

    def grad_inputs(self, inp: Inputs) -> list[str]:
        """The names of the differentiable inputs present."""
        return [k for k in ("x", "residual", "weight", "bias") if k in inp]

    # ---- the op and its equivalents (subclasses) --------------------------------------------

    def call(self, inp: Inputs, dim: int) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def raw_args(self, inp: Inputs, dim: int) -> tuple:
        raise NotImplementedError

    def module(self, inp: Inputs, dim: int) -> torch.nn.Module | None:
        return None

    def reference(self, inp: Inputs, dim: int) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def torch_equivalent(self, inp: Inputs, dim: int) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def reference_grads(self, dys, inp: Inputs, dim: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def grad_magnitudes(self, dys, inp: Inputs, dim: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def backward_args(self, dys, inp: Inputs, dim: int, outs, want: frozenset) -> tuple:
        """Arguments of the ``*_backward`` op; ``want``: the parameter gradients requested."""
        raise NotImplementedError

    def unpack_backward(self, result, inp: Inputs) -> dict[str, torch.Tensor]:
        """The backward op's result as {input name: gradient} (parameter grads as returned)."""
        return {"x": result}

    def row_stat(self, out: torch.Tensor, inp: Inputs, dim: int):
        """(statistic per row, its exact value, bound) of a property of the output, or None."""
        return None

    def output_magnitude(self, inp: Inputs, dim: int, r: torch.Tensor) -> torch.Tensor | None:
        """What the error of the first output is measured against (None: the reference)."""
        return None

    # ---- shared -----------------------------------------------------------------------------

    @property
    def op(self) -> torch._ops.OpOverload:
        return getattr(torch.ops.rownorm, self.name).default

    @property
    def backward_op(self) -> torch._ops.OpOverload:
        return getattr(torch.ops.rownorm, self.name + "_backward").default

    def backward_op_for(self, inp: Inputs) -> torch._ops.OpOverload:
        """The backward op that autograd runs for these inputs (``backward_op``, but for
        add_rms_norm on the float32 residual stream)."""
        return self.backward_op

    def raw(self, inp: Inputs, dim: int) -> tuple[torch.Tensor, ...]:
        out = self.op(*self.raw_args(inp, dim))
        return out if isinstance(out, tuple) else (out,)

    def raw_backward(self, dys, inp: Inputs, dim: int, outs, want=frozenset(), *, every=False):
        """{name: gradient} from the backward op: the row inputs' and the parameter
        gradients in ``want`` (``every``: also the unrequested ones, of shape (0,))."""
        want = frozenset(want)
        result = self.unpack_backward(
            self.backward_op_for(inp)(*self.backward_args(dys, inp, dim, outs, want)), inp
        )
        return {k: v for k, v in result.items() if every or k in ROW_INPUTS or k in want}

    def resolved_eps(self, x: torch.Tensor) -> float:
        return resolve_eps(x, self.eps)

    def __str__(self) -> str:
        return self.id
