"""Inputs for the op table: seeded random values, layouts of a row problem, reduced dims.

Every builder takes ``(..., dtype, device)`` and returns ``(x, dim)`` with the dim of size N
the one reduced. Values are drawn on the CPU (from torch's global generator, or ``generator``)
and then moved, so one seed gives the same values on every device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

Builder = Callable[..., tuple[torch.Tensor, int]]


def randn(shape, dtype: torch.dtype, device, generator: torch.Generator | None = None):
    """Standard-normal values drawn on the CPU (float64 for float64, else float32), moved."""
    gen_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    t = torch.randn(tuple(shape), dtype=gen_dtype, generator=generator)
    return t.to(device=device, dtype=dtype)


def scaled_rows(rows: int, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Random rows with norms spread over 1e-2 .. 1e2 (catches low-precision accumulation)."""
    scales = torch.logspace(-2, 2, rows, dtype=torch.float64).unsqueeze(1)
    return (randn((rows, n), torch.float64, "cpu") * scales).to(device=device, dtype=dtype)


def with_zero_rows(x: torch.Tensor, dim: int, every: int = 3) -> torch.Tensor:
    """A copy of x in which every ``every``-th row (along the dims other than dim) is zero."""
    moved = x.movedim(dim, -1).contiguous()
    flat = moved.reshape(-1, moved.shape[-1])
    flat[::every] = 0
    return flat.reshape(moved.shape).movedim(-1, dim).contiguous()


