"""Public functional API of rownorm (thin typed wrappers over ``torch.ops.rownorm``)."""

from __future__ import annotations

import torch


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
    if x.layout != torch.strided:
        raise ValueError(f"l2_normalize: x must be a dense (strided) tensor, got layout {x.layout}")
    return torch.ops.rownorm.l2_normalize(x, dim, eps)
