"""The op table: every rownorm op, as the generic tests drive it.

Each :class:`OpCase` is one op with one choice of its options (weight or not, mean or sum,
...). The tests are written once against this interface and parametrized over ``OPS``, so a
property (layouts, poisoned outputs, opcheck, compile, ...) is stated once for every op.

Inputs are a dict: ``x`` (and ``residual`` for add_rms_norm) of the problem's shape, and the
per-feature parameters ``weight`` / ``bias`` of shape ``(x.size(dim),)``. Every call returns
a tuple of outputs (one, or two for add_rms_norm):

* ``call``: the public function (``rownorm.rms_norm``, ...);
* ``raw``: the ``torch.ops.rownorm`` op with ``raw_args``;
* ``module``: the ``rownorm.nn`` module holding the same parameters (None where none fits);
* ``reference``: the float64 reference of :mod:`rownorm.reference`;
* ``torch_equivalent``: the PyTorch expression the op must equal (F.rms_norm, ...).

Gradients: ``reference_grads`` gives the float64-reference gradient of every input for output
gradients ``dys``; ``grad_magnitudes`` the size of the terms each gradient is computed from
(its true value may cancel to ~0, so errors are measured against these); ``raw_backward``
calls the ``*_backward`` op directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import rownorm
import torch
import torch.nn.functional as F
from utils import (
    DIM_CASES,
    LAYOUTS,
    TOL,
    assert_matches,
    assert_new_contiguous,
    randn,
    rows_of,
)

Inputs = dict[str, torch.Tensor]

# Inputs of the problem's shape (gradients compared per row) vs per-feature parameters.
ROW_INPUTS = ("x", "residual")


def _along(p: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """A (N,) tensor shaped to broadcast against x along dim."""
    shape = [1] * x.dim()
    shape[dim % x.dim()] = -1
    return p.reshape(shape)


def _sum_rows(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Σ over every dim but ``dim``: the (N,) reduction of a parameter gradient."""
    return rows_of(t, dim).sum(0)


def _moved(fn, x: torch.Tensor, dim: int) -> torch.Tensor:
    """Applies a last-dim torch function to x along ``dim``."""
    return fn(x.movedim(dim, -1)).movedim(-1, dim)


@dataclass(frozen=True)
class OpCase:
    id: str
    name: str  # torch.ops.rownorm.<name>
    params: tuple[str, ...] = ()
    eps: float | None = None
    options: dict = field(default_factory=dict)
    residual: bool = False  # a second same-shaped input (add_rms_norm)
    last_dim_only: bool = False
    n_outputs: int = 1
    # The torch expression computes in x's dtype (not upcast internally): compare 16-bit x
    # with it evaluated in float32 (see test_ops_forward.check_forward).
    torch_in_fp32: bool = False
    # The *_backward op is itself differentiable (l2_normalize); the others raise.
    double_backward: bool = False

    # ---- inputs ----------------------------------------------------------------------------

    def inputs(
        self,
        x: torch.Tensor,
        dim: int,
        *,
        param_dtype: torch.dtype | None = None,
        residual: torch.Tensor | None = None,
    ) -> Inputs:
        """x plus what the op needs: residual (random, x's layout when given) and parameters."""
        inp = {"x": x}
        if self.residual:
            inp["residual"] = (
                residual if residual is not None else randn(x.shape, x.dtype, x.device)
            )
        n = x.shape[dim]
        for p in self.params:
            inp[p] = randn((n,), param_dtype or x.dtype, x.device)
        return inp

    def supports(self, x: torch.Tensor, dim: int) -> bool:
        return not self.last_dim_only or dim % x.dim() == x.dim() - 1

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

    def output_magnitude(self, inp: Inputs, dim: int, ref: torch.Tensor) -> torch.Tensor | None:
        """What the error of the first output is measured against (None: the reference)."""
        return None

    # ---- shared -----------------------------------------------------------------------------

    @property
    def op(self) -> torch._ops.OpOverload:
        return getattr(torch.ops.rownorm, self.name).default

    @property
    def backward_op(self) -> torch._ops.OpOverload:
        return getattr(torch.ops.rownorm, self.name + "_backward").default

    def raw(self, inp: Inputs, dim: int) -> tuple[torch.Tensor, ...]:
        out = self.op(*self.raw_args(inp, dim))
        return out if isinstance(out, tuple) else (out,)

    def raw_backward(self, dys, inp: Inputs, dim: int, outs, want=frozenset(), *, every=False):
        """{name: gradient} from the ``*_backward`` op: the row inputs' and the parameter
        gradients in ``want`` (``every``: also the unrequested ones, of shape (0,))."""
        want = frozenset(want)
        result = self.unpack_backward(
            self.backward_op(*self.backward_args(dys, inp, dim, outs, want)), inp
        )
        return {k: v for k, v in result.items() if every or k in ROW_INPUTS or k in want}

    def resolved_eps(self, x: torch.Tensor) -> float:
        """eps=None as F.rms_norm resolves it: the machine epsilon of the computation type,
        float32 for float16 / bfloat16 / float32 x, float64 for float64 x."""
        if self.eps is not None:
            return self.eps
        return torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps

    def __str__(self) -> str:
        return self.id