def rows_of(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` as a (rows, N) matrix: dim moved last, the other dims flattened (a copy)."""
    return t.movedim(dim, -1).reshape(-1, t.shape[dim])


def gpu_rows(n: int) -> int:
    """Rows for a row length on the GPU: enough for several CTAs, bounded memory."""
    return max(3, min(67, 2**21 // n))


# ---- layouts of a (rows, N) problem reduced over N ------------------------------------------
# They cover the bindings' routes: a row view without a copy (contiguous, row-strided, offset,
# expanded rows, size-1 dims of any stride), a contiguous copy (transposed, expanded along dim,
# non-collapsible 3-D/4-D). On the CPU every route is a contiguous copy.


def _contiguous(rows, n, dtype, device):
    return randn((rows, n), dtype, device), -1


def _row_strided(rows, n, dtype, device):
    # Row stride N + 8 keeps every row 16-byte aligned: the vectorized tiers with a row stride.
    return randn((rows, n + 8), dtype, device)[:, :n], 1


def _odd_offset(rows, n, dtype, device):
    # Starts one element in, with an odd row stride: rows are not 16-byte aligned (head scalars).
    return randn((rows, n + 1), dtype, device)[:, 1 : n + 1], -1


def _transposed(rows, n, dtype, device):
    return randn((n, rows), dtype, device).t(), 1


def _three_d_strided(rows, n, dtype, device):
    # (2, r, N + 8)[..., :N]: outer dims still collapse into one row stride.
    return randn((2, (rows + 1) // 2, n + 8), dtype, device)[..., :n], -1


def _three_d_gapped(rows, n, dtype, device):
    # (2, r + 1, N)[:, :r]: the outer dims do not collapse into one row stride.
    r = (rows + 1) // 2
    return randn((2, r + 1, n), dtype, device)[:, :r], 2


def _four_d_permuted(rows, n, dtype, device):
    r = (rows + 1) // 2
    return randn((2, r, 2, n), dtype, device).transpose(1, 2), 3


def _expanded_rows(rows, n, dtype, device):
    # Every row is the same memory (row stride 0).
    return randn((1, n), dtype, device).expand(rows, n), 1


def _expanded_along_dim(rows, n, dtype, device):
    # Stride 0 along the reduced dim: each row is one value repeated N times.
    return randn((rows, 1), dtype, device).expand(rows, n), 1


def _size_one_dims(rows, n, dtype, device):
    # Size-1 dims before and after the reduced dim, with strides that match nothing.
    base = randn((rows, n), dtype, device)
    return base.as_strided((1, rows, 1, n, 1), (12345, n, 777, 1, 3)), 3


LAYOUTS: dict[str, Builder] = {
    "contiguous": _contiguous,
    "row_strided": _row_strided,
    "odd_offset": _odd_offset,
    "transposed": _transposed,
    "3d_strided": _three_d_strided,
    "3d_gapped": _three_d_gapped,
    "4d_permuted": _four_d_permuted,
    "expanded_rows": _expanded_rows,
    "expanded_along_dim": _expanded_along_dim,
    "size_one_dims": _size_one_dims,
}

# Gradient layouts of a (rows, N) problem reduced over its last dim.
GRAD_LAYOUTS: dict[str, Callable[..., torch.Tensor]] = {
    "contiguous": lambda r, n, dt, dev: randn((r, n), dt, dev),
    "expanded_rows": lambda r, n, dt, dev: randn((1, n), dt, dev).expand(r, n),
    "expanded_along_dim": lambda r, n, dt, dev: randn((r, 1), dt, dev).expand(r, n),
    "transposed": lambda r, n, dt, dev: randn((n, r), dt, dev).t(),
    "odd_offset": lambda r, n, dt, dev: randn((r, n + 1), dt, dev)[:, 1:],
}

# ---- positions of the reduced dim (size N) --------------------------------------------------
# All but the last-dim ones take the strided-dim path on CUDA (N <= 64 cached in registers,
# longer rows streamed; inner sizes that are a multiple of the 16-byte pack are packed).
# Builders take (n, dtype, device).

DIM_CASES: dict[str, Callable[..., tuple[torch.Tensor, int]]] = {
    "1d": lambda n, dt, dev: (randn((n,), dt, dev), 0),
    "last_3d": lambda n, dt, dev: (randn((3, 2, n), dt, dev), -1),
    "first": lambda n, dt, dev: (randn((n, 5), dt, dev), 0),
    "middle": lambda n, dt, dev: (randn((3, n, 5), dt, dev), 1),
    "middle_negative": lambda n, dt, dev: (randn((3, n, 5), dt, dev), -2),
    "nchw_channels": lambda n, dt, dev: (randn((2, n, 3, 4), dt, dev), 1),
    # inner = 272: a multiple of the 16-byte pack and more than one tile of columns (the packed
    # strided-dim kernel for N <= 64), with a partial last tile.
    "nchw_wide": lambda n, dt, dev: (randn((2, n, 16, 17), dt, dev), 1),
    # inner = 256: whole tiles of packed columns (two of fp32, one of 16-bit).
    "nchw_full_tiles": lambda n, dt, dev: (randn((3, n, 16, 16), dt, dev), 1),
    # inner = 40: a multiple of the pack, but less than a tile: one column per thread.
    "nchw_narrow": lambda n, dt, dev: (randn((3, n, 8, 5), dt, dev), 1),
    "nhwc_channels": lambda n, dt, dev: (
        randn((2, n, 3, 4), dt, dev).to(memory_format=torch.channels_last),
        1,
    ),
    "middle_transposed": lambda n, dt, dev: (randn((3, 5, n), dt, dev).transpose(1, 2), 1),
    "trailing_one": lambda n, dt, dev: (randn((3, n, 1), dt, dev), 1),
}

# Empty tensors: (shape, dim) with no rows, no columns, or neither.
EMPTY_CASES = (((0, 5), -1), ((5, 0), -1), ((0, 0), 1), ((0, 5), 0), ((2, 0, 3), 1), ((0,), 0))


# ---- extreme values -------------------------------------------------------------------------


class Extremes(NamedTuple):
    """Magnitudes of a dtype's extreme rows (see :func:`extremal_rows`)."""

    huge: float  # random rows whose squares overflow the float32 (fp64: float64) accumulator
    big: float  # constant rows whose sums overflow it (fp16: its largest values, in range)
    tiny: float  # about the smallest normal number
    sub: float  # subnormal
    consts: tuple[float, ...]  # constant rows, signs alternating


EXTREMES: dict[torch.dtype, Extremes] = {
    torch.float32: Extremes(4e19, 1e38, 1e-38, 1e-39, (1e-30, 1e-5, 0.1, 3.0, 12345.678, 1e8,
                                                       1e15)),
    torch.bfloat16: Extremes(4e19, 1e38, 1e-38, 1e-40, (1e-30, 1e-5, 0.1, 3.0, 12345.678, 1e8,
                                                        1e15)),
    torch.float16: Extremes(0.0, 6e4, 6.2e-5, 6e-8, (1e-4, 0.1, 3.0, 1000.0, 6e4)),
    torch.float64: Extremes(1e160, 1e308, 1e-300, 1e-310, (1e-300, 1e-5, 0.1, 3.0, 12345.678,
                                                           1e15, 1e100)),
}  # fmt: skip


def extremal_rows(n: int, dtype: torch.dtype, generator: torch.Generator | None = None):
    """``(names, x)``: a (rows, n) tensor of ``dtype`` on the CPU, one kind of extreme row per
    row, named in ``names``: NaN, ±inf entries, all-±inf rows (special values); a random row,
    a zero row, constant rows of many magnitudes, tiny and subnormal rows; random rows of
    ``huge`` magnitude (their squares overflow the float32 accumulator of fp32 / bf16 x, the
    float64 one of fp64 x), a row with one huge element, and a constant row of ``big``
    (whose sum overflows it). fp16 has no values that overflow a float32 sum: its huge rows
    are its largest values."""
    e = EXTREMES[dtype]
    inf, nan = float("inf"), float("nan")

    def normal() -> torch.Tensor:
        return torch.randn(n, dtype=torch.float64, generator=generator)

    def with_values(*pairs) -> torch.Tensor:
        row = normal()
        for index, value in pairs:
            row[index] = value
        return row

    def spread(scale: float) -> torch.Tensor:  # |x| in [scale / 2, scale], random signs
        u = torch.rand(n, dtype=torch.float64, generator=generator)
        return (0.5 + 0.5 * u) * scale * torch.where(normal() < 0, -1.0, 1.0)

    huge = e.huge or e.big
    rows = {
        "normal": normal(),
        "nan": with_values((n // 2, nan)),
        "+inf": with_values((n // 3, inf)),
        "-inf": with_values(((2 * n) // 3, -inf)),
        "+inf and -inf": with_values((0, inf), (n - 1, -inf)),
        "nan and +inf": with_values((0, nan), (n - 1, inf)),
        "all -inf": torch.full((n,), -inf, dtype=torch.float64),
        "all +inf": torch.full((n,), inf, dtype=torch.float64),
        "zero": torch.zeros(n, dtype=torch.float64),
        **{f"constant {c * (-1) ** i:g}": torch.full((n,), c * (-1) ** i, dtype=torch.float64)
           for i, c in enumerate(e.consts)},
        f"tiny {e.tiny:g}": normal() * e.tiny,
        f"subnormal {e.sub:g}": normal() * e.sub,
        f"huge {huge:g}": spread(huge),
        f"one huge {huge:g}": with_values((n // 2, huge)),
        f"constant {e.big:g}": torch.full((n,), e.big, dtype=torch.float64),
    }  # fmt: skip
    return list(rows), torch.stack(list(rows.values())).to(dtype)
