"""The argument checks of the ``torch.ops.rownorm`` ops in Python: each mirrors a check of
src/bindings, message included, so that a fake (torch.compile, meta tensors) rejects what the
kernel would, in the same words. Shared by the fakes in :mod:`rownorm.ops`, the modules and the
float64 reference."""

from __future__ import annotations

import math

import torch

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``float32``: the spelling of the C++ error messages."""
    return str(dtype).removeprefix("torch.")


def _device_name(device: torch.device) -> str:
    """``cpu`` / ``cuda:0``, as the C++ messages print a device."""
    return str(device)


def _shape_name(t: torch.Tensor) -> str:
    """``(4, 5)`` / ``(5,)``, as the C++ messages print a shape."""
    return str(tuple(t.shape))


# ---- the checks ------------------------------------------------------------------------------

FLOATING = "float32, float16, bfloat16 or float64"


def check_floating(op: str, name: str, t: torch.Tensor) -> None:
    torch._check(
        t.dtype in _FLOAT_DTYPES,
        lambda: f"{op}: {name} must be {FLOATING}, got {dtype_name(t.dtype)}",
    )


def check_rowwise_input(op: str, name: str, x: torch.Tensor, dim: int) -> int:
    """Validates the tensor an op reduces (named ``name``: x, or the y / r a backward op
    reads) and ``dim`` the way the C++ bindings do; returns the wrapped dim.

    Used by the fakes, so torch.compile reports the same errors as eager execution.
    """
    torch._check(
        x.layout == torch.strided,
        lambda: f"{op}: {name} must be a dense (strided) tensor, got layout {x.layout}",
    )
    check_floating(op, name, x)
    torch._check(
        x.dim() >= 1,
        lambda: f"{op}: {name} must have at least one dimension, got a 0-d tensor",
    )
    torch._check(
        -x.dim() <= dim < x.dim(),
        lambda: (
            f"{op}: dim must be in [{-x.dim()}, {x.dim() - 1}] for a {x.dim()}-d {name}, got {dim}"
        ),
    )
    return dim % x.dim()


def check_eps(op: str, eps: float) -> None:
    # `:g` prints a double as C++'s ostream does (-1, 1e-05, nan).
    torch._check(eps >= 0, lambda: f"{op}: eps must be >= 0, got {eps:g}")


def check_like(
    op: str,
    name: str,
    other: torch.Tensor,
    x_name: str,
    x: torch.Tensor,
    stream: torch.dtype | None = None,
) -> None:
    """``other`` (called ``name``) has the device, dtype and shape of x (called ``x_name``),
    checked in that order; ``stream``: another dtype ``other`` may have (add_rms_norm's float32
    residual stream: :func:`residual_stream_dtype`)."""
    torch._check(
        other.device == x.device,
        lambda: (
            f"{op}: {name} must be on {x_name}'s device ({_device_name(x.device)}), "
            f"got {_device_name(other.device)}"
        ),
    )
    also = "" if stream is None else f" or {dtype_name(stream)} (a float32 residual stream)"
    torch._check(
        other.dtype == x.dtype or other.dtype == stream,
        lambda: (
            f"{op}: {name} must have {x_name}'s dtype {dtype_name(x.dtype)}{also}, "
            f"got {dtype_name(other.dtype)}"
        ),
    )
    torch._check(
        other.shape == x.shape,
        lambda: (
            f"{op}: {name} must have {x_name}'s shape {_shape_name(x)}, got {_shape_name(other)}"
        ),
    )


_16BIT = (torch.float16, torch.bfloat16)


def is_residual_stream(narrow: torch.Tensor, wide: torch.Tensor) -> bool:
    """Whether ``narrow`` (add_rms_norm's x, or its backward's grad) and ``wide`` (the
    residual, or r) are the two sides of a float32 residual stream: 16-bit and float32."""
    return narrow.dtype in _16BIT and wide.dtype == torch.float32


def residual_stream_dtype(op: str, name: str, other: torch.Tensor, x: torch.Tensor):
    """The dtype besides x's that argument ``name`` of ``op`` may have (the float32 residual
    stream, src/bindings/rms_norm.cpp), or None: add_rms_norm's residual may be float32 with a
    16-bit x; its backward's grad may be 16-bit with a float32 r."""
    if op == "add_rms_norm" and name == "residual" and x.dtype in _16BIT:
        return torch.float32
    stream_backward = op in ("add_rms_norm_backward", "add_rms_norm_stream_backward")
    if stream_backward and name == "grad" and is_residual_stream(other, x):
        return other.dtype
    return None


def check_residual_stream_backward(op: str, grad: torch.Tensor, r: torch.Tensor) -> None:
    """add_rms_norm_stream_backward's inputs are the float32 residual stream's."""
    torch._check(
        is_residual_stream(grad, r),
        lambda: (
            f"{op}: expected the float32 residual stream, grad float16 or bfloat16 and r "
            f"float32, got grad {dtype_name(grad.dtype)} and r {dtype_name(r.dtype)} "
            f"(add_rms_norm_backward serves the other dtypes)"
        ),
    )