# ---- l2_normalize -------------------------------------------------------------------------


@dataclass(frozen=True)
class L2Normalize(OpCase):
    name: str = "l2_normalize"
    eps: float = 1e-12
    double_backward: bool = True

    def call(self, inp, dim):
        return (rownorm.l2_normalize(inp["x"], dim=dim, eps=self.eps),)

    def raw_args(self, inp, dim):
        return (inp["x"], dim, self.eps)

    def module(self, inp, dim):
        return rownorm.nn.L2Norm(dim=dim, eps=self.eps)

    def reference(self, inp, dim):
        return (rownorm.reference.l2_normalize(inp["x"], dim, self.eps),)

    def torch_equivalent(self, inp, dim):
        return (F.normalize(inp["x"], p=2.0, dim=dim, eps=self.eps),)

    def reference_grads(self, dys, inp, dim):
        return {"x": rownorm.reference.l2_normalize_backward(dys[0], inp["x"], dim, self.eps)}

    def grad_magnitudes(self, dys, inp, dim):
        # dx = dy/n − x·Σ(dy⊙x)/n³: both terms are bounded by |dy|/n and ‖dy‖/n.
        x, dy = inp["x"].double(), dys[0].double().abs()
        n = torch.linalg.vector_norm(x, dim=dim, keepdim=True).clamp_min(self.eps)
        return {"x": dy / n + x.abs() * (dy * x.abs()).sum(dim, keepdim=True) / n**3}

    def backward_args(self, dys, inp, dim, outs, want):
        return (dys[0], inp["x"], dim, self.eps)

    def row_stat(self, out, inp, dim):
        # ‖y‖₂ = ‖x‖ / max(‖x‖, eps): 1 wherever ‖x‖ >= eps.
        n = torch.linalg.vector_norm(inp["x"].double(), dim=dim)
        stat = torch.linalg.vector_norm(out.double(), dim=dim)
        return stat, n / n.clamp_min(self.eps), TOL[out.dtype].unit


# ---- l1_normalize -------------------------------------------------------------------------


