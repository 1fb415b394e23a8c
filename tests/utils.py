"""Shared helpers of the rownorm tests: the tolerance table, input layouts, comparisons.

Everything is compared with the float64 reference of :mod:`rownorm.reference`, which computes
in float64 from the same (already rounded) inputs and rounds once to the output dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import rownorm
import torch

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


def cuda_only(obj):
    """Marks a test (or a parameter) `cuda` and skips it where no GPU is present."""
    return pytest.mark.cuda(requires_cuda(obj))


# The four dtypes every op supports, with short test ids.
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
DTYPE_IDS = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float64: "fp64",
}


def dtype_id(dtype: torch.dtype) -> str:
    return DTYPE_IDS[dtype]


@dataclass(frozen=True)
class Tol:
    """How close an output must be to the float64 reference, rounded to its dtype.

    rtol / atol: elementwise (``torch.testing.assert_close``); atol is taken relative to the
        largest |reference| value of the tensor, so long rows (values ~ 1/sqrt(N)) are held to
        the same standard as short ones.
    relerr: bound on ‖out − ref‖₂ / ‖ref‖₂ over the whole tensor.
    unit: bound on the error of a row statistic of a normalized output whose exact value is
        known (‖row‖₂ = 1 after L2 normalization, Σ softmax = 1, the variance of a
        layer-normalized row, ...): what the output's rounding leaves of it.
    """

    rtol: float
    atol: float
    relerr: float
    unit: float


# THE TOLERANCE TABLE. The kernels accumulate in float32 (float64 for float64) and round once
# to the output dtype, so the output differs from the rounded reference by at most about one
# unit in the last place: 2^-10 (fp16), 2^-7 (bf16), 2^-23 (fp32) relative. The whole-tensor
# relative error averages those roundings and is held tighter.
TOL: dict[torch.dtype, Tol] = {
    torch.float32: Tol(rtol=1e-5, atol=1e-5, relerr=1e-6, unit=1e-5),
    torch.float16: Tol(rtol=1e-3, atol=1e-3, relerr=1e-3, unit=2e-3),
    torch.bfloat16: Tol(rtol=1e-2, atol=1e-2, relerr=8e-3, unit=1.6e-2),
    torch.float64: Tol(rtol=1e-12, atol=1e-12, relerr=1e-12, unit=1e-12),
}


def randn(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Standard-normal values drawn from torch's global (seeded) CPU generator, then moved.

    Drawing on the CPU makes the values the same on every device for one seed.
    """
    gen_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    return torch.randn(shape, dtype=gen_dtype).to(device=device, dtype=dtype)


def assert_matches(
    out: torch.Tensor,
    ref: torch.Tensor,
    *,
    magnitude: torch.Tensor | None = None,
    dim: int | None = None,
    what: str = "",
    tol: Tol | None = None,
) -> None:
    """``out`` equals ``ref`` within the dtype's tolerances (elementwise and relative error).

    NaN must appear exactly where the reference has it. Errors are measured relative to
    ``magnitude`` (default: ``ref``), per row along ``dim`` when given (else over the whole
    tensor): atol is a fraction of the row's largest |magnitude| and the relative error is
    ‖out − ref‖ / ‖magnitude‖ with both rescaled per row. A gradient passes the size of the
    terms it is computed from (dy / ‖x‖) as magnitude, since its true value may cancel to ~0.
    ``tol`` overrides the table's entry for out's dtype.
    """
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert out.dtype == ref.dtype, f"{what}: dtype {out.dtype} != {ref.dtype}"
    tol = TOL[out.dtype] if tol is None else tol
    o = out.detach().double()
    r = ref.detach().to(out.device).double()
    nan_o, nan_r = torch.isnan(o), torch.isnan(r)
    assert torch.equal(nan_o, nan_r), (
        f"{what}: NaN at {int((nan_o & ~nan_r).sum())} elements where the reference has "
        f"none, missing at {int((nan_r & ~nan_o).sum())}"
    )
    if r.numel() == 0:
        return
    mag = r if magnitude is None else magnitude.detach().to(o.device).double().expand(r.shape)
    mag = torch.where(torch.isfinite(mag), mag, 0).abs()
    if dim is None:
        scale = mag.max()
    else:
        scale = mag.amax(dim=dim, keepdim=True)
    # Below the dtype's smallest normal number the output's spacing is absolute (subnormals),
    # so a row's scale never drops below it: one subnormal step always passes.
    scale = torch.where(scale > 0, scale, 1.0).clamp_min(2 * torch.finfo(out.dtype).tiny)
    o, r, mag = o / scale, r / scale, mag / scale
    torch.testing.assert_close(
        o,
        r,
        rtol=tol.rtol,
        atol=tol.atol,
        equal_nan=True,
        msg=lambda m: f"{what}: {m} (values divided by the largest |magnitude| of their row)",
    )
    finite = torch.isfinite(r)
    num = torch.linalg.vector_norm(o[finite] - r[finite]).item()
    den = torch.linalg.vector_norm(mag[finite]).item()
    err = num / den if den > 0 else num
    assert err <= tol.relerr, f"{what}: relative error {err:.3e} > {tol.relerr:.0e}"


