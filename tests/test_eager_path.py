"""The eager path of the public functions (ops.call): plain tensors skip the op's Python
autograd kernel, everything else goes through the dispatcher as before.

Specification: for plain dense tensors outside any mode, transform, tracer or forward-AD
level, ``rownorm.<op>`` calls the device's kernel directly when no gradient is needed and the
op's autograd.Function when one is; its outputs and gradients are the bits the dispatcher's
path gives. Any other call (a TorchDispatchMode, a torch function mode, vmap, torch.func.grad,
forward AD, a tensor subclass, tensors of differing dispatch keys, sparse input) takes the
dispatcher's path, so each of those features behaves as it did.
"""

from __future__ import annotations

import pytest
import rownorm
import torch
import torch.autograd.forward_ad as fwAD
from rownorm import ops
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from utils import OPS, op_params, randn


class _Spy:
    """Stands in for an op's overload in ops._EAGER and records which entry was used."""

    def __init__(self, op):
        self.op = op
        self.paths: list[str] = []

    def __call__(self, *args):
        self.paths.append("dispatcher")
        return self.op(*args)

    def redispatch(self, keys, *args):
        self.paths.append("kernel")
        return self.op.redispatch(keys, *args)


@pytest.fixture
def spy(monkeypatch):
    """spy(name): the _Spy of op ``name`` (its autograd.Function use is recorded as
    'function')."""

    def make(name: str) -> _Spy:
        op, function, tensor_args = ops._EAGER[name]
        s = _Spy(op)

        class Recorded(function):
            @staticmethod
            def forward(ctx, *args):
                s.paths.append("function")
                return function.forward(ctx, *args)

        monkeypatch.setitem(ops._EAGER, name, (s, Recorded, tensor_args))
        return s

    return make


def _raw(op, inp):
    return getattr(torch.ops.rownorm, op.name).default(*op.raw_args(inp, -1))


@pytest.mark.parametrize("op_id", op_params(OPS))
def test_same_bits_as_the_dispatcher(device, op_id):
    """Forward and every gradient, public function against torch.ops, bit for bit (bf16 on
    CUDA, where the kernels' rounding shows; float32 on the CPU)."""
    op = OPS[op_id]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    inp = op.inputs(randn((33, 1000), dtype, device), -1)
    with torch.no_grad():
        got = op.call(inp, -1)
        want = _raw(op, inp)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)

    grads = {}
    for path in ("public", "dispatcher"):
        leaves = {k: v.detach().clone().requires_grad_() for k, v in inp.items()}
        outs = op.call(leaves, -1) if path == "public" else _raw(op, leaves)
        outs = outs if isinstance(outs, tuple) else (outs,)
        gen = torch.Generator(device=device).manual_seed(1)
        loss = sum((o.float() * torch.randn(o.shape, generator=gen, device=device)).sum()
                   for o in outs)  # fmt: skip
        loss.backward()
        grads[path] = {k: v.grad for k, v in leaves.items()}
    for k in inp:
        torch.testing.assert_close(grads["public"][k], grads["dispatcher"][k], rtol=0, atol=0)


def test_paths_of_plain_tensors(device, spy):
    """No gradient needed (no_grad, inference_mode, inputs not requiring it): the kernel;
    an input requiring a gradient: the autograd.Function, and the gradient flows."""
    s = spy("rms_norm")
    x = randn((4, 64), torch.float32, device)
    w = torch.nn.Parameter(randn((64,), torch.float32, device))
    with torch.no_grad():
        rownorm.rms_norm(x, w)
    with torch.inference_mode():
        rownorm.rms_norm(x, w)
        rownorm.rms_norm(torch.randn(4, 64, device=device))  # an inference tensor
    rownorm.rms_norm(x)
    assert s.paths == ["kernel"] * 4
    s.paths.clear()
    rownorm.rms_norm(x, w).sum().backward()
    assert s.paths == ["function"]
    assert w.grad is not None and w.grad.shape == (64,)


class _NoopDispatchMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _NoopFunctionMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Subclass(torch.Tensor):
    pass


def test_everything_else_takes_the_dispatcher(device, spy):
    """Modes, transforms, forward AD, subclasses, mixed dispatch keys, sparse: the dispatcher."""
    s = spy("rms_norm")
    x = randn((4, 64), torch.float32, device)
    w = randn((64,), torch.float32, device)
    with _NoopDispatchMode():
        rownorm.rms_norm(x, w)
    with _NoopFunctionMode():
        rownorm.rms_norm(x, w)
    torch.func.vmap(lambda t: rownorm.rms_norm(t, w))(x)
    with pytest.raises(RuntimeError, match="torch.func reverse-mode"):  # as through torch.ops
        torch.func.grad(lambda t: rownorm.rms_norm(t, w).sum())(x)
    with fwAD.dual_level():
        rownorm.rms_norm(fwAD.make_dual(x, torch.ones_like(x)), w)
    rownorm.rms_norm(x.as_subclass(_Subclass), w)
    neg = rownorm.rms_norm(x, torch._neg_view(w))  # the Negative key: other dispatch keys
    assert s.paths == ["dispatcher"] * 7, s.paths
    torch.testing.assert_close(neg, rownorm.rms_norm(x, -w), rtol=0, atol=0)
    with pytest.raises(ValueError, match="dense"):
        rownorm.rms_norm(x.to_sparse(), w)


def test_compiled_call_uses_the_op(device):
    """Under torch.compile the public function stays the op (fullgraph: no graph break)."""
    x = randn((4, 64), torch.float32, device)
    w = randn((64,), torch.float32, device)
    compiled = torch.compile(lambda t: rownorm.rms_norm(t, w) * 2, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), rownorm.rms_norm(x, w) * 2, rtol=0, atol=0)