@dataclass(frozen=True)
class L1Normalize(OpCase):
    name: str = "l1_normalize"
    torch_in_fp32: bool = True  # F.normalize's fp16 Σ|x| overflows at 65504

    @property
    def mean(self) -> bool:
        return self.options.get("mean", False)

    def call(self, inp, dim):
        return (rownorm.l1_normalize(inp["x"], dim=dim, eps=self.eps, mean=self.mean),)

    def raw_args(self, inp, dim):
        return (inp["x"], dim, self.eps, self.mean)

    def module(self, inp, dim):
        return rownorm.nn.L1Norm(dim=dim, eps=self.eps, mean=self.mean)

    def reference(self, inp, dim):
        return (rownorm.reference.l1_normalize(inp["x"], dim, self.eps, self.mean),)

    def torch_equivalent(self, inp, dim):
        x = inp["x"]
        if self.mean:
            # Seed 003 (eps=0): x / torch.mean(torch.abs(x), dim=1, keepdim=True).
            s = torch.mean(torch.abs(x), dim=dim, keepdim=True)
            return (x / (s if self.eps == 0 else s.clamp_min(self.eps)),)
        return (F.normalize(x, p=1.0, dim=dim, eps=self.eps),)

    def reference_grads(self, dys, inp, dim):
        dx = rownorm.reference.l1_normalize_backward(dys[0], inp["x"], dim, self.eps, self.mean)
        return {"x": dx}

    def grad_magnitudes(self, dys, inp, dim):
        x, dy = inp["x"].double(), dys[0].double().abs()
        d = x.shape[dim] if self.mean else 1
        s = (x.abs().sum(dim, keepdim=True) / d).clamp_min(self.eps)
        return {"x": dy / s + (dy * x.abs()).sum(dim, keepdim=True) / (s * s * d)}

    def backward_args(self, dys, inp, dim, outs, want):
        return (dys[0], inp["x"], dim, self.eps, self.mean)

    def row_stat(self, out, inp, dim):
        # Σ|y| = S / max(S, eps) (mean|y| with mean=True): 1 wherever S >= eps.
        x = inp["x"].double()
        reduce = torch.mean if self.mean else torch.sum
        s = reduce(x.abs(), dim)
        return reduce(out.double().abs(), dim), s / s.clamp_min(self.eps), TOL[out.dtype].unit


# ---- rms_norm -----------------------------------------------------------------------------


def _rms_magnitudes(dy, r, w, dim, eps, extra=None):
    """|terms| of rms_norm's backward at r: dx = rstd·(g − ŷ·mean(ŷ⊙g)), dw = Σ dy⊙ŷ."""
    r, dy = r.double(), dy.double()
    rstd = torch.rsqrt((r * r).mean(dim, keepdim=True) + eps)
    yhat = r * rstd
    g = dy.abs() if w is None else (dy * _along(w.double(), r, dim)).abs()
    mag = {"x": rstd * (g + yhat.abs() * (yhat.abs() * g).mean(dim, keepdim=True))}
    if extra is not None:
        mag["x"] = mag["x"] + extra.double().abs()
    if w is not None:
        mag["weight"] = _sum_rows((dy * yhat).abs(), dim)
    return mag


def _rms_stat(out, x, dim, eps):
    # Without a weight, rms(y) = sqrt(ms / (ms + eps)) with ms = mean(x²): ≈ 1 where ms >> eps.
    x = x.double()
    ms = (x * x).mean(dim)
    stat = out.double().square().mean(dim).sqrt()
    return stat, (ms / (ms + eps)).sqrt(), TOL[out.dtype].unit