def grad_magnitude(dy: torch.Tensor, x: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    """|dy| / max(‖x‖, eps): the size of the terms the L2 backward is computed from."""
    norm = torch.linalg.vector_norm(x.detach().double(), dim=dim, keepdim=True)
    return dy.detach().double().abs() / norm.clamp_min(eps)


def assert_grad_matches(dx, dy, x, dim: int, eps: float, *, what: str = "") -> None:
    """dx equals the reference gradient, errors measured against dy / ‖x‖ row by row."""
    ref = reference_backward(dy, x, dim, eps)
    assert_matches(dx, ref, magnitude=grad_magnitude(dy, x, dim, eps), dim=dim, what=what)


def assert_new_contiguous(out: torch.Tensor, x: torch.Tensor) -> None:
    """The op's output contract: a new contiguous tensor of x's shape, dtype and device."""
    assert out.shape == x.shape
    assert out.dtype == x.dtype
    assert out.device == x.device
    assert out.is_contiguous(), f"output strides {out.stride()} are not contiguous"
    if x.numel() > 0:
        assert out.data_ptr() != x.data_ptr(), "the output aliases the input"


def assert_unit_rows(out: torch.Tensor, dim: int, *, skip_zero_of: torch.Tensor | None = None):
    """Every row of ``out`` along ``dim`` has L2 norm 1 (rows of x that are all zero excepted)."""
    tol = TOL[out.dtype]
    norms = torch.linalg.vector_norm(out.detach().double(), dim=dim)
    if skip_zero_of is not None:
        keep = torch.linalg.vector_norm(skip_zero_of.detach().double(), dim=dim) > 0
        norms = norms[keep]
    if norms.numel() == 0:
        return
    worst = (norms - 1).abs().max().item()
    assert worst <= tol.unit, f"a row has norm off 1 by {worst:.3e} > {tol.unit:.0e}"


def poison_allocator(shape, dtype: torch.dtype, device) -> int:
    """Leaves a freed block of the size of a ``shape`` tensor, filled with NaN, in the allocator.

    The op allocates its output itself, so unwritten output elements are caught by handing the
    allocator a NaN-filled block of exactly the output's size just before the op runs: CUDA's
    caching allocator gives the next request of that size the same block (the tests check the
    address). On the CPU this is best effort. Returns the poisoned block's address.
    """
    (ptr,) = poison_blocks([(shape, dtype)], device)
    return ptr


def poison_blocks(blocks, device) -> set[int]:
    """:func:`poison_allocator` for several outputs at once: one NaN-filled block per
    ``(shape, dtype)`` of ``blocks``, all freed together. Returns their addresses (an op with
    several outputs of one size may take the blocks in any order).
    """
    held = [torch.full(tuple(shape), float("nan"), dtype=dt, device=device) for shape, dt in blocks]
    ptrs = {t.data_ptr() for t in held}
    del held
    return ptrs


# DESIGN §4's odd and boundary row lengths, run on every device.
ROW_LENGTHS = (1, 7, 31, 32, 33, 255, 1000, 1024, 1025, 4097, 65535, 65537)
# CUDA only: the edges of the kernel tiers of src/kernels/common/dispatch.cuh (group ≤ 512 fp32
# / 1024 16-bit elements, CTA ≤ 8192 / 16384, cluster of 2-16 CTAs ≤ 131072 / 262144,
# streaming beyond), each at the edge, one past it with N a multiple of 8 (still vectorized)
# and one past it odd (scalar), plus 2^20 (too slow for CI's CPUs).
GPU_TIER_LENGTHS = (
    64, 128, 136, 256, 512, 513, 520, 1024, 1032, 2048, 2056, 4096, 8192, 8193, 8200,
    16384, 16385, 16392, 32768, 32776, 65536, 65544, 131072, 131073, 131080,
    262144, 262145, 262152, 1048576,
)  # fmt: skip


def gpu_rows(n: int) -> int:
    """Rows for a row length on the GPU: enough for several CTAs, bounded memory."""
    return max(3, min(67, 2**21 // n))


def scaled_rows(rows: int, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Random rows with norms spread over 1e-2 .. 1e2 (catches low-precision accumulation)."""
    scales = torch.logspace(-2, 2, rows, dtype=torch.float64).unsqueeze(1)
    return (randn((rows, n), torch.float64, "cpu") * scales).to(device=device, dtype=dtype)


def row_count(n: int) -> int:
    """Rows for a row length: many short rows, few long ones (bounded CPU time).

    Short rows use an odd row count so the last CTA of several-rows-per-CTA tiers is partial.
    """
    if n <= 64:
        return 67
    if n <= 1100:
        return 19
    if n <= 5000:
        return 7
    return 3


# ----------------------------------------------------------------------------------------------
# Layouts of a (rows, N) problem reduced over its N dim. Each builder returns (x, dim) with the
# N-sized dim reduced; they cover the bindings' three routes: row-viewable without a copy
# (contiguous, row-strided, offset, expanded rows, size-1 dims of any stride), made contiguous
# (transposed, expanded along dim, non-collapsible 3-D/4-D) and the column path (dims test).

Layout = Callable[[int, int, torch.dtype, object], tuple[torch.Tensor, int]]


def _contiguous(rows, n, dtype, device):
    return randn((rows, n), dtype, device), -1


def _row_strided(rows, n, dtype, device):
    # Row stride N + 8 keeps every row 16-byte aligned: the vectorized tiers with a row stride.
    return randn((rows, n + 8), dtype, device)[:, :n], 1


def _odd_offset(rows, n, dtype, device):
    # Starts one element in and has an odd row stride: rows are not 16-byte aligned.
    return randn((rows, n + 1), dtype, device)[:, 1 : n + 1], -1


def _transposed(rows, n, dtype, device):
    return randn((n, rows), dtype, device).t(), 1


def _three_d(rows, n, dtype, device):
    return randn((2, (rows + 1) // 2, n), dtype, device), 2


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


LAYOUTS: dict[str, Layout] = {
    "contiguous": _contiguous,
    "row_strided": _row_strided,
    "odd_offset": _odd_offset,
    "transposed": _transposed,
    "3d": _three_d,
    "3d_strided": _three_d_strided,
    "3d_gapped": _three_d_gapped,
    "4d_permuted": _four_d_permuted,
    "expanded_rows": _expanded_rows,
    "expanded_along_dim": _expanded_along_dim,
    "size_one_dims": _size_one_dims,
}

# ----------------------------------------------------------------------------------------------
# Positions of the reduced dim (size N) in tensors of rank 1-4; all but the last-dim ones run on
# the strided-dim (column) path on CUDA. Builders take (n, dtype, device) -> (x, dim).

DIM_CASES: dict[str, Callable[[int, torch.dtype, object], tuple[torch.Tensor, int]]] = {
    "1d": lambda n, dt, dev: (randn((n,), dt, dev), 0),
    "1d_negative": lambda n, dt, dev: (randn((n,), dt, dev), -1),
    "last_negative": lambda n, dt, dev: (randn((3, 2, n), dt, dev), -1),
    "first": lambda n, dt, dev: (randn((n, 5), dt, dev), 0),
    "first_negative": lambda n, dt, dev: (randn((n, 5), dt, dev), -2),
    "middle": lambda n, dt, dev: (randn((3, n, 5), dt, dev), 1),
    "middle_negative": lambda n, dt, dev: (randn((3, n, 5), dt, dev), -2),
    "nchw_channels": lambda n, dt, dev: (randn((2, n, 3, 4), dt, dev), 1),
    # inner = 272: a multiple of the 16-byte pack and more than a full tile of columns (the
    # vectorized column kernel on CUDA, for N <= 64), with a partial last tile
    "nchw_wide": lambda n, dt, dev: (randn((2, n, 16, 17), dt, dev), 1),
    "nhwc_channels": lambda n, dt, dev: (
        randn((2, n, 3, 4), dt, dev).to(memory_format=torch.channels_last),
        1,
    ),
    "middle_transposed": lambda n, dt, dev: (randn((3, 5, n), dt, dev).transpose(1, 2), 1),
    "trailing_one": lambda n, dt, dev: (randn((3, n, 1), dt, dev), 1),
}


# Gradient layouts, built like the input layouts: (rows, N, dtype, device) -> a gradient of
# shape (rows, N) for a problem reduced over its last dim.
GRAD_LAYOUTS = {
    "contiguous": lambda r, n, dt, dev: randn((r, n), dt, dev),
    "expanded_rows": lambda r, n, dt, dev: randn((1, n), dt, dev).expand(r, n),
    "expanded_along_dim": lambda r, n, dt, dev: randn((r, 1), dt, dev).expand(r, n),
    "transposed": lambda r, n, dt, dev: randn((n, r), dt, dev).t(),
    "row_strided": lambda r, n, dt, dev: randn((r, n + 8), dt, dev)[:, :n],
    "odd_offset": lambda r, n, dt, dev: randn((r, n + 1), dt, dev)[:, 1:],
}


def rows_of(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` as a (rows, N) matrix: dim moved last, the other dims flattened (a copy)."""
    return t.movedim(dim, -1).reshape(-1, t.shape[dim])


def assert_row_stat(stat: torch.Tensor, expected, bound, *, what: str = "") -> None:
    """A per-row statistic of an output is its known exact value within ``bound``."""
    stat = stat.double()
    expected = torch.as_tensor(expected, dtype=torch.float64, device=stat.device)
    if stat.numel() == 0:
        return
    err = (stat - expected).abs()
    bound = torch.as_tensor(bound, dtype=torch.float64, device=stat.device).expand(err.shape)
    bad = ~(err <= bound)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {err.numel()} rows off, worst by "
        f"{(err - bound).max().item():.3e} beyond the bound"
    )


def with_zero_rows(x: torch.Tensor, dim: int, every: int = 3) -> torch.Tensor:
    """A copy of x in which every ``every``-th row (along the dims other than dim) is zero."""
    x = x.clone()
    moved = x.movedim(dim, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    flat[::every] = 0
    return flat.reshape(moved.shape).movedim(-1, dim).contiguous()


def l2(x: torch.Tensor, dim: int = -1, eps: float = 1e-12) -> torch.Tensor:
    return torch.ops.rownorm.l2_normalize(x, dim, eps)


def l2_backward(grad: torch.Tensor, x: torch.Tensor, dim: int = -1, eps: float = 1e-12):
    return torch.ops.rownorm.l2_normalize_backward(grad, x, dim, eps)


def reference_forward(x: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    return rownorm.reference.l2_normalize(x, dim, eps)


def reference_backward(grad: torch.Tensor, x: torch.Tensor, dim: int, eps: float):
    return rownorm.reference.l2_normalize_backward(grad, x, dim, eps)


def free_bytes(device) -> int:
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return free


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"
