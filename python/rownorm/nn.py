"""``torch.nn.Module`` wrappers of the rownorm ops.

:class:`RMSNorm` and :class:`LayerNorm` take the constructor arguments of ``torch.nn.RMSNorm``
/ ``torch.nn.LayerNorm`` and hold the same parameters (``weight``, ``bias``: same names,
shapes and initialization), so a ``state_dict`` loads unchanged in either direction; they
normalize over ONE dim (the last by default, any other with ``dim=``).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from rownorm import functional as F
from rownorm._checks import CASTING_MODES


def _normalized_shape(module: str, normalized_shape: int | Sequence[int]) -> tuple[int]:
    """``normalized_shape`` of a torch norm module as a 1-tuple (rownorm normalizes one dim)."""
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    shape = tuple(int(s) for s in normalized_shape)
    if len(shape) != 1:
        raise ValueError(
            f"{module}: only one normalized dim is supported: normalized_shape must be an int or "
            f"have one element, got {shape}. Flatten the normalized dims into one first."
        )
    return shape  # type: ignore[return-value]


def _check_size(module: str, x: torch.Tensor, dim: int, normalized_shape: tuple[int]) -> None:
    """x.size(dim) is the normalized size, as torch's modules check (the op checks a weight's
    shape, but without one any size would pass); a bad dim is left to the op's message.

    A plain ``if`` rather than ``torch._check``: dynamo cannot trace a message closure that
    reads a tensor, and the guard it adds here is one the weight's shape implies anyway."""
    if -x.dim() <= dim < x.dim() and x.shape[dim] != normalized_shape[0]:
        raise RuntimeError(
            f"{module}: expected x.size({dim}) == {normalized_shape[0]} (normalized_shape="
            f"{normalized_shape}), got x of shape {tuple(x.shape)}"
        )


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


class L1Norm(torch.nn.Module):
    """``y = x / max(Σ|x|, eps)`` (``mean|x|`` when ``mean``) along ``dim`` (see
    :func:`rownorm.l1_normalize`)."""

    def __init__(self, dim: int = -1, eps: float = 1e-12, mean: bool = False) -> None:
        super().__init__()
        if eps < 0:
            raise ValueError(f"L1Norm: eps must be >= 0, got {eps}")
        self.dim = dim
        self.eps = eps
        self.mean = mean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.l1_normalize(x, self.dim, self.eps, self.mean)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}, mean={self.mean}"


