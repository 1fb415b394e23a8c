"""l2_normalize: the properties only it has. The generic suite (rownorm.testing.OPS) runs it
through every row length, tier, layout, dim, poisoned output and stream like every other op.

Specification: ``torch.ops.rownorm.l2_normalize(x, dim=-1, eps=1e-12)`` equals
``F.normalize(x, p=2, dim=dim, eps=eps)``, i.e. ``x / clamp_min(‖x‖₂, eps)``; with eps=0 it is
the seed expression ``x / torch.norm(x, p=2, dim=1, keepdim=True)``. Its rows have unit norm
where ‖x‖ > eps, are ``x / eps`` (gradient ``dy / eps``) where the norm is clamped, and its
backward op is differentiable (double backward). Special values behave as in torch: a NaN
anywhere in a row makes the row NaN, forward and backward (for l1_normalize too, which shares
the clamp).
"""

from __future__ import annotations

import pytest
import rownorm
import torch
import torch.nn.functional as F
from utils import (
    DTYPES,
    TOL,
    assert_matches,
    assert_new_contiguous,
    clamped_rows,
    dtype_id,
    randn,
    scaled_rows,
)

dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)

NAN, INF = float("nan"), float("inf")

# The edge cases below (a zero row with eps = 0, a norm equal to eps, eps = inf with an inf in
# the row) have no single torch convention: torch's own autograd of F.normalize differs between
# versions and devices there (torch 2.11 passes the gradient through clamp_min where the norm
# equals eps, 2.14 does not; torch's CUDA kernels give NaN for a zero row with eps = 0 where
# its CPU gives ±inf). rownorm follows one convention on every device, the one of torch 2.14's
# CPU autograd: on the CPU these tests compare with that (where the installed torch is 2.14 or
# newer), on CUDA with rownorm's CPU op on the same values (one op body for both).
TORCH_HAS_OUR_EDGE_CONVENTION = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 14)


def _edge_grad(device, ours, theirs, x, dy):
    """The expected gradient of an edge case: ``theirs`` (torch's formula) by float64 autograd
    on the CPU, or on CUDA ``ours`` on the CPU copy of the same values (see above)."""
    if device == "cpu":
        if not TORCH_HAS_OUR_EDGE_CONVENTION:
            pytest.skip(f"torch {torch.__version__}'s edge-case gradient convention differs")
        x64 = x.double().cpu().requires_grad_(True)
        (dx,) = torch.autograd.grad(theirs(x64), x64, dy.double().cpu())
        return dx.to(x.dtype)
    leaf = x.cpu().requires_grad_(True)
    (dx,) = torch.autograd.grad(ours(leaf), leaf, dy.cpu())
    return dx


# (shape, dim): the reduced dim last, first, in the middle, and a long row.
SHAPES = [((5, 7), -1), ((129, 3), 0), ((4, 33, 6), 1), ((3, 1025), 1)]


