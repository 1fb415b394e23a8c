"""Float64 reference implementations of every rownorm op: the truth tests and benchmarks use.

Each function computes in float64 (on x's device) and returns x's dtype, rounded once.
"""

from __future__ import annotations

import torch


def l2_normalize(x: torch.Tensor, dim: int = -1, eps: float = 1e-12) -> torch.Tensor:
    """``x / max(‖x‖₂, eps)`` in float64."""
    x64 = x.double()
    norm = torch.linalg.vector_norm(x64, ord=2, dim=dim, keepdim=True)
    return (x64 / norm.clamp_min(eps)).to(x.dtype)


def l2_normalize_backward(
    grad: torch.Tensor, x: torch.Tensor, dim: int = -1, eps: float = 1e-12
) -> torch.Tensor:
    """Gradient of :func:`l2_normalize` w.r.t. x, by float64 autograd of the reference."""
    x64 = x.detach().double().requires_grad_(True)
    norm = torch.linalg.vector_norm(x64, ord=2, dim=dim, keepdim=True)
    y = x64 / norm.clamp_min(eps)
    (gx,) = torch.autograd.grad(y, x64, grad.double())
    return gx.to(x.dtype)