def check_param(
    op: str, name: str, p: torch.Tensor | None, x_name: str, x: torch.Tensor, dim: int
) -> None:
    """An optional per-column parameter (weight, bias) of x (called ``x_name``): floating, and
    float64 only with float64 x (it would be rounded to the dtype parameters run in), shape
    ``(x.size(dim),)``, on x's device. ``dim`` is the wrapped dim."""
    if p is None:
        return
    check_floating(op, name, p)
    torch._check(
        p.dtype != torch.float64 or x.dtype == torch.float64,
        lambda: (
            f"{op}: {name} must be float32, float16 or bfloat16 for a {dtype_name(x.dtype)} "
            f"{x_name} (float64 needs a float64 {x_name}), got float64"
        ),
    )
    torch._check(
        p.dim() == 1 and p.shape[0] == x.shape[dim],
        lambda: (
            f"{op}: {name} must have shape ({x.shape[dim]},) (the size of {x_name} along dim "
            f"{dim}), got {_shape_name(p)}"
        ),
    )
    torch._check(
        p.device == x.device,
        lambda: (
            f"{op}: {name} must be on {x_name}'s device ({_device_name(x.device)}), "
            f"got {_device_name(p.device)}"
        ),
    )


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    """The accumulator of the kernels on x's device: float32 on CUDA (float64 for float64 x),
    float64 on the CPU."""
    return torch.float32 if x.device.type == "cuda" and x.dtype != torch.float64 else torch.float64


def param_grad_dtype(
    x: torch.Tensor, weight: torch.Tensor | None, *, bias_grad_op: bool = False
) -> torch.dtype:
    """The dtype a ``*_backward`` op returns its parameter gradients in (src/bindings/rowwise.h,
    ParamGradDtype): the dtype the parameters run in, x's where the weight is x's dtype or
    absent, else float32 for 16-bit x (x's dtype for float32 / float64 x). Where the op cannot
    see the parameter it differentiates (``bias_grad_op``, layer_norm's, without a weight: the
    bias's dtype is unknown to it), float32 (float64 for float64 x)."""
    if weight is None and bias_grad_op:
        return torch.float64 if x.dtype == torch.float64 else torch.float32
    if weight is None or weight.dtype == x.dtype:
        return x.dtype
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def row_stats_shape(x: torch.Tensor, dim: int) -> tuple[int, ...]:
    """The shape of a forward's per-row statistics over x's (wrapped) dim: x's, with 2 along
    dim."""
    return (*x.shape[:dim], 2, *x.shape[dim + 1 :])


def new_row_stats(x: torch.Tensor, dim: int) -> torch.Tensor:
    """A forward's per-row statistics as the kernels allocate them (src/bindings/rowwise.h,
    NewRowStats): ``row_stats_shape``, laid out as (rows, 2) in row order, in the accumulator
    dtype of x's device."""
    outer, inner = math.prod(x.shape[:dim]), math.prod(x.shape[dim + 1 :])
    pairs = torch.empty((outer, inner, 2), dtype=_acc_dtype(x), device=x.device)
    return pairs.transpose(1, 2).view(row_stats_shape(x, dim))


def check_row_stats(
    op: str, name: str, stats: torch.Tensor, x_name: str, x: torch.Tensor, dim: int
) -> None:
    """A backward's per-row statistics (called ``name``) of x (called ``x_name``): x's device,
    the accumulator dtype, ``row_stats_shape``; ``dim`` is the wrapped dim."""
    torch._check(
        stats.device == x.device,
        lambda: (
            f"{op}: {name} must be on {x_name}'s device ({_device_name(x.device)}), "
            f"got {_device_name(stats.device)}"
        ),
    )
    acc = _acc_dtype(x)
    torch._check(
        stats.dtype == acc,
        lambda: (
            f"{op}: {name} must be {dtype_name(acc)} for a {dtype_name(x.dtype)} {x_name} on "
            f"{_device_name(x.device)}, got {dtype_name(stats.dtype)}"
        ),
    )
    shape = row_stats_shape(x, dim)
    torch._check(
        stats.shape == shape,
        lambda: (
            f"{op}: {name} must have shape {str(shape)} ({x_name}'s, with 2 along dim {dim}), "
            f"got {_shape_name(stats)}"
        ),
    )


# rms_norm / add_rms_norm's casting modes: how the normalized value ŷ meets the weight.
CASTING_MODES = ("once", "llama")


def check_weight_offset(op: str, weight: torch.Tensor | None, weight_offset: float) -> None:
    torch._check(
        weight is not None or weight_offset == 0,
        lambda: (
            f"{op}: weight_offset needs a weight, got weight=None and "
            f"weight_offset={weight_offset:g}"
        ),
    )


def check_casting_mode(op: str, casting_mode: str) -> None:
    torch._check(
        casting_mode in CASTING_MODES,
        lambda: f"{op}: casting_mode must be 'once' or 'llama', got '{casting_mode}'",
    )


def resolve_eps(x: torch.Tensor, eps: float | None) -> float:
    """``eps=None`` of rms_norm / add_rms_norm: the epsilon of the accumulation type.

    That is what F.rms_norm computes: ``torch.finfo(torch.float32).eps`` for float32 and 16-bit
    x (torch's docs say ``finfo(x.dtype)``, its kernels use the float32 one), and
    ``torch.finfo(torch.float64).eps`` for float64.
    """
    if eps is not None:
        return eps
    return torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps
