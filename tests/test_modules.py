"""The nn modules of the op set: drop-in replacements of torch's, with the same state.

* ``rownorm.nn.RMSNorm`` / ``LayerNorm`` take torch.nn.RMSNorm's / LayerNorm's constructor
  arguments (one normalized dim) plus ``dim=``, hold the same parameters (names, shapes,
  initialization), so a ``state_dict`` loads unchanged in either direction, and compute the
  same outputs and parameter gradients. ``AddRMSNorm`` holds RMSNorm's state.
* ``L1Norm(dim, eps, mean)``, ``Softmax(dim)``, ``LogSoftmax(dim)``: stateless.

Why the grid is what it is: the modules wrap the functions (whose numerics the op-table tests
cover), so the ids are per module pair (state, dtype conversion, construction checks); the
modules of every op case are also compared with the functions in test_correctness.
"""

from __future__ import annotations

import re

import pytest
import rownorm
import torch
import torch.nn.functional as F
from utils import DTYPES, assert_matches, dtype_id, randn

pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")

N = 40


def _randomize(module: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(randn(p.shape, p.dtype, p.device))
    return module


# (rownorm module, torch module) constructors with the same arguments.
PAIRS = {
    "rms_norm": (lambda **kw: rownorm.nn.RMSNorm(N, **kw), lambda **kw: torch.nn.RMSNorm(N, **kw)),
    "rms_norm_eps": (
        lambda **kw: rownorm.nn.RMSNorm((N,), eps=1e-5, **kw),
        lambda **kw: torch.nn.RMSNorm((N,), eps=1e-5, **kw),
    ),
    "rms_norm_no_affine": (
        lambda **kw: rownorm.nn.RMSNorm([N], elementwise_affine=False, **kw),
        lambda **kw: torch.nn.RMSNorm([N], elementwise_affine=False, **kw),
    ),
    "layer_norm": (
        lambda **kw: rownorm.nn.LayerNorm(N, **kw),
        lambda **kw: torch.nn.LayerNorm(N, **kw),
    ),
    "layer_norm_no_bias": (
        lambda **kw: rownorm.nn.LayerNorm(N, eps=1e-3, bias=False, **kw),
        lambda **kw: torch.nn.LayerNorm(N, eps=1e-3, bias=False, **kw),
    ),
    "layer_norm_no_affine": (
        lambda **kw: rownorm.nn.LayerNorm(N, elementwise_affine=False, **kw),
        lambda **kw: torch.nn.LayerNorm(N, elementwise_affine=False, **kw),
    ),
}


@pytest.mark.parametrize("pair", PAIRS)
def test_state_dict_interchange(device, pair):
    """torch's state loads into rownorm's module and back (strict), and both compute the same
    outputs and parameter gradients."""
    make_ours, make_torch = PAIRS[pair]
    theirs = _randomize(make_torch(device=device))
    ours = make_ours(device=device)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    for name, p in ours.named_parameters():
        assert p.shape == getattr(theirs, name).shape
    ours.load_state_dict(theirs.state_dict())
    back = make_torch(device=device)
    back.load_state_dict(_randomize(make_ours(device=device)).state_dict())  # the other way
    x = randn((6, N), torch.float32, device)
    y_ours, y_theirs = ours(x), theirs(x)
    assert_matches(y_ours, y_theirs, dim=-1)
    if not list(ours.parameters()):
        return
    dy = randn(y_ours.shape, torch.float32, device)
    y_ours.backward(dy)
    y_theirs.backward(dy)
    for name, p in ours.named_parameters():
        q = getattr(theirs, name)
        assert_matches(p.grad, q.grad, what=name)


@pytest.mark.parametrize("pair", PAIRS)
def test_fresh_modules_match(pair):
    """Same initialization as torch's (weight ones, bias zeros), same attributes."""
    make_ours, make_torch = PAIRS[pair]
    ours, theirs = make_ours(), make_torch()
    for key, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    for attr in ("normalized_shape", "eps", "elementwise_affine"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    for name in ("weight", "bias"):
        if hasattr(theirs, name) and getattr(theirs, name) is None:
            assert getattr(ours, name) is None, name


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64], ids=dtype_id)
def test_module_to_dtype(device, pair, dtype):
    """model.to(dtype) converts the parameters; outputs match torch's converted module."""
    make_ours, make_torch = PAIRS[pair]
    theirs = _randomize(make_torch(device=device))
    ours = make_ours(device=device)
    ours.load_state_dict(theirs.state_dict())
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    for p in ours.parameters():
        assert p.dtype == dtype
    x = randn((6, N), dtype, device)
    y = ours(x)
    assert y.dtype == dtype
    # torch's 16-bit modules round intermediates; compare with them in float32 math.
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    expected = theirs.to(compute)(x.to(compute)).to(dtype)
    assert_matches(y, expected, dim=-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_module_float32_params_16bit_input(device, dtype):
    """A float32 module on 16-bit activations (autocast-style): output in x's dtype,
    float32 parameter gradients."""
    for ours, theirs in (
        (rownorm.nn.RMSNorm(N, device=device), torch.nn.RMSNorm(N, device=device)),
        (rownorm.nn.LayerNorm(N, device=device), torch.nn.LayerNorm(N, device=device)),
    ):
        theirs = _randomize(theirs)
        ours.load_state_dict(theirs.state_dict())
        x = randn((6, N), dtype, device)
        y = ours(x)
        assert y.dtype == dtype
        # torch's CUDA layer_norm rejects float32 parameters with 16-bit x: compare with its
        # float32 result, rounded.
        assert_matches(y, theirs(x.float()).to(dtype), dim=-1)
        y.float().square().sum().backward()
        assert all(p.grad.dtype == torch.float32 for p in ours.parameters())


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_module_dim(device, dtype):
    """dim= normalizes another dim: the channels of NCHW, as torch's modules on NHWC."""
    x = randn((2, N, 3, 5), dtype, device)
    for ours, theirs in (
        (rownorm.nn.RMSNorm(N, eps=1e-5, dim=1), torch.nn.RMSNorm(N, eps=1e-5)),
        (rownorm.nn.LayerNorm(N, dim=1), torch.nn.LayerNorm(N)),
    ):
        ours, theirs = ours.to(device, dtype), _randomize(theirs.to(device, dtype))
        ours.load_state_dict(theirs.state_dict())
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        expected = theirs.to(compute)(x.to(compute).movedim(1, -1)).movedim(-1, 1).to(dtype)
        assert_matches(ours(x), expected, dim=1)


def test_extra_repr():
    """The repr shows torch's fields (and dim when not the last)."""
    assert torch.nn.RMSNorm(N).extra_repr() in rownorm.nn.RMSNorm(N).extra_repr()
    assert torch.nn.LayerNorm(N, bias=False).extra_repr() in (
        rownorm.nn.LayerNorm(N, bias=False).extra_repr()
    )
    assert "dim=1" in rownorm.nn.RMSNorm(N, dim=1).extra_repr()
    assert "dim=1" in rownorm.nn.LayerNorm(N, dim=1).extra_repr()
    assert torch.nn.RMSNorm(N, eps=1e-5).extra_repr() in (
        rownorm.nn.AddRMSNorm(N, eps=1e-5).extra_repr()
    )
    l1 = repr(rownorm.nn.L1Norm(1, 0.5, mean=True))
    assert l1.startswith("L1Norm(") and all(s in l1 for s in ("dim=1", "eps=0.5", "mean=True"))
    assert "dim=0" in repr(rownorm.nn.Softmax(0)) and "dim=2" in repr(rownorm.nn.LogSoftmax(2))


@pytest.mark.parametrize("cls", ["RMSNorm", "LayerNorm", "AddRMSNorm"])
def test_normalized_shape_must_be_one_dim(cls):
    with pytest.raises(ValueError, match=re.escape(f"{cls}: only one normalized dim")):
        getattr(rownorm.nn, cls)((4, N))


@pytest.mark.parametrize("cls", ["RMSNorm", "LayerNorm", "AddRMSNorm", "L1Norm"])
def test_modules_reject_negative_eps(cls):
    with pytest.raises(ValueError, match=re.escape(f"{cls}: eps must be >= 0, got -0.5")):
        if cls == "L1Norm":
            rownorm.nn.L1Norm(eps=-0.5)
        else:
            getattr(rownorm.nn, cls)(N, eps=-0.5)


def test_modules_check_the_normalized_size(device):
    x = randn((3, N + 1), torch.float32, device)
    for module in (rownorm.nn.RMSNorm(N, elementwise_affine=False), rownorm.nn.LayerNorm(N)):
        with pytest.raises(RuntimeError, match=rf"x.size\(-1\) == {N}"):
            module.to(device)(x)


@pytest.mark.parametrize("cls", ["RMSNorm", "AddRMSNorm"])
def test_rms_norm_options(device, cls):
    """weight_offset and casting_mode: the weight starts at 1 − weight_offset (Gemma's zeros
    for 1.0, so the scale starts at 1), they show in the repr, reach the function, and are
    checked when the module is made."""
    make = getattr(rownorm.nn, cls)
    gemma = make(N, eps=1e-6, weight_offset=1.0, device=device)
    assert torch.equal(gemma.weight, torch.zeros(N, device=device))
    assert "weight_offset=1.0" in repr(gemma) and "casting_mode" not in repr(gemma)
    llama = _randomize(make(N, eps=1e-6, casting_mode="llama", device=device, dtype=torch.bfloat16))
    assert "casting_mode='llama'" in repr(llama)
    x = randn((5, N), torch.bfloat16, device)
    args = (x, torch.zeros_like(x)) if cls == "AddRMSNorm" else (x,)
    out = llama(*args)
    out = out[0] if cls == "AddRMSNorm" else out
    w = llama.weight.detach()
    assert torch.equal(out, rownorm.rms_norm(x, w, eps=1e-6, casting_mode="llama"))
    assert not torch.equal(out, rownorm.rms_norm(x, w, eps=1e-6)), "the modes differ in bf16"
    with pytest.raises(ValueError, match=re.escape(f"{cls}: weight_offset needs a weight")):
        make(N, elementwise_affine=False, weight_offset=1.0)
    with pytest.raises(ValueError, match=re.escape(f"{cls}: casting_mode must be one of")):
        make(N, casting_mode="gemma")


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_affine"])
def test_add_rms_norm_module(device, affine):
    """AddRMSNorm(x, residual) = (RMSNorm(x + residual), x + residual), with RMSNorm's state."""
    theirs = _randomize(torch.nn.RMSNorm(N, eps=1e-6, elementwise_affine=affine, device=device))
    ours = rownorm.nn.AddRMSNorm(N, eps=1e-6, elementwise_affine=affine, device=device)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    # ... and from rownorm's RMSNorm too.
    rownorm.nn.RMSNorm(N, eps=1e-6, elementwise_affine=affine).load_state_dict(ours.state_dict())
    x = randn((2, 5, N), torch.float32, device)
    residual = randn((2, 5, N), torch.float32, device)
    out, r = ours(x, residual)
    assert_matches(r, x + residual)
    assert_matches(out, theirs(x + residual), dim=-1)
    if affine:
        out.sum().backward()
        theirs(x + residual).sum().backward()
        assert_matches(ours.weight.grad, theirs.weight.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_stateless_modules(device, dtype):
    x = randn((3, 10, 6), dtype, device)
    for dim in (-1, 1, 0):
        assert_matches(rownorm.nn.Softmax(dim)(x), torch.nn.Softmax(dim)(x), dim=dim)
        assert_matches(rownorm.nn.LogSoftmax(dim)(x), torch.nn.LogSoftmax(dim)(x), dim=dim)
        expected = F.normalize(x.float(), p=1.0, dim=dim, eps=0.5).to(dtype)
        assert_matches(rownorm.nn.L1Norm(dim, 0.5)(x), expected, dim=dim)
        mean_abs = (x.float() / x.float().abs().mean(dim, keepdim=True)).to(dtype)
        assert_matches(rownorm.nn.L1Norm(dim, 0.0, mean=True)(x), mean_abs, dim=dim)
    for m in (rownorm.nn.Softmax(), rownorm.nn.LogSoftmax(), rownorm.nn.L1Norm()):
        assert dict(m.state_dict()) == {} and list(m.parameters()) == []


def test_public_api():
    """The functional API and modules of the op set are exported, with formula docstrings."""
    for name in ("l1_normalize", "rms_norm", "layer_norm", "softmax", "log_softmax",
                 "add_rms_norm"):  # fmt: skip
        assert name in rownorm.__all__, name
        fn = getattr(rownorm, name)
        assert callable(fn) and fn.__doc__ and "Backward" in fn.__doc__, name
        assert hasattr(torch.ops.rownorm, name) and hasattr(torch.ops.rownorm, name + "_backward")
        assert callable(getattr(rownorm.reference, name))
        assert callable(getattr(rownorm.reference, name + "_backward"))
    for cls in ("L1Norm", "RMSNorm", "LayerNorm", "Softmax", "LogSoftmax", "AddRMSNorm"):
        assert issubclass(getattr(rownorm.nn, cls), torch.nn.Module), cls
