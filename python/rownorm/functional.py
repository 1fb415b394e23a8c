"""Public functional API of rownorm (thin typed wrappers over ``torch.ops.rownorm``; in eager
code with plain tensors they call the op below its Python autograd kernel: ``ops.call``).

Every op reduces over one dimension ``dim`` of a tensor of any rank ≥ 1 (the other dims are
rows), accumulates in float32 (float64 for float64 inputs) and rounds its output once to
``x.dtype``; outputs are new contiguous tensors of ``x``'s shape and dtype. ``weight`` /
``bias`` have shape ``(x.size(dim),)`` and may be float32 while ``x`` is float16 / bfloat16;
a parameter of another floating dtype is converted exactly to the one it runs in (x's, or
float32 for 16-bit x), and a float64 one, which would be rounded, needs float64 ``x``.
All ops are differentiable (first order; only :func:`l2_normalize` has a double backward).
"""

from __future__ import annotations

import torch

from rownorm.ops import call


def _check_dense(op: str, t: torch.Tensor, name: str = "x") -> None:
    # Non-tensors and sparse tensors: say so before the dispatcher's generic error.
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"{op}: {name} must be a dense (strided) tensor, got layout {t.layout}")


def l2_normalize(x: torch.Tensor, dim: int = -1, eps: float = 1e-12) -> torch.Tensor:
    r"""L2-normalizes ``x`` along ``dim``: ``y = x / max(‖x‖₂, eps)``.

    Same result as ``torch.nn.functional.normalize(x, p=2, dim=dim, eps=eps)``; with
    ``eps=0`` it is ``x / torch.norm(x, p=2, dim=dim, keepdim=True)`` (a zero row gives NaN,
    as that expression does). The sum of squares is accumulated in float32 (float64 for
    float64 inputs) and the output rounded once to ``x.dtype``.

    Backward (recomputing ``n = max(‖x‖₂, eps)`` from x in the same pass that reads ``dy``):
    ``dx = (dy − y·Σ(dy⊙y)) / n`` where the norm was not clamped, ``dx = dy / eps`` where it was.

    Args:
        x: float32, float16, bfloat16 or float64 tensor of any rank ≥ 1, on CPU or CUDA.
        dim: the dimension reduced over (negative counts from the end).
        eps: lower bound of the norm, ≥ 0.

    Returns:
        A new contiguous tensor of ``x``'s shape and dtype.
    """
    _check_dense("l2_normalize", x)
    return call("l2_normalize", x, dim, eps)


