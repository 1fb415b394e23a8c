"""Float64 reference implementations of every rownorm op: the truth tests and benchmarks use.

Each forward takes the arguments of its public function in :mod:`rownorm.functional` (its
signature and defaults), computes in float64 (on x's device) from the given (already rounded)
inputs and returns x's dtype, rounded once. The formulas are written out here, not taken from
``torch.nn.functional``, so that the tests' comparisons with ``F.*`` are a second, independent
check. The forwards stay differentiable for float64 inputs (the benchmark harness takes its
backward reference by float64 autograd of them).

Each ``*_backward`` takes the op's gradient(s) and its INPUTS (x, not a saved output), in the
functional API's argument order, and returns the gradients by float64 autograd of the
reference forward: row gradients rounded once to x's dtype, parameter gradients to the
parameter's dtype (None for a parameter not given).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

import torch

from rownorm import functional as _public
from rownorm._checks import resolve_eps as _resolve_eps  # F.rms_norm's default eps

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _reference_of(public: Callable[_P, _R]) -> Callable[[Callable[..., _R]], Callable[_P, _R]]:
    """The float64 reference of the public function ``public``: it takes ``public``'s
    arguments (its signature, defaults included, for callers and type checkers alike: one
    place, functional.py), passed to the formula positionally in that order."""
    signature = inspect.signature(public)

    def wrap(formula: Callable[..., _R]) -> Callable[_P, _R]:
        names = list(inspect.signature(formula).parameters)
        if names != list(signature.parameters):
            raise TypeError(f"{formula.__name__}{names}: not the arguments of {signature}")

        @functools.wraps(formula)
        def reference(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return formula(*bound.arguments.values())  # bound.args drops keyword-only ones

        reference.__signature__ = signature  # type: ignore[attr-defined]
        return reference

    return wrap


def _along(p: torch.Tensor | None, x: torch.Tensor, dim: int) -> torch.Tensor | None:
    """A ``(x.size(dim),)`` parameter in float64, shaped to broadcast against x along dim."""
    if p is None:
        return None
    shape = [1] * x.dim()
    shape[dim % x.dim()] = -1
    return p.double().reshape(shape)


def _vjp(
    fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]],
    inputs: Sequence[torch.Tensor | None],
    grads: Sequence[torch.Tensor | None],
) -> list[torch.Tensor | None]:
    """Gradients of ``fn(*inputs)`` (computed in float64) for the output gradients ``grads``
    (None: that output gets none); each rounded once to its input's dtype, None for None."""
    leaves = [None if t is None else t.detach().double().requires_grad_(True) for t in inputs]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    used = [(o, g.double()) for o, g in zip(outs, grads, strict=True) if g is not None]
    wrt = [leaf for leaf in leaves if leaf is not None]
    got = iter(
        torch.autograd.grad([o for o, _ in used], wrt, [g for _, g in used], allow_unused=True)
        if used
        else [None] * len(wrt)
    )
    result: list[torch.Tensor | None] = []
    for t, leaf in zip(inputs, leaves, strict=True):
        if t is None:
            result.append(None)
            continue
        g = next(got)
        result.append((torch.zeros_like(leaf) if g is None else g).to(t.dtype))
    return result


# ---- forwards -------------------------------------------------------------------------------


@_reference_of(_public.l2_normalize)
def l2_normalize(x, dim, eps):
    """``x / max(‖x‖₂, eps)`` in float64."""
    x64 = x.double()
    norm = torch.linalg.vector_norm(x64, ord=2, dim=dim, keepdim=True)
    return (x64 / norm.clamp_min(eps)).to(x.dtype)


@_reference_of(_public.l1_normalize)
def l1_normalize(x, dim, eps, mean):
    """``x / max(s, eps)``, ``s = Σ|x|`` (``mean|x|`` when ``mean``), in float64."""
    x64 = x.double()
    s = x64.abs().sum(dim=dim, keepdim=True)
    if mean:
        s = s / x64.shape[dim]
    return (x64 / s.clamp_min(eps)).to(x.dtype)


@_reference_of(_public.rms_norm)
def rms_norm(x, weight, dim, eps, weight_offset, casting_mode):
    """``ŷ · (w + weight_offset)``, ``ŷ = x · rsqrt(mean(x²) + eps)``, in float64 (eps None:
    F.rms_norm's default). ``casting_mode="llama"`` rounds ŷ to x's dtype before the product
    (HF LlamaRMSNorm's ``w * ŷ.to(dtype)``); the product is rounded to x's dtype in both modes.
    The rounding of ŷ is the identity for the float64 inputs of the backward references, so
    their gradients are those of the unrounded formula, as the kernels' are."""
    eps = _resolve_eps(x, eps)
    return _rms(x.double(), weight, dim, eps, weight_offset, casting_mode, x.dtype)


def _rms(x64, weight, dim, eps, weight_offset, casting_mode, dtype):
    """rms_norm of the float64 ``x64`` rounded to ``dtype`` (ŷ too in the "llama" mode)."""
    y = x64 * torch.rsqrt((x64 * x64).mean(dim=dim, keepdim=True) + eps)
    if casting_mode == "llama":
        y = y.to(dtype).double()
    if weight is not None:
        y = y * (_along(weight, x64, dim) + weight_offset)
    return y.to(dtype)


