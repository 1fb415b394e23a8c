"""Autograd transforms: forward-mode AD and torch.func.

Forward-mode AD (torch.func.jvp / jacfwd, torch.autograd.forward_ad) gives torch's tangents
through the public functions and the raw forward ops (it was a silent zero / None); the raw
backward ops and torch.func's gradient transforms (grad, jacrev, hessian) raise an error naming
the op. torch.func.vmap runs through batching rules (the vmapped dim becomes more
rows), matching the per-sample results without vmap's slow fallback.
"""

from __future__ import annotations

import pytest
import rownorm
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
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


def _torch_calls(device):
    """torch's own ops, with the same parameters as _calls (same seed order)."""
    w, b, res = _p(device), _p(device), torch.randn(4, N, dtype=torch.float64, device=device)
    return {
        "rms_norm": lambda x: F.rms_norm(x, (N,), w),
        "layer_norm": lambda x: F.layer_norm(x, (N,), w, b),
        "softmax": lambda x: torch.softmax(x, -1),
        "log_softmax": lambda x: torch.log_softmax(x, -1),
        "l2_normalize": lambda x: F.normalize(x, 2.0, -1),
        "l1_normalize": lambda x: F.normalize(x, 1.0, -1),
        "add_rms_norm": lambda x: F.rms_norm(x + res, (N,), w),
    }


@pytest.mark.parametrize("op", OPS)
def test_forward_ad_matches_torch(op, device):
    """torch.func.jvp, jacfwd and forward_ad dual tensors give torch's tangents (were zero /
    None), through the public function and the raw op."""
    torch.manual_seed(0)
    calls = _calls(device)
    torch.manual_seed(0)
    ref = _torch_calls(device)[op]
    x = _x(device)
    v = torch.randn_like(x)
    want = jvp(ref, (x,), (v,))[1]
    want_jac = torch.func.jacfwd(ref)(x)
    for fn in calls[op]:
        out, tangent = jvp(fn, (x,), (v,))
        torch.testing.assert_close(out, fn(x))
        torch.testing.assert_close(tangent, want)
        torch.testing.assert_close(torch.func.jacfwd(fn)(x), want_jac)
        with fwAD.dual_level():
            got = fwAD.unpack_dual(fn(fwAD.make_dual(x, v))).tangent
        torch.testing.assert_close(got, want)


def test_forward_ad_parameters_and_dim(device):
    """Tangents of weight, bias and residual, and a non-last dim."""
    x, w, b = _x(device), _p(device), _p(device)
    res = torch.randn_like(x)
    tx, tw, tb, tr = (
        torch.randn_like(x),
        torch.randn_like(w),
        torch.randn_like(b),
        torch.randn_like(x),
    )
    cases = [
        (rownorm.layer_norm, lambda x, w, b: F.layer_norm(x, (N,), w, b), (x, w, b), (tx, tw, tb)),
        (rownorm.rms_norm, lambda x, w: F.rms_norm(x, (N,), w), (x, w), (tx, tw)),
        (
            lambda x, r, w: rownorm.add_rms_norm(x, r, w),
            lambda x, r, w: (F.rms_norm(x + r, (N,), w), x + r),
            (x, res, w),
            (tx, tr, tw),
        ),
        (lambda x: rownorm.softmax(x, 0), lambda x: torch.softmax(x, 0), (x,), (tx,)),
        (lambda x: rownorm.l2_normalize(x, 0), lambda x: F.normalize(x, dim=0), (x,), (tx,)),
    ]
    for fn, ref, primals, tangents in cases:
        torch.testing.assert_close(jvp(fn, primals, tangents)[1], jvp(ref, primals, tangents)[1])


def test_forward_ad_with_reverse_mode(device):
    """A dual tensor that also requires grad: the tangent, and backward still works."""
    x, w = _x(device).requires_grad_(), _p(device)
    v = torch.randn_like(x)
    want = jvp(lambda t: F.rms_norm(t, (N,), w), (x.detach(),), (v,))[1]
    with fwAD.dual_level():
        out = rownorm.rms_norm(fwAD.make_dual(x, v), w)
        torch.testing.assert_close(fwAD.unpack_dual(out).tangent, want)
        out.sum().backward()
    x2 = x.detach().requires_grad_()
    F.rms_norm(x2, (N,), w).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


def test_forward_ad_backward_ops_raise(device):
    """The raw *_backward ops have no forward-mode formula: an error naming the op."""
    x, g = _x(device), _x(device)
    ops = torch.ops.rownorm
    for name, fn in (
        ("softmax_backward", lambda t: ops.softmax_backward(g, t, -1)),
        ("l2_normalize_backward", lambda t: ops.l2_normalize_backward(g, t, -1, 1e-12)),
        ("rms_norm_backward", lambda t: ops.rms_norm_backward(g, t, None, -1, 1e-6, False)[0]),
    ):
        with pytest.raises(RuntimeError, match=rf"rownorm\.{name}: forward-mode AD is not"):
            jvp(fn, (x,), (torch.ones_like(x),))


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