def l1_normalize(
    x: torch.Tensor, dim: int = -1, eps: float = 1e-12, mean: bool = False
) -> torch.Tensor:
    r"""L1-normalizes ``x`` along ``dim``: ``y = x / max(s, eps)`` with ``s = Σ|x|``, or
    ``s = mean|x| = Σ|x| / D`` when ``mean=True`` (D = ``x.size(dim)``).

    ``mean=False`` is ``torch.nn.functional.normalize(x, p=1, dim=dim, eps=eps)``;
    ``mean=True, eps=0`` is ``x / torch.mean(torch.abs(x), dim=dim, keepdim=True)`` (a zero row
    gives NaN, as that expression does). ``s`` is accumulated in float32 (float64 for float64
    inputs) and the output rounded once to ``x.dtype``.

    Backward (recomputing ``s`` from x in the pass that reads ``dy``), with D' = 1 (sum) or D
    (mean): ``dx = dy/s − sign(x)·Σ(dy⊙x) / (s²·D')`` where ``s ≥ eps``, ``dx = dy/eps`` where
    ``s`` was clamped (``sign(0) = 0``, as torch's ``abs`` derivative).

    Args:
        x: float32, float16, bfloat16 or float64 tensor of any rank ≥ 1, on CPU or CUDA.
        dim: the dimension reduced over (negative counts from the end).
        eps: lower bound of ``s``, ≥ 0.
        mean: divide by the mean of ``|x|`` instead of its sum.

    Returns:
        A new contiguous tensor of ``x``'s shape and dtype.
    """
    _check_dense("l1_normalize", x)
    return call("l1_normalize", x, dim, eps, mean)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    dim: int = -1,
    eps: float | None = None,
    *,
    weight_offset: float = 0.0,
    casting_mode: str = "once",
) -> torch.Tensor:
    r"""RMS-normalizes ``x`` along ``dim``: ``y = ŷ · (w + weight_offset)``,
    ``ŷ = x · rsqrt(mean(x²) + eps)``.

    Over the last dim, ``torch.nn.functional.rms_norm(x, (x.size(-1),), weight, eps)``
    (``w = 1`` without a weight); over another dim, the same with that dim moved last. With
    ``eps=None`` it uses what ``F.rms_norm`` uses: ``torch.finfo(torch.float32).eps`` (float64
    x: ``finfo(float64)``).

    ``weight_offset``: Gemma's ``(1 + w)`` is ``weight_offset=1.0``; ``w + weight_offset`` is
    formed in float32 inside the kernel (a bf16 ``1 + w`` made beforehand would be rounded, and
    cost another pass). ``casting_mode`` says where the result is rounded to ``x.dtype``:

    * ``"once"`` (default): ``ŷ · (w + weight_offset)`` in float32, rounded once (Gemma's
      ``(ŷ * (1 + w.float())).type_as(x)``);
    * ``"llama"``: ``ŷ`` rounded to ``x.dtype`` first, then multiplied by the weight and rounded
      again: Hugging Face's LlamaRMSNorm ``weight * ŷ.to(input_dtype)`` (bit-equal for a weight
      in x's dtype).

    The output has ``x``'s dtype also for a float32 weight with float16/bfloat16 ``x``, where
    torch's type promotion (``F.rms_norm``'s composite, or LlamaRMSNorm's ``weight * ...``)
    returns float32.

    Backward, with ``r = rsqrt(mean(x²) + eps)``, ``ŷ = x·r``, ``g = (w + weight_offset)⊙dy``
    (recomputing r in the pass that reads ``dy``): ``dx = r·(g − ŷ·mean(ŷ⊙g))``;
    ``dweight = Σ_rows dy⊙ŷ`` (deterministic float32 partial sums, cast to ``weight.dtype``).
    In both casting modes it is the gradient of the unrounded formula.

    Args:
        x: float32, float16, bfloat16 or float64 tensor of any rank ≥ 1, on CPU or CUDA.
        weight: optional scale of shape ``(x.size(dim),)`` on x's device, in x's dtype or
            float32.
        dim: the dimension reduced over (negative counts from the end).
        eps: added to the mean square, ≥ 0; None: F.rms_norm's default (the float32 epsilon;
            float64's for float64 x).
        weight_offset: added to the weight (needs a weight when nonzero).
        casting_mode: ``"once"`` or ``"llama"`` (see above).

    Returns:
        A new contiguous tensor of ``x``'s shape and dtype.
    """
    _check_dense("rms_norm", x)
    return call("rms_norm", x, weight, dim, eps, weight_offset, casting_mode)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    dim: int = -1,
    eps: float = 1e-5,
) -> torch.Tensor:
    r"""Layer-normalizes ``x`` along ``dim``: ``y = (x − μ) · rsqrt(σ² + eps) · w + b``.

    ``μ`` and the biased variance ``σ²`` are taken over ``dim`` (two-pass, numerically stable).
    Over the last dim, ``torch.nn.functional.layer_norm(x, (x.size(-1),), weight, bias, eps)``
    (``w = 1``, ``b = 0`` when not given); over another dim, the same with that dim moved
    last. The output has ``x``'s dtype also for float32 parameters with 16-bit ``x``.

    Backward, with ``r = rsqrt(σ² + eps)``, ``ŷ = (x − μ)·r``, ``g = w⊙dy`` (recomputing μ and
    r in the pass that reads ``dy``): ``dx = r·(g − mean(g) − ŷ·mean(ŷ⊙g))``;
    ``dweight = Σ_rows dy⊙ŷ``, ``dbias = Σ_rows dy`` (deterministic float32 partial sums,
    cast to the parameter's dtype).

    Args:
        x: float32, float16, bfloat16 or float64 tensor of any rank ≥ 1, on CPU or CUDA.
        weight: optional scale of shape ``(x.size(dim),)`` on x's device, in x's dtype or
            float32.
        bias: optional shift, like ``weight``.
        dim: the dimension reduced over (negative counts from the end).
        eps: added to the variance, ≥ 0.

    Returns:
        A new contiguous tensor of ``x``'s shape and dtype.
    """
    _check_dense("layer_norm", x)
    return call("layer_norm", x, weight, bias, dim, eps)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    r"""Softmax of ``x`` along ``dim``: ``y = exp(x − m) / Σ exp(x − m)``, ``m = max(x)``.

    Same result as ``torch.softmax(x, dim)``, including rows with ``-inf`` (zero weight),
    rows that are all ``-inf`` (NaN) and rows with ``+inf`` (NaN), as torch gives.

    Backward, from the saved output ``y``: ``dx = y⊙(dy − Σ dy⊙y)``.

    Args:
        x: float32, float16, bfloat16 or float64 tensor of any rank ≥ 1, on CPU or CUDA.
        dim: the dimension reduced over (negative counts from the end).

    Returns:
        A new contiguous tensor of ``x``'s shape and dtype.
    """
    _check_dense("softmax", x)
    return call("softmax", x, dim)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    r"""Log-softmax of ``x`` along ``dim``: ``y = x − m − log Σ exp(x − m)``, ``m = max(x)``.

    Same result as ``torch.log_softmax(x, dim)``, including ``±inf`` entries and all-``-inf``
    rows as torch handles them.

    Backward, from the saved output ``y``: ``dx = dy − exp(y)·Σ dy``.

    Args:
        x: float32, float16, bfloat16 or float64 tensor of any rank ≥ 1, on CPU or CUDA.
        dim: the dimension reduced over (negative counts from the end).

    Returns:
        A new contiguous tensor of ``x``'s shape and dtype.
    """
    _check_dense("log_softmax", x)
    return call("log_softmax", x, dim)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    weight_offset: float = 0.0,
    casting_mode: str = "once",
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Residual add + RMSNorm over the last dim (a pre-norm transformer block), fused:
    ``r = x + residual``; ``out = rms_norm(r, weight, eps=eps, weight_offset=weight_offset,
    casting_mode=casting_mode)``; returns ``(out, r)``.

    Same result as ``r = x + residual; (F.rms_norm(r, (r.size(-1),), weight, eps), r)``:
    ``r`` is rounded to ``x.dtype`` (as torch's ``x + residual`` is) and ``out`` is the norm of
    that rounded ``r``. With ``eps=None`` it uses F.rms_norm's default (the float32 epsilon;
    float64's for float64 x); ``weight_offset`` and ``casting_mode`` as in :func:`rms_norm`.
    One pass reads ``x`` and ``residual`` and writes ``out`` and ``r``.

    The float32 residual stream (pre-norm models that keep the residual in float32 for
    stability): with a float16 / bfloat16 ``x`` the residual may be float32. Then ``r = x +
    residual`` is float32 (torch's promotion, computed in the same pass; x is read as stored)
    and ``out``, the norm of that float32 ``r``, has x's dtype (rounded once; in the
    ``"llama"`` mode ŷ is rounded to x's dtype first), where ``F.rms_norm`` of the float32
    ``r`` would return float32.

    Backward, given ``dout`` and ``dr`` (the gradient reaching ``r`` directly, e.g. through the
    next block's residual stream): ``d(x) = d(residual) = dr + rms_norm's dx(dout, r)``, and
    ``dweight = Σ_rows dout⊙ŷ``. On the float32 residual stream the pass that reads ``dout``
    as stored writes both: ``d(residual)`` in float32 and ``d(x)``, its rounding to x's dtype
    (``torch.ops.rownorm.add_rms_norm_stream_backward``).

    Args:
        x: float32, float16, bfloat16 or float64 tensor of any rank ≥ 1, on CPU or CUDA.
        residual: a tensor of x's shape and device, in x's dtype or (16-bit x) float32.
        weight: optional scale of shape ``(x.size(-1),)`` on x's device, in x's dtype or
            float32.
        eps: added to the mean square, ≥ 0; None: F.rms_norm's default (the float32 epsilon;
            float64's for float64 x).
        weight_offset: added to the weight (needs a weight when nonzero).
        casting_mode: ``"once"`` or ``"llama"`` (see :func:`rms_norm`).

    Returns:
        ``(out, r)``: two new contiguous tensors of ``x``'s shape, ``out`` in x's dtype and
        ``r`` in the residual's.
    """
    _check_dense("add_rms_norm", x)
    _check_dense("add_rms_norm", residual, "residual")
    return call("add_rms_norm", x, residual, weight, eps, weight_offset, casting_mode)
