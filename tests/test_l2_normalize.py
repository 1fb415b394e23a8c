"""l2_normalize: forward and backward against the float64 reference, on every layout and dim.

Specification: ``torch.ops.rownorm.l2_normalize(x, dim=-1, eps=1e-12)`` returns a NEW
CONTIGUOUS tensor equal to ``F.normalize(x, p=2, dim=dim, eps=eps)``; with eps=0 it is
``x / torch.norm(x, p=2, dim=dim, keepdim=True)`` (a zero row gives NaN). The backward op gives
``dx = (dy − y·Σ(dy⊙y)) / ‖x‖``, or ``dy / eps`` where the norm was clamped.

Why the grid is what it is:

* Row lengths N: DESIGN §4's odd and boundary lengths (ROW_LENGTHS) everywhere. On CUDA also
  the edges of the kernel tiers of src/kernels/common/dispatch.cuh (GPU_TIER_LENGTHS: group ≤
  512 fp32 / 1024 16-bit elements, CTA ≤ 8192 / 16384, cluster of 2-16 CTAs ≤ 131072 / 262144,
  streaming beyond), each at the edge, one past it with N a multiple of 8 (still vectorized)
  and one past it odd (scalar), plus 2^20 (CUDA only: too slow for CI's CPUs).
* The full product dtype × N × layout × dim × device would be ~10^4 cases, too slow for CI's
  two cores. Instead every axis is crossed with dtype × N in full (rows, layouts, dims), and
  the rarer properties (eps clamping, zero rows, poisoned outputs, gradient layouts) run on a
  representative subset of N: short (1, 7), one past a warp (33), odd mid-sized (1025) and
  long rows (65537). The backward, which has the same routing as the forward, runs on a
  smaller N set than the forward.
* Long rows use few rows on the CPU (utils.row_count); CUDA runs more rows for the tiers.
"""

from __future__ import annotations

import pytest
import rownorm
import torch
import torch.nn.functional as F
from utils import (
    DIM_CASES,
    DTYPES,
    GPU_TIER_LENGTHS,
    GRAD_LAYOUTS,
    LAYOUTS,
    ROW_LENGTHS,
    TOL,
    assert_grad_matches,
    assert_matches,
    assert_new_contiguous,
    assert_unit_rows,
    clamped_rows,
    cuda_only,
    dtype_id,
    gpu_rows,
    l2,
    l2_backward,
    poison_allocator,
    randn,
    reference_forward,
    row_count,
    scaled_rows,
    with_zero_rows,
)

# The dims tests add the edge of the column path's register cache (columns of <= 64).
DIM_LENGTHS = (1, 7, 31, 32, 33, 64, 65, 255, 1000, 1025, 4097, 65537)
BACKWARD_LENGTHS = (1, 7, 32, 33, 255, 1025, 4097, 65537)
SUBSET_LENGTHS = (1, 7, 33, 1025, 65537)

dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)


def check_forward(x: torch.Tensor, dim: int, eps: float = 1e-12, what: str = "") -> torch.Tensor:
    y = l2(x, dim, eps)
    assert_new_contiguous(y, x)
    assert_matches(y, reference_forward(x, dim, eps), what=what)
    return y


def check_backward_autograd(x: torch.Tensor, dim: int, eps: float = 1e-12, what: str = ""):
    """Runs forward + backward through autograd and compares dx with the reference."""
    leaf = x.detach().requires_grad_(True)
    y = rownorm.l2_normalize(leaf, dim, eps)
    dy = randn(y.shape, y.dtype, y.device)
    (dx,) = torch.autograd.grad(y, leaf, dy)
    assert dx.shape == x.shape and dx.dtype == x.dtype
    assert_grad_matches(dx, dy, x, dim, eps, what=what)
    return y, dy, dx


# ---------------------------------------------------------------------------------------------
# Forward


@dtypes
@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_forward_row_lengths(device, dtype, n):
    x = scaled_rows(row_count(n), n, dtype, device)
    y = check_forward(x, -1, what=f"N={n}")
    assert_unit_rows(y, -1)
    # The public function and the module are the same op.
    assert torch.equal(rownorm.l2_normalize(x), y)
    assert torch.equal(rownorm.nn.L2Norm()(x), y)


