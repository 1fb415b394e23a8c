"""Autograd transforms: forward-mode AD and torch.func.

rownorm registers reverse-mode formulas only. Forward-mode AD (torch.func.jvp / jacfwd,
torch.autograd.forward_ad) and torch.func's gradient transforms (grad, jacrev, hessian) raise
an error naming the op, through the public function and the raw op alike, instead of a zero
or None tangent. torch.func.vmap runs through batching rules (the vmapped dim becomes more
rows), matching the per-sample results without vmap's slow fallback.
"""

from __future__ import annotations

import pytest
import rownorm
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import grad, hessian, jacrev, jvp, vmap

N = 6


def _p(device):
    return torch.randn(N, dtype=torch.float64, device=device)


# name -> (public function of x, raw op of x); weights and residuals are fixed per call.
def _calls(device):
    w, b, res = _p(device), _p(device), torch.randn(4, N, dtype=torch.float64, device=device)
    ops = torch.ops.rownorm
    return {
        "rms_norm": (lambda x: rownorm.rms_norm(x, w), lambda x: ops.rms_norm(x, w)),
        "layer_norm": (lambda x: rownorm.layer_norm(x, w, b), lambda x: ops.layer_norm(x, w, b)),
        "softmax": (rownorm.softmax, ops.softmax),
        "log_softmax": (rownorm.log_softmax, ops.log_softmax),
        "l2_normalize": (rownorm.l2_normalize, ops.l2_normalize),
        "l1_normalize": (rownorm.l1_normalize, ops.l1_normalize),
        "add_rms_norm": (
            lambda x: rownorm.add_rms_norm(x, res, w)[0],
            lambda x: ops.add_rms_norm(x, res, w)[0],
        ),
    }


OPS = ("rms_norm", "layer_norm", "softmax", "log_softmax", "l2_normalize", "l1_normalize")
OPS += ("add_rms_norm",)


def _x(device):
    return torch.randn(4, N, dtype=torch.float64, device=device)


@pytest.mark.parametrize("op", OPS)
def test_forward_ad_raises(op, device):
    """torch.func.jvp and forward_ad dual tensors: a clear error, never a zero/None tangent."""
    for fn in _calls(device)[op]:
        x = _x(device)
        with pytest.raises(RuntimeError, match=rf"rownorm\.{op}: forward-mode AD is not supported"):
            jvp(fn, (x,), (torch.ones_like(x),))
        with fwAD.dual_level(), pytest.raises(RuntimeError, match=rf"rownorm\.{op}: forward-mode"):
            fn(fwAD.make_dual(x, torch.ones_like(x)))


def test_forward_ad_tangent_on_weight_raises(device):
    x, w = _x(device), _p(device)
    with fwAD.dual_level(), pytest.raises(RuntimeError, match=r"rownorm\.rms_norm: forward-mode"):
        rownorm.rms_norm(x, fwAD.make_dual(w, torch.ones_like(w)))


@pytest.mark.parametrize("op", OPS)
def test_func_grad_transforms_raise(op, device):
    """grad / jacrev / hessian: an error naming the op (was autograd.Function's setup_context)."""
    for fn in _calls(device)[op]:
        summed = lambda t, fn=fn: fn(t).sum()  # noqa: E731
        for f in (grad(summed), jacrev(fn), hessian(summed)):
            with pytest.raises(RuntimeError, match=rf"rownorm\.{op}: .*not supported"):
                f(_x(device))


@pytest.fixture
def no_fallback(capfd):
    """Fails the test when vmap falls back to its slow per-sample loop: that fallback's
    warning (off by default) is a C++ warning printed on stderr."""
    torch._C._functorch._set_vmap_fallback_warning_enabled(True)
    try:
        yield
    finally:
        torch._C._functorch._set_vmap_fallback_warning_enabled(False)
    assert "we have not yet implemented the batching rule" not in capfd.readouterr().err


@pytest.mark.parametrize("op", OPS)
def test_vmap_batching_rule(op, device, no_fallback):
    """vmap matches the per-sample results, through a batching rule, for every in_dim."""
    for in_dim in (0, 1, 2):
        xs = torch.randn(3, 4, N, dtype=torch.float64, device=device).movedim(0, in_dim)
        for fn in _calls(device)[op]:
            got = vmap(fn, in_dims=in_dim)(xs)
            want = torch.stack([fn(xs.select(in_dim, i)) for i in range(3)])
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dim", [0, 1, -2])
def test_vmap_non_last_dim(dim, device, no_fallback):
    xs = torch.randn(4, 3, 5, N, dtype=torch.float64, device=device)
    fns = [
        lambda t: rownorm.softmax(t, dim),
        lambda t: rownorm.rms_norm(t, dim=dim),
        lambda t: rownorm.layer_norm(t, dim=dim),
        lambda t: rownorm.l1_normalize(t, dim, 1e-12, True),
        lambda t: torch.ops.rownorm.l2_normalize(t, dim),
    ]
    for fn in fns:
        got = vmap(fn, in_dims=1)(xs)
        torch.testing.assert_close(got, torch.stack([fn(xs[:, i]) for i in range(3)]))


def test_vmap_batched_weight_and_residual(device, no_fallback):
    xs, ws = torch.randn(3, 4, N, dtype=torch.float64, device=device), _p(device).expand(3, N)
    ws = ws + torch.randn(3, N, dtype=torch.float64, device=device)
    res = torch.randn(4, N, dtype=torch.float64, device=device)
    got = vmap(rownorm.rms_norm)(xs, ws)
    out, h = vmap(lambda x, w: rownorm.add_rms_norm(x, res, w))(xs, ws)
    torch.testing.assert_close(got, torch.stack([rownorm.rms_norm(xs[i], ws[i]) for i in range(3)]))
    for i in range(3):
        o, hh = rownorm.add_rms_norm(xs[i], res, ws[i])
        torch.testing.assert_close(out[i], o)
        torch.testing.assert_close(h[i], hh)


def test_vmap_then_backward(device, no_fallback):
    """Regular autograd through a vmapped call gives the per-sample gradients."""
    w = _p(device)
    x1 = torch.randn(4, 3, N, dtype=torch.float64, device=device, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    y = vmap(lambda t: rownorm.layer_norm(t, w), in_dims=1)(x1)
    y.pow(2).sum().backward()
    torch.stack([rownorm.layer_norm(x2[:, i], w) for i in range(3)]).pow(2).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)