def _seed(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The seed expression the op replaces (eps = 0), along ``dim``."""
    return x / torch.norm(x, p=2, dim=dim, keepdim=True)


def _vector_norm(t: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.linalg.vector_norm(t.double(), dim=dim)


# ---------------------------------------------------------------------------------------------
# Equality with the PyTorch expressions


@dtypes
@pytest.mark.parametrize("shape_dim", SHAPES, ids=str)
def test_matches_torch(device, dtype, shape_dim):
    """F.normalize for eps > 0, the seed expression for eps = 0 (a zero row gives NaN in both),
    evaluated in float64 on the same rounded input; fp32 / fp64 also in x's own dtype."""
    shape, dim = shape_dim
    x = randn(shape, dtype, device)
    x.movedim(dim, -1)[0] = 0  # one zero row
    x64 = x.double()
    for eps in (1e-12, 0.3, 0.0):
        y = rownorm.l2_normalize(x, dim, eps)
        assert_new_contiguous(y, x)
        if eps == 0:
            expected = [_seed(x64, dim)]
            assert torch.isnan(y.movedim(dim, -1)[0]).all()
        else:
            expected = [F.normalize(x64, p=2.0, dim=dim, eps=eps)]
        if dtype in (torch.float32, torch.float64):
            expected.append(_seed(x, dim) if eps == 0 else F.normalize(x, p=2.0, dim=dim, eps=eps))
        for e in expected:
            assert_matches(y, e.to(dtype), dim=dim, what=f"eps={eps} vs {e.dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_seed_expression_dim1(device, dtype):
    """The seed formula literally: 4-D x normalized over dim 1 (the strided-dim path)."""
    x = randn((2, 19, 5, 3), dtype, device)
    y = rownorm.l2_normalize(x, dim=1, eps=0.0)
    expected = x / torch.norm(x, p=2, dim=1, keepdim=True)
    assert_matches(y, expected, dim=1)


# ---------------------------------------------------------------------------------------------
# Unit rows and clamping


@dtypes
@pytest.mark.parametrize("shape_dim", SHAPES, ids=str)
def test_unit_rows(device, dtype, shape_dim):
    """Every row has norm 1, whatever its scale (norms from 1e-2 to 1e2)."""
    shape, dim = shape_dim
    n = shape[dim]
    rows = scaled_rows(max(3, torch.Size(shape).numel() // n), n, dtype, device)
    moved = list(shape)
    del moved[dim]
    x = rows.reshape(*moved, n).movedim(-1, dim)
    norms = _vector_norm(rownorm.l2_normalize(x, dim), dim)
    worst = (norms - 1).abs().max().item()
    assert worst <= TOL[dtype].unit, f"a row's norm is off 1 by {worst:.2e}"


@dtypes
@pytest.mark.parametrize("eps", [1e-3, 1.0, 7.0])
@pytest.mark.parametrize("n", (7, 1025))
def test_eps_clamps(device, dtype, eps, n):
    """Rows with ‖x‖ < eps give x / eps and the gradient dy / eps; the others unit rows and
    the projected gradient; both equal F.normalize's (float64 autograd on the rounded x)."""
    x = clamped_rows(16, n, dtype, device, eps)
    dy = randn(x.shape, dtype, device)
    leaf = x.clone().requires_grad_(True)
    y = rownorm.l2_normalize(leaf, -1, eps)
    (dx,) = torch.autograd.grad(y, leaf, dy)
    small = _vector_norm(x, -1) < eps
    assert small.any() and (~small).any()
    assert_matches(y[small], (x[small].double() / eps).to(dtype), dim=-1, what="clamped rows")
    assert_matches(dx[small], (dy[small].double() / eps).to(dtype), dim=-1, what="clamped dx")
    worst = (_vector_norm(y[~small], -1) - 1).abs().max().item()
    assert worst <= TOL[dtype].unit, f"an unclamped row's norm is off 1 by {worst:.2e}"
    x64 = x.double().requires_grad_(True)
    y64 = F.normalize(x64, p=2.0, dim=-1, eps=eps)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double())
    assert_matches(y, y64.detach().to(dtype), dim=-1, what="y vs F.normalize")
    norm = _vector_norm(x, -1).clamp_min(eps).unsqueeze(-1)
    assert_matches(dx, dx64.to(dtype), magnitude=dy.double().abs() / norm, dim=-1, what="dx")


@dtypes
def test_zero_rows(device, dtype):
    """A zero row: y = 0 and dx = dy / eps for eps > 0; with eps = 0, y is NaN (0 / 0) and dx
    is dy / 0 = ±inf (the convention of torch 2.14's CPU autograd, see _edge_grad)."""
    x = randn((6, 9), dtype, device)
    x[::2] = 0
    dy = randn(x.shape, dtype, device)
    for eps in (1e-3, 0.0):
        leaf = x.clone().requires_grad_(True)
        y = rownorm.l2_normalize(leaf, -1, eps)
        (dx,) = torch.autograd.grad(y, leaf, dy)
        y64 = F.normalize(x.double(), p=2.0, dim=-1, eps=eps)
        dx64 = _edge_grad(
            device,
            lambda t, eps=eps: rownorm.l2_normalize(t, -1, eps),
            lambda t, eps=eps: F.normalize(t, p=2.0, dim=-1, eps=eps),
            x,
            dy,
        ).to(device)
        if eps > 0:
            assert torch.count_nonzero(y[::2]) == 0
        else:
            assert torch.isnan(y[::2]).all() and torch.isinf(dx[::2]).all()
        assert_matches(y, y64.detach().to(dtype), dim=-1, what=f"eps={eps} y")
        # equal_nan in assert_matches: ±inf must match in position and sign as well
        assert torch.equal(torch.isinf(dx), torch.isinf(dx64)), f"eps={eps}: inf positions"
        assert torch.equal(dx[::2].sign(), dx64[::2].sign()), f"eps={eps}: signs"


@pytest.mark.parametrize("op", ["l2", "l1"])
def test_norm_equal_to_eps(device, op):
    """‖x‖ == eps exactly: no gradient through the norm there (torch 2.14's clamp_min, see
    _edge_grad), so dx = dy / eps (the rows are exact in binary: norm 1 for p = 2 and p = 1)."""
    x = torch.tensor([[0.5, 0.5, -0.5, 0.5], [0.25, -0.25, 0.25, 0.25]], dtype=torch.float64)
    x = x[:1] if op == "l2" else x[1:]
    dy = torch.tensor([[1.0, 2.0, -3.0, 0.5]], dtype=torch.float64)
    leaf = x.to(device).requires_grad_(True)
    (dx,) = torch.autograd.grad(_rownorm(op, leaf, 1.0), leaf, dy.to(device))
    torch.testing.assert_close(dx.cpu(), dy, rtol=1e-15, atol=0)
    expected = _edge_grad(
        device, lambda t: _rownorm(op, t, 1.0), lambda t: _torch_formula(op, t, 1.0), x, dy
    )
    torch.testing.assert_close(dx.cpu(), expected.cpu(), rtol=1e-15, atol=0)


# ---------------------------------------------------------------------------------------------
# Special values (NaN, ±inf) of l2_normalize and l1_normalize: as torch's formula, forward and
# backward. Rows: ordinary, a NaN, +inf, -inf, both infs, a NaN and an inf, all zero.

SPECIAL_ROWS = [
    [1.0, -2.0, 0.5, 3.0],
    [1.0, NAN, 2.0, -1.0],
    [1.0, INF, 2.0, 0.0],
    [-INF, 1.0, 2.0, -3.0],
    [INF, -INF, 1.0, 2.0],
    [NAN, INF, 1.0, 2.0],
    [0.0, 0.0, 0.0, 0.0],
]


def _torch_formula(op: str, x: torch.Tensor, eps: float) -> torch.Tensor:
    """What the op computes, written in torch ops: F.normalize (p=2, p=1) or mean|x|."""
    if op == "mean_abs":
        return x / x.abs().mean(-1, keepdim=True).clamp_min(eps)
    return F.normalize(x, p=2.0 if op == "l2" else 1.0, dim=-1, eps=eps)


def _rownorm(op: str, x: torch.Tensor, eps: float) -> torch.Tensor:
    if op == "l2":
        return rownorm.l2_normalize(x, -1, eps)
    return rownorm.l1_normalize(x, -1, eps, mean=op == "mean_abs")


def _assert_same_values(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """NaN and ±inf exactly where expected (with signs); finite values within tolerance."""
    assert torch.equal(torch.isnan(got), torch.isnan(expected)), f"{what}: NaN positions"
    inf = torch.isinf(expected)
    assert torch.equal(torch.isinf(got), inf), f"{what}: inf positions"
    assert torch.equal(got[inf], expected[inf]), f"{what}: inf signs"
    finite = torch.isfinite(expected)
    tol = TOL[got.dtype]
    torch.testing.assert_close(
        got[finite].double(), expected[finite].double(), rtol=tol.rtol, atol=tol.atol, msg=what
    )


@pytest.mark.parametrize("op", ["l2", "l1", "mean_abs"])
@dtypes
@pytest.mark.parametrize("eps", [1e-12, 0.0, 1.0, INF], ids=["eps1e-12", "eps0", "eps1", "epsinf"])
def test_special_values(device, op, dtype, eps):
    x = torch.tensor(SPECIAL_ROWS, dtype=dtype, device=device)
    dy = torch.tensor([[0.5, -1.0, 2.0, 1.5]], dtype=dtype, device=device).expand_as(x)
    leaf = x.clone().requires_grad_(True)
    y = _rownorm(op, leaf, eps)
    (dx,) = torch.autograd.grad(y, leaf, dy)
    # torch's formula in float64 on the same rounded values (float64 only to keep its own
    # rounding out of the comparison; the special values are the same in every dtype).
    y64 = _torch_formula(op, x.double(), eps)
    _assert_same_values(y, y64.to(dtype), f"{op} eps={eps} forward")
    dx_expected = _edge_grad(
        device, lambda t: _rownorm(op, t, eps), lambda t: _torch_formula(op, t, eps), x, dy
    )
    _assert_same_values(dx.cpu(), dx_expected.cpu(), f"{op} eps={eps} backward")


@dtypes
def test_nan_propagates(device, dtype):
    """The reported case: one NaN makes the whole row NaN (it used to give x / eps)."""
    x = torch.tensor([[1.0, NAN, 2.0], [3.0, 4.0, 0.0]], dtype=dtype, device=device)
    for eps in (1e-12, 0.0):
        y = rownorm.l2_normalize(x, -1, eps)
        assert torch.isnan(y[0]).all(), f"eps={eps}: {y[0].tolist()}"
        assert_matches(y[1:], F.normalize(x[1:].double(), dim=-1).to(dtype), dim=-1)
    for mean in (False, True):
        assert torch.isnan(rownorm.l1_normalize(x, -1, 1e-12, mean)[0]).all()


# ---------------------------------------------------------------------------------------------
# Double backward


def _clamped_and_free_rows(shape, dim, device) -> torch.Tensor:
    """float64 rows alternately of norm 0.2 and 3 (eps = 1 clamps the first kind), far from the
    clamp's kink for finite differences."""
    x = randn(shape, torch.float64, device).movedim(dim, -1)
    x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    flat = x.reshape(-1, x.shape[-1])
    scale = torch.tensor([0.2, 3.0], dtype=torch.float64, device=device).repeat(flat.shape[0])
    flat = flat * scale[: flat.shape[0], None]
    return flat.reshape(x.shape).movedim(-1, dim).contiguous()


# (shape, dim, eps): the reduced dim last, first, in the middle; clamped rows; a transposed x.
DOUBLE_BACKWARD_CASES = {
    "rows": ((4, 9), -1, 1e-12),
    "dim0": ((7, 3), 0, 1e-12),
    "middle": ((3, 6, 4), 1, 1e-12),
    "clamped": ((6, 5), -1, 1.0),
    "transposed": ((9, 4), 0, 1e-12),
}


@pytest.mark.parametrize("case", DOUBLE_BACKWARD_CASES)
def test_gradgradcheck(device, case):
    shape, dim, eps = DOUBLE_BACKWARD_CASES[case]
    if eps > 1e-6:
        x = _clamped_and_free_rows(shape, dim, device)
    else:
        x = randn(shape, torch.float64, device)
    if case == "transposed":
        x = x.t().contiguous().t()
        assert not x.is_contiguous()
    x.requires_grad_(True)

    def fn(t):
        return rownorm.l2_normalize(t, dim, eps)

    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


@dtypes
def test_double_backward_matches_torch(device, dtype):
    """A gradient penalty: ∂/∂x Σ(∂L/∂x)² equals F.normalize's (float64 on the rounded x),
    with a clamped row among the others. (No zero row: torch's second derivative of the norm
    at 0 is NaN, where the clamped formula's is 0.)"""
    x = randn((5, 33), dtype, device)
    x[1] = x[1] * 1e-3  # ‖x‖ < eps = 0.1: clamped
    dy = randn(x.shape, dtype, device)
    eps = 0.1
    leaf = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(rownorm.l2_normalize(leaf, -1, eps), leaf, dy, create_graph=True)
    (gg,) = torch.autograd.grad(g.double().square().sum(), leaf)
    x64 = x.double().requires_grad_(True)
    y64 = F.normalize(x64, dim=-1, eps=eps)
    (g64,) = torch.autograd.grad(y64, x64, dy.double(), create_graph=True)
    (gg64,) = torch.autograd.grad(g64.square().sum(), x64)
    assert gg.dtype == dtype
    # The second-order terms are products of up to four first-order-sized factors.
    norm = _vector_norm(x, -1).clamp_min(eps).unsqueeze(-1)
    scale = (dy.double().abs().amax(-1, keepdim=True) / norm) ** 2 / norm
    assert_matches(gg, gg64.to(dtype), magnitude=scale.expand_as(gg64), dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("scale", [1.0, 1e13, 1e18])
def test_backward_op_gradients_at_large_norms(device, dtype, scale):
    """The gradients of l2_normalize_backward (the double backward's pieces) on rows of norm up
    to ~1e19, still in float32's range (Σx² < 3.4e38): against the same formula in float64.
    Written with x·r³, r = 1/‖x‖, they lost the y-term where r³ underflows float32."""
    x = randn((4, 7), dtype, device) * scale
    g, u = randn(x.shape, dtype, device), randn(x.shape, dtype, device)

    def grads(x, g, u):
        x, g = x.clone().requires_grad_(True), g.clone().requires_grad_(True)
        dx = torch.ops.rownorm.l2_normalize_backward(g, x, -1, 1e-12)
        return torch.autograd.grad(dx, (x, g), u)

    got = grads(x, g, u)
    want = grads(x.double(), g.double(), u.double())
    norm = _vector_norm(x, -1).unsqueeze(-1)
    mag_x = u.double().abs().amax(-1, keepdim=True) * g.double().abs().amax(-1, keepdim=True)
    for name, a, b, mag in (
        ("dx", got[0], want[0], mag_x / norm**2),
        ("dg", got[1], want[1], 1 / norm),
    ):
        assert_matches(a, b.to(dtype), magnitude=mag.expand_as(b), dim=-1, what=f"{name} {scale:g}")


# ---------------------------------------------------------------------------------------------
# The module


def test_module(device):
    x = randn((3, 10, 6), torch.float32, device)
    for dim, eps in ((-1, 1e-12), (1, 1e-12), (0, 2.0)):
        expected = F.normalize(x, p=2.0, dim=dim, eps=eps)
        assert_matches(rownorm.nn.L2Norm(dim, eps)(x), expected, dim=dim)
    m = rownorm.nn.L2Norm(1)
    assert repr(m) == "L2Norm(dim=1, eps=1e-12)"
    assert repr(rownorm.nn.L2Norm()) == "L2Norm(dim=-1, eps=1e-12)"
    assert dict(m.state_dict()) == {} and list(m.parameters()) == []