@cuda_only
@dtypes
@pytest.mark.parametrize("n", GPU_TIER_LENGTHS)
def test_forward_gpu_tiers(dtype, n):
    x = scaled_rows(gpu_rows(n), n, dtype, "cuda")
    y = check_forward(x, -1, what=f"N={n}")
    assert_unit_rows(y, -1)


@dtypes
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_forward_layouts(device, dtype, layout, n):
    x, dim = LAYOUTS[layout](row_count(n), n, dtype, device)
    y = check_forward(x, dim, what=f"{layout} N={n}")
    assert_unit_rows(y, dim)


@dtypes
@pytest.mark.parametrize("case", DIM_CASES)
@pytest.mark.parametrize("n", DIM_LENGTHS)
def test_forward_dims(device, dtype, case, n):
    x, dim = DIM_CASES[case](n, dtype, device)
    y = check_forward(x, dim, what=f"{case} N={n}")
    assert_unit_rows(y, dim)


@dtypes
@pytest.mark.parametrize("eps", [1e-3, 0.5, 1.0, 7.0])
@pytest.mark.parametrize("n", (1, 7, 33, 1025))
def test_forward_eps_clamps_small_rows(device, dtype, eps, n):
    """Rows with ‖x‖ < eps are divided by eps (F.normalize's clamp), the others normalized."""
    x = clamped_rows(16, n, dtype, device, eps)
    y = check_forward(x, -1, eps, what=f"eps={eps}")
    norms = torch.linalg.vector_norm(x.double(), dim=-1)
    small = norms < eps
    big = ~small
    if big.any():
        assert_unit_rows(y[big], -1)
    if small.any():
        assert_matches(y[small], (x[small].double() / eps).to(dtype), what="clamped rows")


@dtypes
@pytest.mark.parametrize("n", SUBSET_LENGTHS)
def test_forward_zero_rows_mixed_with_random_rows(device, dtype, n):
    x = with_zero_rows(randn((row_count(n) + 4, n), dtype, device), -1)
    # eps > 0: a zero row gives zeros (0 / eps).
    y = check_forward(x, -1, what="eps=1e-12")
    assert torch.count_nonzero(y[::3]) == 0
    assert_unit_rows(y, -1, skip_zero_of=x)
    # eps = 0: a zero row gives NaN exactly where the seed expression does, the rest unit rows.
    y0 = check_forward(x, -1, 0.0, what="eps=0")
    seed = x / torch.norm(x, p=2, dim=-1, keepdim=True)
    assert torch.equal(torch.isnan(y0), torch.isnan(seed))
    assert torch.isnan(y0[::3]).all()


@dtypes
@pytest.mark.parametrize("case", ["middle", "nchw_channels", "first"])
def test_forward_zero_rows_strided_dim(device, dtype, case):
    x, dim = DIM_CASES[case](33, dtype, device)
    x = with_zero_rows(x, dim)
    check_forward(x, dim, what="eps=1e-12")
    check_forward(x, dim, 0.0, what="eps=0")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("shape_dim", [((5, 7), -1), ((4, 33, 6), 1), ((129, 3), 0)])
def test_forward_matches_torch(device, dtype, shape_dim):
    """Same values as the PyTorch expressions the op replaces (F.normalize; seed at eps=0)."""
    shape, dim = shape_dim
    x = randn(shape, dtype, device)
    tol = TOL[dtype]
    for eps in (1e-12, 0.3):
        expected = F.normalize(x, p=2.0, dim=dim, eps=eps)
        torch.testing.assert_close(l2(x, dim, eps), expected, rtol=tol.rtol, atol=tol.atol)
    seed = x / torch.norm(x, p=2, dim=dim, keepdim=True)
    torch.testing.assert_close(l2(x, dim, 0.0), seed, rtol=tol.rtol, atol=tol.atol)


@dtypes
@pytest.mark.parametrize("layout", ["contiguous", "odd_offset", "transposed", "3d_gapped"])
@pytest.mark.parametrize("n", SUBSET_LENGTHS)
def test_forward_poisoned_output(device, dtype, layout, n):
    """Every output element is written: the output's memory is NaN-filled before the op."""
    x, dim = LAYOUTS[layout](row_count(n), n, dtype, device)
    x = with_zero_rows(x, dim, every=4)
    ptr = poison_allocator(x.shape, dtype, device)
    y = l2(x, dim)
    if y.is_cuda:
        assert y.data_ptr() == ptr, "the caching allocator did not hand back the poisoned block"
    assert not torch.isnan(y).any()
    assert_matches(y, reference_forward(x, dim, 1e-12), what=layout)