class Softmax(torch.nn.Module):
    """``torch.softmax(x, dim)`` (see :func:`rownorm.softmax`)."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """``torch.log_softmax(x, dim)`` (see :func:`rownorm.log_softmax`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(x, self.dim)


class _RMSNormBase(torch.nn.Module):
    """What :class:`RMSNorm` and :class:`AddRMSNorm` share: torch.nn.RMSNorm's arguments,
    attributes and ``weight`` (shape ``normalized_shape``, None without affine; initialized to
    ``1 − weight_offset``, so that the scale ``weight + weight_offset`` starts at 1: ones, or
    zeros for Gemma's ``weight_offset=1``), plus ``weight_offset`` and ``casting_mode``."""

    __constants__ = [
        "normalized_shape",
        "eps",
        "elementwise_affine",
        "weight_offset",
        "casting_mode",
    ]
    normalized_shape: tuple[int]
    eps: float | None
    elementwise_affine: bool
    weight_offset: float
    casting_mode: str

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        weight_offset: float = 0.0,
        casting_mode: str = "once",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self.normalized_shape = _normalized_shape(name, normalized_shape)
        if eps is not None and eps < 0:
            raise ValueError(f"{name}: eps must be >= 0, got {eps}")
        if weight_offset != 0 and not elementwise_affine:
            raise ValueError(
                f"{name}: weight_offset needs a weight (elementwise_affine=True), got "
                f"weight_offset={weight_offset}"
            )
        if casting_mode not in CASTING_MODES:
            raise ValueError(
                f"{name}: casting_mode must be one of {CASTING_MODES}, got {casting_mode!r}"
            )
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight_offset = float(weight_offset)
        self.casting_mode = casting_mode
        if elementwise_affine:
            self.weight = torch.nn.Parameter(
                torch.empty(self.normalized_shape, device=device, dtype=dtype)
            )
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.constant_(self.weight, 1.0 - self.weight_offset)

    def extra_repr(self) -> str:
        text = (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )
        if self.weight_offset != 0:
            text += f", weight_offset={self.weight_offset}"
        if self.casting_mode != "once":
            text += f", casting_mode={self.casting_mode!r}"
        return text


class RMSNorm(_RMSNormBase):
    """``y = x · rsqrt(mean(x²) + eps) · (weight + weight_offset)`` along ``dim`` (see
    :func:`rownorm.rms_norm`).

    A drop-in for ``torch.nn.RMSNorm(normalized_shape, eps, elementwise_affine, device,
    dtype)`` with a one-element ``normalized_shape``; ``eps=None`` is what torch's uses (the
    float32 epsilon; float64's for float64 x). ``dim`` selects the normalized dim (default:
    the last, as torch's). ``weight_offset=1.0`` is Gemma's ``(1 + weight)`` (the weight then
    starts at zeros, as Gemma's does); ``casting_mode="llama"`` rounds the normalized value to
    x's dtype before the weight multiplies it, as Hugging Face's LlamaRMSNorm does.
    """

    __constants__ = [*_RMSNormBase.__constants__, "dim"]

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        dim: int = -1,
        weight_offset: float = 0.0,
        casting_mode: str = "once",
    ) -> None:
        super().__init__(
            normalized_shape,
            eps,
            elementwise_affine,
            device,
            dtype,
            weight_offset=weight_offset,
            casting_mode=casting_mode,
        )
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_size("RMSNorm", x, self.dim, self.normalized_shape)
        return F.rms_norm(
            x,
            self.weight,
            self.dim,
            self.eps,
            weight_offset=self.weight_offset,
            casting_mode=self.casting_mode,
        )

    def extra_repr(self) -> str:
        text = super().extra_repr()
        return text if self.dim == -1 else f"{text}, dim={self.dim}"


class AddRMSNorm(_RMSNormBase):
    """Residual add + RMSNorm over the last dim: ``forward(x, residual)`` returns
    ``(rms_norm(r) · weight, r)`` with ``r = x + residual`` (see :func:`rownorm.add_rms_norm`).

    Arguments and parameters as ``torch.nn.RMSNorm`` (``normalized_shape`` is the hidden
    size), so its ``state_dict`` is interchangeable with that of torch's or rownorm's RMSNorm;
    ``weight_offset`` and ``casting_mode`` as :class:`RMSNorm`'s.
    """

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _check_size("AddRMSNorm", x, -1, self.normalized_shape)
        return F.add_rms_norm(
            x,
            residual,
            self.weight,
            self.eps,
            weight_offset=self.weight_offset,
            casting_mode=self.casting_mode,
        )


class LayerNorm(torch.nn.Module):
    """``y = (x − μ) · rsqrt(σ² + eps) · weight + bias`` along ``dim`` (see
    :func:`rownorm.layer_norm`).

    A drop-in for ``torch.nn.LayerNorm(normalized_shape, eps, elementwise_affine, bias,
    device, dtype)`` with a one-element ``normalized_shape``. ``dim`` selects the normalized
    dim (default: the last, as torch's).
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine", "dim"]
    normalized_shape: tuple[int]
    eps: float
    elementwise_affine: bool

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        dim: int = -1,
    ) -> None:
        super().__init__()
        self.normalized_shape = _normalized_shape("LayerNorm", normalized_shape)
        if eps < 0:
            raise ValueError(f"LayerNorm: eps must be >= 0, got {eps}")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.dim = dim
        kw = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, **kw))
        else:
            self.register_parameter("weight", None)
        if elementwise_affine and bias:
            self.bias = torch.nn.Parameter(torch.empty(self.normalized_shape, **kw))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_size("LayerNorm", x, self.dim, self.normalized_shape)
        return F.layer_norm(x, self.weight, self.bias, self.dim, self.eps)

    def extra_repr(self) -> str:
        text = (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}"
        )
        return text if self.dim == -1 else f"{text}, dim={self.dim}"
