"""``torch.nn.Module`` wrappers of the rownorm ops."""

from __future__ import annotations

import torch

from rownorm import functional as F


class L2Norm(torch.nn.Module):
    """``y = x / max(‖x‖₂, eps)`` along ``dim`` (see :func:`rownorm.l2_normalize`)."""

    def __init__(self, dim: int = -1, eps: float = 1e-12) -> None:
        super().__init__()
        if eps < 0:
            raise ValueError(f"L2Norm: eps must be >= 0, got {eps}")
        self.dim = dim
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.l2_normalize(x, self.dim, self.eps)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}"