@dtypes
@pytest.mark.parametrize("case", ["middle", "nchw_channels", "first"])
@pytest.mark.parametrize("n", (7, 65))
def test_forward_poisoned_output_strided_dim(device, dtype, case, n):
    x, dim = DIM_CASES[case](n, dtype, device)
    ptr = poison_allocator(x.shape, dtype, device)
    y = l2(x, dim)
    if y.is_cuda:
        assert y.data_ptr() == ptr, "the caching allocator did not hand back the poisoned block"
    assert not torch.isnan(y).any()
    assert_matches(y, reference_forward(x, dim, 1e-12), what=case)


# Empty tensors: no rows, empty rows, both, and empty dims elsewhere.
EMPTY_CASES = [((0, 5), -1), ((5, 0), -1), ((0, 0), 1), ((0, 5), 0), ((2, 0, 3), 1), ((0,), 0)]


@dtypes
@pytest.mark.parametrize("shape_dim", EMPTY_CASES, ids=str)
def test_empty(device, dtype, shape_dim):
    shape, dim = shape_dim
    x = torch.empty(shape, dtype=dtype, device=device)
    y = l2(x, dim)
    assert y.shape == x.shape and y.dtype == dtype and y.device == x.device and y.is_contiguous()
    dx = l2_backward(torch.empty_like(x), x, dim)
    assert dx.shape == x.shape and dx.dtype == dtype and dx.is_contiguous()
    leaf = x.clone().requires_grad_(True)
    rownorm.l2_normalize(leaf, dim).sum().backward()
    assert leaf.grad is not None and leaf.grad.shape == x.shape


# ---------------------------------------------------------------------------------------------
# Backward


@dtypes
@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_backward_row_lengths(device, dtype, n):
    x = scaled_rows(row_count(n), n, dtype, device)
    y, _, dx = check_backward_autograd(x, -1, what=f"N={n}")
    if dtype in (torch.float32, torch.float64) and n > 1:
        # dx is orthogonal to y in every row (the normalization removes the radial part).
        dots = (dx.double() * y.double()).sum(-1).abs()
        bound = 50 * TOL[dtype].rtol * torch.linalg.vector_norm(dx.double(), dim=-1)
        assert (dots <= bound + 1e-30).all()


@cuda_only
@dtypes
@pytest.mark.parametrize("n", GPU_TIER_LENGTHS)
def test_backward_gpu_tiers(dtype, n):
    x = scaled_rows(gpu_rows(n), n, dtype, "cuda")
    check_backward_autograd(x, -1, what=f"N={n}")


@dtypes
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", BACKWARD_LENGTHS)
def test_backward_layouts(device, dtype, layout, n):
    x, dim = LAYOUTS[layout](row_count(n), n, dtype, device)
    check_backward_autograd(x, dim, what=f"{layout} N={n}")


@dtypes
@pytest.mark.parametrize("case", DIM_CASES)
@pytest.mark.parametrize("n", (1, 7, 33, 64, 65, 1025))
def test_backward_dims(device, dtype, case, n):
    x, dim = DIM_CASES[case](n, dtype, device)
    check_backward_autograd(x, dim, what=f"{case} N={n}")


@dtypes
@pytest.mark.parametrize("grad_layout", GRAD_LAYOUTS)
@pytest.mark.parametrize("x_layout", ["contiguous", "transposed", "odd_offset"])
@pytest.mark.parametrize("n", (7, 33, 1025))
def test_backward_grad_layouts(device, dtype, grad_layout, x_layout, n):
    rows = row_count(n)
    x, dim = LAYOUTS[x_layout](rows, n, dtype, device)
    dy = GRAD_LAYOUTS[grad_layout](rows, n, dtype, device)
    dx = l2_backward(dy, x, dim)
    assert_new_contiguous(dx, x)
    assert_grad_matches(dx, dy, x, dim, 1e-12, what=f"{x_layout}/{grad_layout}")


