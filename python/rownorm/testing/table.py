"""The rows of the op table: one :class:`~rownorm.testing.opinfo.OpInfo` subclass per op
family, and :data:`OPS`, every case the tests, the self-check, the benchmark and the sanitizer
workload iterate. Adding an op means adding its class and its cases here (its formulas go in
:mod:`rownorm.reference`, which the classes point at).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import rownorm
from rownorm import reference as ref
from rownorm._checks import is_residual_stream
from rownorm.testing.opinfo import TOL, OpInfo, along, moved, sum_rows
from rownorm.testing.samples import randn

# ---- l2_normalize / l1_normalize -------------------------------------------------------------


@dataclass(frozen=True)
class L2Normalize(OpInfo):
    name: str = "l2_normalize"
    torch_in_fp32: bool = True

    def call(self, inp, dim):
        return (rownorm.l2_normalize(inp["x"], dim=dim, eps=self.eps),)

    def raw_args(self, inp, dim):
        return (inp["x"], dim, self.eps)

    def module(self, inp, dim):
        return rownorm.nn.L2Norm(dim=dim, eps=self.eps)

    def reference(self, inp, dim):
        return (ref.l2_normalize(inp["x"], dim, self.eps),)

    def torch_equivalent(self, inp, dim):
        return (F.normalize(inp["x"], p=2.0, dim=dim, eps=self.eps),)

    def reference_grads(self, dys, inp, dim):
        return {"x": ref.l2_normalize_backward(dys[0], inp["x"], dim, self.eps)}

    def grad_magnitudes(self, dys, inp, dim):
        # dx = dy/s − x·Σ(dy⊙x)/s³ with s = max(‖x‖, eps)
        x, dy = inp["x"].double(), dys[0].double().abs()
        s = torch.linalg.vector_norm(x, dim=dim, keepdim=True).clamp_min(self.eps)
        return {"x": dy / s + x.abs() * (dy * x.abs()).sum(dim, keepdim=True) / s**3}

    def backward_args(self, dys, inp, dim, outs, want):
        return (dys[0], inp["x"], dim, self.eps)

    def row_stat(self, out, inp, dim):
        # ‖y‖ = ‖x‖ / max(‖x‖, eps): 1 wherever ‖x‖ >= eps.
        s = torch.linalg.vector_norm(inp["x"].double(), dim=dim)
        stat = torch.linalg.vector_norm(out.double(), dim=dim)
        return stat, s / s.clamp_min(self.eps), TOL[out.dtype].unit


@dataclass(frozen=True)
class L1Normalize(OpInfo):
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
        return (ref.l1_normalize(inp["x"], dim, self.eps, self.mean),)

    def torch_equivalent(self, inp, dim):
        x = inp["x"]
        if self.mean:  # seed 003 (eps=0): x / torch.mean(torch.abs(x), dim=1, keepdim=True)
            s = torch.mean(torch.abs(x), dim=dim, keepdim=True)
            return (x / (s if self.eps == 0 else s.clamp_min(self.eps)),)
        return (F.normalize(x, p=1.0, dim=dim, eps=self.eps),)

    def reference_grads(self, dys, inp, dim):
        return {"x": ref.l1_normalize_backward(dys[0], inp["x"], dim, self.eps, self.mean)}

    def grad_magnitudes(self, dys, inp, dim):
        x, dy = inp["x"].double(), dys[0].double().abs()
        d = x.shape[dim] if self.mean else 1
        s = (x.abs().sum(dim, keepdim=True) / d).clamp_min(self.eps)
        return {"x": dy / s + (dy * x.abs()).sum(dim, keepdim=True) / (s * s * d)}

    def backward_args(self, dys, inp, dim, outs, want):
        return (dys[0], inp["x"], dim, self.eps, self.mean)

    def row_stat(self, out, inp, dim):
        # Σ|y| = S / max(S, eps) (mean|y| with mean=True): 1 wherever S >= eps.
        reduce = torch.mean if self.mean else torch.sum
        s = reduce(inp["x"].double().abs(), dim)
        return reduce(out.double().abs(), dim), s / s.clamp_min(self.eps), TOL[out.dtype].unit


# ---- rms_norm / add_rms_norm ----------------------------------------------------------------


def _rms_magnitudes(dy, r, w, dim, eps, extra=None, weight_offset=0.0):
    """|terms| of rms_norm's backward at r: dx = rstd·(g − ŷ·mean(ŷ⊙g)) with
    g = (w + weight_offset)⊙dy, dw = Σ dy⊙ŷ."""
    r, dy = r.double(), dy.double()
    rstd = torch.rsqrt((r * r).mean(dim, keepdim=True) + eps)
    yhat = r * rstd
    g = dy.abs() if w is None else (dy * along(w.double() + weight_offset, r, dim)).abs()
    mag = {"x": rstd * (g + yhat.abs() * (yhat.abs() * g).mean(dim, keepdim=True))}
    if extra is not None:
        mag["x"] = mag["x"] + extra.double().abs()
    if w is not None:
        mag["weight"] = sum_rows((dy * yhat).abs(), dim)
    return mag


def _rms_stat(out, x, dim, eps):
    # Without a weight, rms(y) = sqrt(ms / (ms + eps)) with ms = mean(x²): ≈ 1 where ms >> eps.
    x = x.double()
    ms = (x * x).mean(dim)
    stat = out.double().square().mean(dim).sqrt()
    return stat, (ms / (ms + eps)).sqrt(), TOL[out.dtype].unit


def _torch_rms(t, w, eps, weight_offset, casting_mode):
    """The PyTorch expressions of rms_norm's options over the last dim, as Hugging Face's
    models write them: Gemma's ``(ŷ * (1 + w.float())).type_as(x)`` (casting mode "once") and
    LlamaRMSNorm's ``w * ŷ.to(x.dtype)`` ("llama"), ŷ computed in float32 (float64 for
    float64 x)."""
    acc = torch.promote_types(t.dtype, torch.float32)
    yhat = F.rms_norm(t.to(acc), (t.shape[-1],), None, eps)
    if w is None:  # the case without its parameters: no offset (checked), ŷ rounded once
        return yhat.to(t.dtype)
    if casting_mode == "llama":
        scale = w if weight_offset == 0 else w.to(acc) + weight_offset  # no rounded w + c
        return scale * yhat.to(t.dtype)
    return (yhat * (w.to(acc) + weight_offset)).to(t.dtype)


class _RmsOptions:
    """rms_norm's and add_rms_norm's keyword options of a case (``options``)."""

    options: dict

    @property
    def weight_offset(self) -> float:
        return self.options.get("weight_offset", 0.0)

    @property
    def casting_mode(self) -> str:
        return self.options.get("casting_mode", "once")

    def without_params(self):
        options = {k: v for k, v in self.options.items() if k != "weight_offset"}
        return dataclasses.replace(self, params=(), options=options)

    def _torch_norm(self, t, w, eps):
        if not self.options:
            return F.rms_norm(t, (t.shape[-1],), w, eps)
        return _torch_rms(t, w, eps, self.weight_offset, self.casting_mode)


def _rms_module(cls, x, w, eps, n, **kw):
    m = cls(n, eps=eps, elementwise_affine=w is not None, device=x.device,
            dtype=x.dtype if w is None else w.dtype, **kw)  # fmt: skip
    if w is not None:
        with torch.no_grad():
            m.weight.copy_(w)
    return m


@dataclass(frozen=True)
class RmsNorm(_RmsOptions, OpInfo):
    name: str = "rms_norm"
    torch_cuda_nan_inf_rows: bool = True

    def call(self, inp, dim):
        return (rownorm.rms_norm(inp["x"], inp.get("weight"), dim=dim, eps=self.eps,
                                 **self.options),)  # fmt: skip

    def raw_args(self, inp, dim):
        x, w = inp["x"], inp.get("weight")
        return (x, w, dim, self.eps, self.weight_offset, self.casting_mode)

    def module(self, inp, dim):
        x = inp["x"]
        return _rms_module(rownorm.nn.RMSNorm, x, inp.get("weight"), self.eps, x.shape[dim],
                           dim=dim, **self.options)  # fmt: skip

    def reference(self, inp, dim):
        x, w = inp["x"], inp.get("weight")
        return (ref.rms_norm(x, w, dim, self.eps, **self.options),)

    def torch_equivalent(self, inp, dim):
        w = inp.get("weight")
        return (moved(lambda t: self._torch_norm(t, w, self.eps), inp["x"], dim),)

    def reference_grads(self, dys, inp, dim):
        x, w = inp["x"], inp.get("weight")
        dx, dw = ref.rms_norm_backward(dys[0], x, w, dim, self.eps, self.weight_offset)
        return {"x": dx} if dw is None else {"x": dx, "weight": dw}

    def grad_magnitudes(self, dys, inp, dim):
        x = inp["x"]
        return _rms_magnitudes(dys[0], x, inp.get("weight"), dim, self.resolved_eps(x),
                               weight_offset=self.weight_offset)  # fmt: skip

    def backward_args(self, dys, inp, dim, outs, want):
        x = inp["x"]
        return (dys[0], x, inp.get("weight"), dim, self.resolved_eps(x), "weight" in want,
                self.weight_offset)  # fmt: skip

    def unpack_backward(self, result, inp):
        dx, dw = result
        return {"x": dx, "weight": dw}

    def row_stat(self, out, inp, dim):
        if "weight" in inp:
            return None
        return _rms_stat(out, inp["x"], dim, self.resolved_eps(inp["x"]))


@dataclass(frozen=True)
class AddRmsNorm(_RmsOptions, OpInfo):
    name: str = "add_rms_norm"
    torch_cuda_nan_inf_rows: bool = True
    residual: bool = True
    last_dim_only: bool = True
    n_outputs: int = 2
    # The float32 residual stream: a 16-bit x's residual (and so r and its gradient) float32.
    float32_residual: bool = False

    def inputs(self, x, dim, *, param_dtype=None, residual=None, generator=None):
        inp = super().inputs(
            x, dim, param_dtype=param_dtype, residual=residual, generator=generator
        )
        if self.float32_residual and x.dtype in (torch.float16, torch.bfloat16):
            if residual is not None:
                inp["residual"] = residual.float()
            else:
                inp["residual"] = randn(x.shape, torch.float32, x.device, generator)
        return inp

    def output_like(self, inp, i):
        return inp["residual"] if i == 1 else inp["x"]

    def call(self, inp, dim):
        return rownorm.add_rms_norm(inp["x"], inp["residual"], inp.get("weight"), eps=self.eps,
                                    **self.options)  # fmt: skip

    def raw_args(self, inp, dim):
        x, res, w = inp["x"], inp["residual"], inp.get("weight")
        return (x, res, w, self.eps, self.weight_offset, self.casting_mode)

    def module(self, inp, dim):
        x = inp["x"]
        return _rms_module(rownorm.nn.AddRMSNorm, x, inp.get("weight"), self.eps, x.shape[-1],
                           **self.options)  # fmt: skip

    def reference(self, inp, dim):
        x, res, w = inp["x"], inp["residual"], inp.get("weight")
        return ref.add_rms_norm(x, res, w, self.eps, **self.options)

    def torch_equivalent(self, inp, dim):
        r = inp["x"] + inp["residual"]
        return self._torch_norm(r, inp.get("weight"), self.eps), r

    def reference_grads(self, dys, inp, dim):
        dx, dres, dw = ref.add_rms_norm_backward(
            dys[0], dys[1], inp["x"], inp["residual"], inp.get("weight"), self.eps,
            self.weight_offset,
        )  # fmt: skip
        return {"x": dx, "residual": dres} | ({} if dw is None else {"weight": dw})

    def grad_magnitudes(self, dys, inp, dim):
        x = inp["x"]
        r = x + inp["residual"]
        dy_r = dys[1] if dys[1] is not None else torch.zeros_like(r)
        if dys[0] is None:
            mag = {"x": dy_r.double().abs()}
        else:
            w = inp.get("weight")
            mag = _rms_magnitudes(dys[0], r, w, -1, self.resolved_eps(x), extra=dy_r,
                                  weight_offset=self.weight_offset)  # fmt: skip
        mag["residual"] = mag["x"]
        return mag

    def backward_args(self, dys, inp, dim, outs, want):
        eps = self.resolved_eps(inp["x"])
        w = inp.get("weight")
        return (dys[0], dys[1], outs[1], w, eps, "weight" in want, self.weight_offset)

    def backward_op_for(self, inp):
        if is_residual_stream(inp["x"], inp["residual"]):
            return torch.ops.rownorm.add_rms_norm_stream_backward.default
        return self.backward_op

    def unpack_backward(self, result, inp):
        if len(result) == 3:  # the float32 residual stream's op: x's gradient in x's dtype
            dr, dx, dw = result
        else:  # d_r has r's dtype, which is x's
            (dr, dw), dx = result, result[0]
        return {"x": dx, "residual": dr, "weight": dw}

    def row_stat(self, out, inp, dim):
        if "weight" in inp:
            return None
        return _rms_stat(out, inp["x"] + inp["residual"], -1, self.resolved_eps(inp["x"]))


# ---- layer_norm -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerNorm(OpInfo):
    name: str = "layer_norm"
    eps: float = 1e-5

    def call(self, inp, dim):
        x, w, b = inp["x"], inp.get("weight"), inp.get("bias")
        return (rownorm.layer_norm(x, w, b, dim=dim, eps=self.eps),)

    def raw_args(self, inp, dim):
        return (inp["x"], inp.get("weight"), inp.get("bias"), dim, self.eps)

    def module(self, inp, dim):
        x, w, b = inp["x"], inp.get("weight"), inp.get("bias")
        if w is None and b is not None:
            return None  # a module has no bias without a weight
        m = rownorm.nn.LayerNorm(x.shape[dim], eps=self.eps, elementwise_affine=w is not None,
                                 bias=b is not None, dim=dim, device=x.device,
                                 dtype=x.dtype if w is None else w.dtype)  # fmt: skip
        with torch.no_grad():
            if w is not None:
                m.weight.copy_(w)
            if b is not None:
                m.bias.copy_(b)
        return m

    def reference(self, inp, dim):
        return (ref.layer_norm(inp["x"], inp.get("weight"), inp.get("bias"), dim, self.eps),)

    def torch_equivalent(self, inp, dim):
        w, b = inp.get("weight"), inp.get("bias")
        fn = lambda t: F.layer_norm(t, (t.shape[-1],), w, b, self.eps)  # noqa: E731
        return (moved(fn, inp["x"], dim),)

    def reference_grads(self, dys, inp, dim):
        x, w, b = inp["x"], inp.get("weight"), inp.get("bias")
        dx, dw, db = ref.layer_norm_backward(dys[0], x, w, b, dim, self.eps)
        grads = {"x": dx, "weight": dw, "bias": db}
        return {k: v for k, v in grads.items() if v is not None}

    def grad_magnitudes(self, dys, inp, dim):
        x, dy, w = inp["x"].double(), dys[0].double(), inp.get("weight")
        xc = ref.centered(x, dim)
        rstd = torch.rsqrt((xc * xc).mean(dim, keepdim=True) + self.eps)
        yhat = xc * rstd
        g = dy.abs() if w is None else (dy * along(w.double(), x, dim)).abs()
        mean_g = g.mean(dim, keepdim=True)
        mag = {"x": rstd * (g + mean_g + yhat.abs() * (yhat.abs() * g).mean(dim, keepdim=True))}
        if w is not None:
            # ŷ carries the mean's rounding error (see _mean_error_scale), which is all of ŷ
            # in a constant row; dweight sums it.
            noise = self._mean_error_scale(inp["x"], dim) * TOL[x.dtype].atol / TOL[w.dtype].atol
            mag["weight"] = sum_rows((dy * (yhat.abs() + noise)).abs(), dim)
        if "bias" in inp:
            mag["bias"] = sum_rows(dy.abs(), dim)
        return mag

    def backward_args(self, dys, inp, dim, outs, want):
        x, w = inp["x"], inp.get("weight")
        # The backward reads the forward's per-row (mean, rstd), as autograd passes them (they do
        # not depend on the parameters). Where the forward rejects x, dim or eps (the error
        # tests), so does the backward before it reads the statistics: any tensor stands in.
        try:
            stats = torch.ops.rownorm.layer_norm_with_stats(x, None, None, dim, self.eps)[1]
        except RuntimeError:
            stats = torch.empty(0, device=x.device)
        return (dys[0], x, stats, w, dim, "weight" in want, "bias" in want)

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
        xc = ref.centered(x64, dim)
        rstd = torch.rsqrt((xc * xc).mean(dim, keepdim=True) + self.eps)
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        return TOL[acc].atol / TOL[x.dtype].atol * x64.abs() * rstd

    def output_magnitude(self, inp, dim, r):
        scale = self._mean_error_scale(inp["x"], dim)
        if "weight" in inp:
            scale = scale * along(inp["weight"].double().abs(), inp["x"], dim)
        return r.double().abs() + scale

    def row_stat(self, out, inp, dim):
        if "weight" in inp or "bias" in inp:
            return None
        # Without affine: mean(y) = 0 and var(y) = var / (var + eps) (≈ 1 where var >> eps).
        x, y = inp["x"].double(), out.double()
        # The variance of x minus its first element: the same value, without the cancellation
        # of a huge mean (a constant row of 1.3e14 gave 1e-4 on the CPU instead of 0).
        var = (x - x.narrow(dim, 0, 1)).var(dim, unbiased=False)
        unit = TOL[out.dtype].unit
        mean_bound = unit + TOL[out.dtype].atol * self._mean_error_scale(x, dim).mean(dim)
        stat = torch.stack([y.mean(dim), y.var(dim, unbiased=False)])
        expected = torch.stack([torch.zeros_like(var), var / (var + self.eps)])
        return stat, expected, torch.stack([mean_bound, torch.full_like(var, unit)])


# ---- softmax / log_softmax ------------------------------------------------------------------


@dataclass(frozen=True)
class Softmax(OpInfo):
    name: str = "softmax"
    has_eps: bool = False
    backward_reads_output: bool = True

    @property
    def log(self) -> bool:
        return self.name == "log_softmax"

    def call(self, inp, dim):
        return ((rownorm.log_softmax if self.log else rownorm.softmax)(inp["x"], dim=dim),)

    def raw_args(self, inp, dim):
        return (inp["x"], dim)

    def module(self, inp, dim):
        return (rownorm.nn.LogSoftmax if self.log else rownorm.nn.Softmax)(dim)

    def reference(self, inp, dim):
        return ((ref.log_softmax if self.log else ref.softmax)(inp["x"], dim),)

    def torch_equivalent(self, inp, dim):
        return ((torch.log_softmax if self.log else torch.softmax)(inp["x"], dim),)

    def reference_grads(self, dys, inp, dim):
        fn = ref.log_softmax_backward if self.log else ref.softmax_backward
        return {"x": fn(dys[0], inp["x"], dim)}

    def grad_magnitudes(self, dys, inp, dim):
        p = torch.softmax(inp["x"].double(), dim)
        dy = dys[0].double().abs()
        if self.log:
            # The backward reads the ROUNDED output y = log p: exp(y) then carries a relative
            # error of ~rtol·|y|, so the term exp(y)·Σdy is as uncertain as p·(1 + |log p|).
            log_p = torch.log_softmax(inp["x"].double(), dim).abs()
            weight = torch.where(p > 0, p * (1 + log_p), 0.0)
            return {"x": dy + weight * dy.sum(dim, keepdim=True)}
        # The backward reads the ROUNDED output y = p, whose error is relative down to the
        # dtype's smallest normal number and absolute below it (1/N rows in fp16).
        p = p.clamp_min(torch.finfo(inp["x"].dtype).tiny)
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


# ---- the table ------------------------------------------------------------------------------

OPS: dict[str, OpInfo] = {
    op.id: op
    for op in (
        L2Normalize("l2_normalize", eps=1e-12),
        L1Normalize("l1", eps=1e-12),
        L1Normalize("mean_abs", eps=1e-12, options={"mean": True}),
        RmsNorm("rms_norm"),
        RmsNorm("rms_norm_weight", params=("weight",), eps=1e-5),
        # Gemma's (1 + w), and Hugging Face Llama's cast of ŷ before the weight.
        RmsNorm("rms_norm_offset", params=("weight",), eps=1e-6, options={"weight_offset": 1.0}),
        RmsNorm("rms_norm_llama", params=("weight",), eps=1e-6, options={"casting_mode": "llama"}),
        LayerNorm("layer_norm"),
        LayerNorm("layer_norm_affine", params=("weight", "bias")),
        Softmax("softmax"),
        Softmax("log_softmax", name="log_softmax"),
        AddRmsNorm("add_rms_norm"),
        AddRmsNorm("add_rms_norm_weight", params=("weight",), eps=1e-6),
        AddRmsNorm(
            "add_rms_norm_offset_llama",
            params=("weight",),
            eps=1e-6,
            options={"weight_offset": 1.0, "casting_mode": "llama"},
        ),
        # The float32 residual stream (16-bit x; other dtypes: as add_rms_norm_weight).
        AddRmsNorm(
            "add_rms_norm_fp32_residual", params=("weight",), eps=1e-6, float32_residual=True
        ),
    )
}


def families() -> dict[str, OpInfo]:
    """One case per registered op, the one with every differentiable input (the most
    parameters): for the axes that cost too much to cross with every case."""
    best: dict[str, OpInfo] = {}
    for op in OPS.values():
        if op.name not in best or len(op.params) > len(best[op.name].params):
            best[op.name] = op
    return {op.id: op for op in best.values()}


def op_names() -> tuple[str, ...]:
    """Every registered forward op of the table (torch.ops.rownorm.<name>), in table order."""
    return tuple(dict.fromkeys(op.name for op in OPS.values()))