@dataclass(frozen=True)
class RmsNorm(OpCase):
    name: str = "rms_norm"

    def w(self, inp):
        return inp.get("weight")

    def call(self, inp, dim):
        return (rownorm.rms_norm(inp["x"], self.w(inp), dim=dim, eps=self.eps),)

    def raw_args(self, inp, dim):
        return (inp["x"], self.w(inp), dim, self.eps)

    def module(self, inp, dim):
        x, w = inp["x"], self.w(inp)
        m = rownorm.nn.RMSNorm(
            x.shape[dim],
            eps=self.eps,
            elementwise_affine=w is not None,
            dim=dim,
            device=x.device,
            dtype=x.dtype if w is None else w.dtype,
        )
        if w is not None:
            with torch.no_grad():
                m.weight.copy_(w)
        return m

    def reference(self, inp, dim):
        return (rownorm.reference.rms_norm(inp["x"], self.w(inp), dim, self.eps),)

    def torch_equivalent(self, inp, dim):
        x, w = inp["x"], self.w(inp)
        return (_moved(lambda t: F.rms_norm(t, (t.shape[-1],), w, self.eps), x, dim),)

    def reference_grads(self, dys, inp, dim):
        dx, dw = rownorm.reference.rms_norm_backward(dys[0], inp["x"], self.w(inp), dim, self.eps)
        return {"x": dx} if dw is None else {"x": dx, "weight": dw}

    def grad_magnitudes(self, dys, inp, dim):
        x = inp["x"]
        return _rms_magnitudes(dys[0], x, self.w(inp), dim, self.resolved_eps(x))

    def backward_args(self, dys, inp, dim, outs, want):
        x = inp["x"]
        return (dys[0], x, self.w(inp), dim, self.resolved_eps(x), "weight" in want)

    def unpack_backward(self, result, inp):
        dx, dw = result
        return {"x": dx, "weight": dw}

    def row_stat(self, out, inp, dim):
        if self.w(inp) is not None:
            return None
        return _rms_stat(out, inp["x"], dim, self.resolved_eps(inp["x"]))