@dtypes
@pytest.mark.parametrize("grad_layout", ["expanded_rows", "transposed"])
def test_backward_autograd_non_contiguous_grad(device, dtype, grad_layout):
    """Non-contiguous gradients reach the backward op through autograd (y.sum(0) expands)."""
    rows, n = 9, 257
    x = randn((rows, n), dtype, device).requires_grad_(True)
    dy = GRAD_LAYOUTS[grad_layout](rows, n, dtype, device)
    (dx,) = torch.autograd.grad(rownorm.l2_normalize(x), x, dy)
    assert_grad_matches(dx, dy, x, -1, 1e-12)
    # y.sum(0) hands the backward op its gradient expanded over the rows (row stride 0).
    (dx_sum,) = torch.autograd.grad(rownorm.l2_normalize(x).sum(0), x, dy[0])
    assert_grad_matches(dx_sum, dy[0].expand(rows, n), x, -1, 1e-12, what="sum(0)")


@dtypes
@pytest.mark.parametrize("eps", [0.5, 1.0])
@pytest.mark.parametrize("n", (1, 7, 33, 1000, 4097))
def test_backward_clamped(device, dtype, eps, n):
    """Where ‖x‖ < eps the gradient is dy / eps; elsewhere the usual projection."""
    x = clamped_rows(16, n, dtype, device, eps)
    _, dy, dx = check_backward_autograd(x, -1, eps)
    small = torch.linalg.vector_norm(x.double(), dim=-1) < eps
    assert small.any() and (~small).any()
    assert_matches(dx[small], (dy[small].double() / eps).to(dtype), what="clamped rows")


@dtypes
@pytest.mark.parametrize("case", ["middle", "first"])
def test_backward_clamped_strided_dim(device, dtype, case):
    x, dim = DIM_CASES[case](33, dtype, device)
    x = with_zero_rows(x, dim) * 0.01  # columns with norm < eps = 1 and a zero column
    check_backward_autograd(x, dim, 1.0)


@dtypes
@pytest.mark.parametrize("layout", ["contiguous", "odd_offset", "transposed"])
@pytest.mark.parametrize("n", SUBSET_LENGTHS)
def test_backward_poisoned_output(device, dtype, layout, n):
    x, dim = LAYOUTS[layout](row_count(n), n, dtype, device)
    x = with_zero_rows(x, dim, every=4)
    dy = randn(x.shape, dtype, device)
    ptr = poison_allocator(x.shape, dtype, device)
    dx = l2_backward(dy, x, dim, 1e-3)
    if dx.is_cuda:
        assert dx.data_ptr() == ptr, "the caching allocator did not hand back the poisoned block"
    assert not torch.isnan(dx).any()
    assert_grad_matches(dx, dy, x, dim, 1e-3, what=layout)


@dtypes
@pytest.mark.parametrize("case", ["middle", "first"])
def test_backward_poisoned_output_strided_dim(device, dtype, case):
    x, dim = DIM_CASES[case](65, dtype, device)
    dy = randn(x.shape, dtype, device)
    ptr = poison_allocator(x.shape, dtype, device)
    dx = l2_backward(dy, x, dim)
    if dx.is_cuda:
        assert dx.data_ptr() == ptr, "the caching allocator did not hand back the poisoned block"
    assert not torch.isnan(dx).any()
    assert_grad_matches(dx, dy, x, dim, 1e-12, what=case)


# Finite differences in float64: shapes with the reduced dim first, middle and last, a
# non-contiguous input, and eps both at its default and clamping some rows.
GRADCHECK_CASES = {
    "rows": ((4, 9), -1),
    "single_row": ((1, 33), 1),
    "dim0": ((7, 3), 0),
    "middle": ((3, 6, 4), 1),
    "middle_negative": ((2, 5, 3, 2), -3),
    "long_rows": ((2, 300), -1),
}


@pytest.mark.parametrize("case", GRADCHECK_CASES)
@pytest.mark.parametrize("clamp", [False, True], ids=["eps_default", "eps_clamps"])
def test_gradcheck(device, case, clamp):
    shape, dim = GRADCHECK_CASES[case]
    x = randn(shape, torch.float64, device)
    eps = 1e-12
    if clamp:
        # Scale alternate rows to norm 0.2 and 3 around eps = 1, far from the clamp's kink.
        eps = 1.0
        moved = x.movedim(dim, -1)
        moved = moved / torch.linalg.vector_norm(moved, dim=-1, keepdim=True)
        flat = moved.reshape(-1, moved.shape[-1])
        flat = (
            flat
            * torch.tensor([0.2, 3.0], dtype=torch.float64, device=device).repeat(flat.shape[0])[
                : flat.shape[0], None
            ]
        )
        x = flat.reshape(moved.shape).movedim(-1, dim).contiguous()
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: rownorm.l2_normalize(t, dim, eps), (x,))