@_reference_of(_public.layer_norm)
def layer_norm(x, weight, bias, dim, eps):
    """``(x − μ) · rsqrt(σ² + eps) · w + b`` in float64, σ² the biased variance over dim."""
    xc = centered(x.double(), dim)
    y = xc * torch.rsqrt((xc * xc).mean(dim=dim, keepdim=True) + eps)
    if weight is not None:
        y = y * _along(weight, x, dim)
    if bias is not None:
        y = y + _along(bias, x, dim)
    return y.to(x.dtype)


def centered(x64: torch.Tensor, dim: int) -> torch.Tensor:
    """``x − mean(x)`` along dim, with the mean taken as ``x₀ + mean(x − x₀)`` (x₀ the row's
    first element): exactly 0 on a constant row (as the kernels and torch have it), where
    ``x − Σx/n`` need not be (``Σx/n`` of a float64 row of 1e100 may round), and a more
    accurate mean wherever the values are far from 0 against their spread."""
    if x64.shape[dim] == 0:
        return x64
    shifted = x64 - x64.narrow(dim, 0, 1)
    return shifted - shifted.mean(dim=dim, keepdim=True)


def _shifted(x64: torch.Tensor, dim: int) -> torch.Tensor:
    """``x − max(x)`` along dim. The max is a constant of the maths (softmax is invariant to
    it), so it is detached; -inf − -inf = NaN gives all -inf rows torch's NaN."""
    if x64.shape[dim] == 0:
        return x64
    return x64 - x64.amax(dim=dim, keepdim=True).detach()


@_reference_of(_public.softmax)
def softmax(x, dim):
    """``exp(x − m) / Σ exp(x − m)`` in float64."""
    e = torch.exp(_shifted(x.double(), dim))
    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)


@_reference_of(_public.log_softmax)
def log_softmax(x, dim):
    """``x − m − log Σ exp(x − m)`` in float64."""
    z = _shifted(x.double(), dim)
    return (z - torch.log(torch.exp(z).sum(dim=dim, keepdim=True))).to(x.dtype)


@_reference_of(_public.add_rms_norm)
def add_rms_norm(x, residual, weight, eps, weight_offset, casting_mode):
    """``(rms_norm(r, weight, -1, eps, weight_offset=..., casting_mode=...), r)`` with
    ``r = x + residual`` as torch computes it: in x's dtype, or in float32 for a float32
    residual with 16-bit x (the residual stream), where the norm is rounded to x's dtype (and
    ``"llama"`` rounds ŷ to it); eps None: F.rms_norm's default (``ops.resolve_eps``)."""
    r = x + residual
    eps = _resolve_eps(x, eps)
    return _rms(r.double(), weight, -1, eps, weight_offset, casting_mode, x.dtype), r


# ---- backwards ------------------------------------------------------------------------------


def l2_normalize_backward(
    grad: torch.Tensor, x: torch.Tensor, dim: int = -1, eps: float = 1e-12
) -> torch.Tensor:
    """Gradient of :func:`l2_normalize` w.r.t. x, by float64 autograd of the reference."""
    (dx,) = _vjp(lambda t: l2_normalize(t, dim, eps), [x], [grad])
    return dx


def l1_normalize_backward(
    grad: torch.Tensor, x: torch.Tensor, dim: int = -1, eps: float = 1e-12, mean: bool = False
) -> torch.Tensor:
    """Gradient of :func:`l1_normalize` w.r.t. x (``sign(0) = 0``; ``dy/eps`` where clamped)."""
    (dx,) = _vjp(lambda t: l1_normalize(t, dim, eps, mean), [x], [grad])
    return dx


def rms_norm_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    dim: int = -1,
    eps: float | None = None,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(dx, dweight)`` of :func:`rms_norm` (either casting mode: the gradient of the
    unrounded formula); dweight None without a weight."""
    eps = _resolve_eps(x, eps)  # x's dtype, not the float64 of the autograd copy
    dx, dw = _vjp(
        lambda t, w: rms_norm(t, w, dim, eps, weight_offset=weight_offset), [x, weight], [grad]
    )
    return dx, dw


def layer_norm_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    dim: int = -1,
    eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(dx, dweight, dbias)`` of :func:`layer_norm`; None for a parameter not given."""
    dx, dw, db = _vjp(lambda t, w, b: layer_norm(t, w, b, dim, eps), [x, weight, bias], [grad])
    return dx, dw, db


def softmax_backward(grad: torch.Tensor, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Gradient of :func:`softmax` w.r.t. its input x (not its output)."""
    (dx,) = _vjp(lambda t: softmax(t, dim), [x], [grad])
    return dx


def log_softmax_backward(grad: torch.Tensor, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Gradient of :func:`log_softmax` w.r.t. its input x (not its output)."""
    (dx,) = _vjp(lambda t: log_softmax(t, dim), [x], [grad])
    return dx


def add_rms_norm_backward(
    grad: torch.Tensor,
    grad_residual: torch.Tensor | None,
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(dx, dresidual, dweight)`` of :func:`add_rms_norm` for the output gradients ``grad``
    (of out) and ``grad_residual`` (of r; None = zeros). dweight None without a weight.

    The norm's gradient is taken at the rounded ``r = x + residual`` the op normalizes; the
    add passes its gradient through, so ``dx = dresidual = grad_residual + d(out)/d(r)``."""
    eps = _resolve_eps(x, eps)
    r = (x + residual).detach()
    dr, dw = _vjp(
        lambda t, w: (rms_norm(t, w, -1, eps, weight_offset=weight_offset), t),
        [r, weight],
        [grad, grad_residual],
    )
    return dr, dr.clone(), dw