# ---- layer_norm ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerNorm(OpCase):
    name: str = "layer_norm"
    eps: float = 1e-5

    def call(self, inp, dim):
        return (
            rownorm.layer_norm(inp["x"], inp.get("weight"), inp.get("bias"), dim=dim, eps=self.eps),
        )

    def raw_args(self, inp, dim):
        return (inp["x"], inp.get("weight"), inp.get("bias"), dim, self.eps)

    def module(self, inp, dim):
        x, w, b = inp["x"], inp.get("weight"), inp.get("bias")
        if w is None and b is not None:
            return None  # a module has no bias without a weight
        m = rownorm.nn.LayerNorm(
            x.shape[dim],
            eps=self.eps,
            elementwise_affine=w is not None,
            bias=b is not None,
            dim=dim,
            device=x.device,
            dtype=x.dtype if w is None else w.dtype,
        )
        with torch.no_grad():
            if w is not None:
                m.weight.copy_(w)
            if b is not None:
                m.bias.copy_(b)
        return m

    def reference(self, inp, dim):
        x, w, b = inp["x"], inp.get("weight"), inp.get("bias")
        return (rownorm.reference.layer_norm(x, w, b, dim, self.eps),)

    def torch_equivalent(self, inp, dim):
        x, w, b = inp["x"], inp.get("weight"), inp.get("bias")
        return (_moved(lambda t: F.layer_norm(t, (t.shape[-1],), w, b, self.eps), x, dim),)

    def reference_grads(self, dys, inp, dim):
        x, w, b = inp["x"], inp.get("weight"), inp.get("bias")
        dx, dw, db = rownorm.reference.layer_norm_backward(dys[0], x, w, b, dim, self.eps)
        grads = {"x": dx, "weight": dw, "bias": db}
        return {k: v for k, v in grads.items() if v is not None}

    def grad_magnitudes(self, dys, inp, dim):
        x, dy, w = inp["x"].double(), dys[0].double(), inp.get("weight")
        xc = x - x.mean(dim, keepdim=True)
        rstd = torch.rsqrt((xc * xc).mean(dim, keepdim=True) + self.eps)
        yhat = xc * rstd
        g = dy.abs() if w is None else (dy * _along(w.double(), x, dim)).abs()
        mean_g = g.mean(dim, keepdim=True)
        mag = {"x": rstd * (g + mean_g + yhat.abs() * (yhat.abs() * g).mean(dim, keepdim=True))}
        if w is not None:
            # ŷ carries the mean's rounding error (see _mean_error_scale), which is all of ŷ
            # in a constant row; dweight sums it.
            noise = self._mean_error_scale(inp["x"], dim) * TOL[x.dtype].atol / TOL[w.dtype].atol
            mag["weight"] = _sum_rows((dy * (yhat.abs() + noise)).abs(), dim)
        if "bias" in inp:
            mag["bias"] = _sum_rows(dy.abs(), dim)
        return mag

    def backward_args(self, dys, inp, dim, outs, want):
        return (
            dys[0],
            inp["x"],
            inp.get("weight"),
            dim,
            self.eps,
            "weight" in want,
            "bias" in want,
        )

    def unpack_backward(self, result, inp):
        dx, dw, db = result
        return {"x": dx, "weight": dw, "bias": db}

    def _mean_error_scale(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """|x|·rstd, in units of the accumulator's precision relative to x's dtype's.

        The mean is accumulated in float32 (float64 for float64 x); its rounding error,
        ε_acc·|μ|, is multiplied by rstd in ŷ = (x − μ)·rstd. Where the variance is small
        against the mean (a constant row: rstd = 1/sqrt(eps)) that is the whole output, and
        no kernel can do better, so errors are measured against it as well as against y.
        """
        x64 = x.double()
        xc = x64 - x64.mean(dim, keepdim=True)
        rstd = torch.rsqrt((xc * xc).mean(dim, keepdim=True) + self.eps)
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        return TOL[acc].atol / TOL[x.dtype].atol * x64.abs() * rstd

    def output_magnitude(self, inp, dim, ref):
        scale = self._mean_error_scale(inp["x"], dim)
        if "weight" in inp:
            scale = scale * _along(inp["weight"].double().abs(), inp["x"], dim)
        return ref.double().abs() + scale

    def row_stat(self, out, inp, dim):
        if "weight" in inp or "bias" in inp:
            return None
        # Without affine: mean(y) = 0 and var(y) = var / (var + eps) (≈ 1 where var >> eps).
        x, y = inp["x"].double(), out.double()
        var = x.var(dim, unbiased=False)
        unit = TOL[out.dtype].unit
        mean_bound = unit + TOL[out.dtype].atol * self._mean_error_scale(x, dim).mean(dim)
        stat = torch.stack([y.mean(dim), y.var(dim, unbiased=False)])
        expected = torch.stack([torch.zeros_like(var), var / (var + self.eps)])
        return stat, expected, torch.stack([mean_bound, torch.full_like(var, unit)])


# ---- softmax / log_softmax ----------------------------------------------------------------


@dataclass(frozen=True)
class Softmax(OpCase):
    name: str = "softmax"

    @property
    def log(self) -> bool:
        return self.name == "log_softmax"

    def call(self, inp, dim):
        fn = rownorm.log_softmax if self.log else rownorm.softmax
        return (fn(inp["x"], dim=dim),)

    def raw_args(self, inp, dim):
        return (inp["x"], dim)

    def module(self, inp, dim):
        return (rownorm.nn.LogSoftmax if self.log else rownorm.nn.Softmax)(dim)

    def reference(self, inp, dim):
        fn = rownorm.reference.log_softmax if self.log else rownorm.reference.softmax
        return (fn(inp["x"], dim),)

    def torch_equivalent(self, inp, dim):
        fn = torch.log_softmax if self.log else torch.softmax
        return (fn(inp["x"], dim),)

    def reference_grads(self, dys, inp, dim):
        ref = rownorm.reference
        fn = ref.log_softmax_backward if self.log else ref.softmax_backward
        return {"x": fn(dys[0], inp["x"], dim)}

    def grad_magnitudes(self, dys, inp, dim):
        p = torch.softmax(inp["x"].double(), dim)
        dy = dys[0].double().abs()
        if not self.log:
            # The backward reads the ROUNDED output y = p, whose error is relative down to the
            # dtype's smallest normal number and absolute below it (1/N rows in fp16).
            p = p.clamp_min(torch.finfo(inp["x"].dtype).tiny)
        if self.log:
            # The backward reads the ROUNDED output y = log p: exp(y) then carries a relative
            # error of ~rtol·|y|, so the term exp(y)·Σdy is as uncertain as p·(1 + |log p|).
            log_p = torch.log_softmax(inp["x"].double(), dim).abs()
            weight = torch.where(p > 0, p * (1 + log_p), 0.0)
            return {"x": dy + weight * dy.sum(dim, keepdim=True)}
        return {"x": p * (dy + (dy * p).sum(dim, keepdim=True))}

    def backward_args(self, dys, inp, dim, outs, want):
        return (dys[0], outs[0], dim)  # the backward takes the forward's OUTPUT

    def row_stat(self, out, inp, dim):
        y = out.double()
        tol = TOL[out.dtype]
        if not self.log:
            return y.sum(dim), 1.0, tol.unit
        # logsumexp(y) = 0. Each y_i carries a rounding error of ~rtol·|y_i|, which moves
        # logsumexp by the softmax-weighted mean of those errors.
        p = torch.softmax(inp["x"].double(), dim)
        bound = tol.unit + tol.rtol * (p * y.abs()).nan_to_num(0.0).sum(dim)
        return torch.logsumexp(y, dim), 0.0, bound


# ---- add_rms_norm -------------------------------------------------------------------------


@dataclass(frozen=True)
class AddRmsNorm(OpCase):
    name: str = "add_rms_norm"
    residual: bool = True
    last_dim_only: bool = True
    n_outputs: int = 2

    def w(self, inp):
        return inp.get("weight")

    def call(self, inp, dim):
        assert self.supports(inp["x"], dim)
        return rownorm.add_rms_norm(inp["x"], inp["residual"], self.w(inp), eps=self.eps)

    def raw_args(self, inp, dim):
        return (inp["x"], inp["residual"], self.w(inp), self.eps)

    def module(self, inp, dim):
        x, w = inp["x"], self.w(inp)
        m = rownorm.nn.AddRMSNorm(
            x.shape[-1],
            eps=self.eps,
            elementwise_affine=w is not None,
            device=x.device,
            dtype=x.dtype if w is None else w.dtype,
        )
        if w is not None:
            with torch.no_grad():
                m.weight.copy_(w)
        return m

    def reference(self, inp, dim):
        return rownorm.reference.add_rms_norm(inp["x"], inp["residual"], self.w(inp), self.eps)

    def torch_equivalent(self, inp, dim):
        r = inp["x"] + inp["residual"]
        return F.rms_norm(r, (r.shape[-1],), self.w(inp), self.eps), r

    def reference_grads(self, dys, inp, dim):
        dx, dres, dw = rownorm.reference.add_rms_norm_backward(
            dys[0], dys[1], inp["x"], inp["residual"], self.w(inp), self.eps
        )
        grads = {"x": dx, "residual": dres}
        if dw is not None:
            grads["weight"] = dw
        return grads

    def grad_magnitudes(self, dys, inp, dim):
        x = inp["x"]
        r = x + inp["residual"]
        dy_r = dys[1] if dys[1] is not None else torch.zeros_like(r)
        if dys[0] is None:
            mag = {"x": dy_r.double().abs()}
        else:
            mag = _rms_magnitudes(dys[0], r, self.w(inp), -1, self.resolved_eps(x), extra=dy_r)
        mag["residual"] = mag["x"]
        return mag

    def backward_args(self, dys, inp, dim, outs, want):
        r = outs[1]
        return (dys[0], dys[1], r, self.w(inp), self.resolved_eps(inp["x"]), "weight" in want)

    def unpack_backward(self, result, inp):
        dr, dw = result
        return {"x": dr, "residual": dr, "weight": dw}

    def row_stat(self, out, inp, dim):
        if self.w(inp) is not None:
            return None
        r = inp["x"] + inp["residual"]
        return _rms_stat(out, r, -1, self.resolved_eps(inp["x"]))


# ---- the table ----------------------------------------------------------------------------

OPS: dict[str, OpCase] = {
    op.id: op
    for op in (
        L2Normalize("l2"),
        L1Normalize("l1", eps=1e-12),
        L1Normalize("mean_abs", eps=1e-12, options={"mean": True}),
        RmsNorm("rms_norm"),
        RmsNorm("rms_norm_weight", params=("weight",), eps=1e-5),
        LayerNorm("layer_norm"),
        LayerNorm("layer_norm_affine", params=("weight", "bias")),
        Softmax("softmax"),
        Softmax("log_softmax", name="log_softmax"),
        AddRmsNorm("add_rms_norm"),
        AddRmsNorm("add_rms_norm_weight", params=("weight",), eps=1e-6),
    )
}
# One case per op (with every differentiable input): for the costlier axes.
OP_FAMILIES = ("l2", "mean_abs", "rms_norm_weight", "layer_norm_affine", "softmax",
               "log_softmax", "add_rms_norm_weight")  # fmt: skip
# The ops with per-feature parameters, with them.
PARAM_OPS = ("rms_norm_weight", "layer_norm_affine", "add_rms_norm_weight")


def inputs_for(op: OpCase, builder, *args, param_dtype=None):
    """Inputs of ``op`` on the layout ``builder(*args) -> (x, dim)``; a residual gets the same
    layout (a second call of the builder)."""
    x, dim = builder(*args)
    residual = builder(*args)[0] if op.residual else None
    return op.inputs(x, dim, param_dtype=param_dtype, residual=residual), dim


def _supported_pairs(op_ids, table: dict, probe_args: tuple, cases=None) -> list:
    """pytest params (op id, case) for the cases of ``table`` each op supports (add_rms_norm:
    only those reducing the last dim), probed on a tiny CPU tensor."""
    pairs = []
    for op_id in op_ids:
        for case in cases or table:
            x, dim = table[case](*probe_args)
            if OPS[op_id].supports(x, dim):
                pairs.append(pytest.param(op_id, case, id=f"{op_id}-{case}"))
    return pairs


# Empty tensors: (shape, dim) with no rows, no columns, or neither.
EMPTY_CASES = [((0, 5), -1), ((5, 0), -1), ((0, 0), 1), ((0, 5), 0), ((2, 0, 3), 1), ((0,), 0)]


def empty_cases() -> list:
    """(op_id, (shape, dim)) for every op and every empty case the op accepts."""
    return [
        pytest.param(op_id, (shape, dim), id=f"{op_id}-{shape}-{dim}")
        for op_id, op in OPS.items()
        for shape, dim in EMPTY_CASES
        if op.supports(torch.empty(shape), dim)
    ]


def layout_cases(op_ids, cases=None) -> list:
    return _supported_pairs(op_ids, LAYOUTS, (3, 2, torch.float32, "cpu"), cases)


def dim_cases(op_ids, cases=None) -> list:
    return _supported_pairs(op_ids, DIM_CASES, (2, torch.float32, "cpu"), cases)


def check_grads(op: OpCase, inp, dim: int, dys, got: dict, *, what: str = "") -> None:
    """Every gradient in ``got`` (None: not computed) equals the float64 reference backward,
    errors measured against the terms it is computed from (op.grad_magnitudes).

    The reference takes the parameters in float64 (same values), so that its parameter
    gradients are not rounded to a 16-bit parameter dtype before a float32 one is compared."""
    ref_inp = {k: (v if k in ROW_INPUTS else v.double()) for k, v in inp.items()}
    ref = op.reference_grads(dys, ref_inp, dim)
    mag = op.grad_magnitudes(dys, inp, dim)
    n = inp["x"].shape[dim] if inp["x"].dim() else 0
    for name, g in got.items():
        if g is None:
            continue
        label = f"{op} {what} d{name}"
        if name in ROW_INPUTS:
            assert_new_contiguous(g, inp[name])
            assert_matches(g, ref[name].to(g.dtype), magnitude=mag[name], dim=dim, what=label)
        else:
            assert g.shape == (n,), f"{label}: shape {tuple(g.shape)}"
            assert_matches(g, ref[name].to(g.dtype), magnitude=mag[name], what=label)