def test_double_backward_is_not_silently_wrong(device):
    """A gradient of the gradient (e.g. a gradient penalty) is right or a clear error.

    Double backward is not required (the backward op need not be differentiable), but it must
    not silently drop the second-order term.
    """
    x = randn((3, 8), torch.float64, device).requires_grad_(True)
    dy = randn((3, 8), torch.float64, device)
    x_ref = x.detach().clone().requires_grad_(True)
    (g_ref,) = torch.autograd.grad(F.normalize(x_ref, dim=-1), x_ref, dy, create_graph=True)
    (gg_ref,) = torch.autograd.grad(g_ref.square().sum(), x_ref)
    try:
        (g,) = torch.autograd.grad(rownorm.l2_normalize(x), x, dy, create_graph=True)
        (gg,) = torch.autograd.grad(g.square().sum(), x, allow_unused=True)
    except (RuntimeError, NotImplementedError):
        return  # refused clearly: acceptable
    assert gg is not None, "the second-order gradient was silently dropped (None)"
    torch.testing.assert_close(gg, gg_ref)


def test_gradcheck_non_contiguous(device):
    x = randn((11, 4), torch.float64, device).t().requires_grad_(True)
    assert not x.is_contiguous()
    assert torch.autograd.gradcheck(lambda t: rownorm.l2_normalize(t, -1), (x,))
    assert torch.autograd.gradcheck(lambda t: rownorm.l2_normalize(t, 0), (x,))


# ---------------------------------------------------------------------------------------------
# Streams and devices (CUDA)


@cuda_only
@pytest.mark.parametrize("n", (33, 4096, 65535, 131072))
def test_current_stream_is_used(n):
    """The kernels run on the current stream: work queued before them on it is seen.

    The input is written on a side stream behind a long sleep; an op launched on any other
    stream would read the old values.
    """
    rows = 8
    src = randn((rows, n), torch.float32, "cuda")
    dy = randn((rows, n), torch.float32, "cuda")
    x = torch.ones_like(src)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~ tens of ms
        x.copy_(src)
        y = l2(x)
        dx = l2_backward(dy, x)
    side.synchronize()
    assert_matches(y, reference_forward(src, -1, 1e-12), what="forward")
    assert_grad_matches(dx, dy, src, -1, 1e-12, what="backward")


@cuda_only
def test_tensor_on_second_gpu():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    dev = torch.device("cuda", 1)
    assert torch.cuda.current_device() == 0
    for n in (33, 4096, 65535):
        x = randn((5, n), torch.float32, dev)
        dy = randn((5, n), torch.float32, dev)
        y = l2(x)
        assert y.device == dev
        assert_matches(y, reference_forward(x, -1, 1e-12), what=f"N={n}")
        assert_grad_matches(l2_backward(dy, x), dy, x, -1, 1e-12)
        x3, dim = DIM_CASES["middle"](n, torch.float32, dev)
        assert_matches(l2(x3, dim), reference_forward(x3, dim, 1e-12), what="strided dim")
    assert torch.cuda.current_device() == 0


# ---------------------------------------------------------------------------------------------
# The module


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_module(device, dtype):
    x = randn((3, 10, 6), dtype, device)
    for dim, eps in ((-1, 1e-12), (1, 1e-12), (0, 2.0)):
        m = rownorm.nn.L2Norm(dim, eps)
        assert_matches(m(x), reference_forward(x, dim, eps), what=f"dim={dim} eps={eps}")
    m = rownorm.nn.L2Norm(1)
    assert m.extra_repr() == "dim=1, eps=1e-12"
    assert repr(m) == "L2Norm(dim=1, eps=1e-12)"
    assert repr(rownorm.nn.L2Norm()) == "L2Norm(dim=-1, eps=1e-12)"
    assert dict(m.state_dict()) == {}
    assert list(m.parameters()) == []


def test_module_rejects_negative_eps():
    with pytest.raises(ValueError, match="eps must be >= 0"):
        rownorm.nn.L2Norm(eps=-1e-6)
