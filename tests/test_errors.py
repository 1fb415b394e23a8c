"""Every user mistake gives a clear error naming the argument and what was expected.

The same message comes from the C++ checks (eager CPU/CUDA), from the fakes (meta tensors,
torch.compile tracing) and, for the layout check, from the Python wrapper.
"""

from __future__ import annotations

import re

import pytest
import rownorm
import torch
from utils import HAS_CUDA, cuda_only, randn

FWD = "l2_normalize: "
BWD = "l2_normalize_backward: "


def _x(shape=(3, 4), dtype=torch.float32, device="cpu") -> torch.Tensor:
    if dtype.is_floating_point:
        return randn(shape, dtype, device)
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, device=device)
    return torch.randint(0, 5, shape, device=device).to(dtype)


# (x builder(device), dim, eps, message): mistakes in x, dim and eps, valid in every layout.
FORWARD_CASES = {
    "int64": (lambda d: _x(dtype=torch.int64, device=d), -1, 1e-12,
              "x must be float32, float16, bfloat16 or float64, got int64"),
    "int32": (lambda d: _x(dtype=torch.int32, device=d), -1, 1e-12,
              "x must be float32, float16, bfloat16 or float64, got int32"),
    "uint8": (lambda d: _x(dtype=torch.uint8, device=d), -1, 1e-12,
              "x must be float32, float16, bfloat16 or float64, got uint8"),
    "bool": (lambda d: _x(dtype=torch.bool, device=d), -1, 1e-12,
             "x must be float32, float16, bfloat16 or float64, got bool"),
    "complex64": (lambda d: _x(dtype=torch.complex64, device=d), -1, 1e-12,
                  "x must be float32, float16, bfloat16 or float64, got complex64"),
    "complex128": (lambda d: _x(dtype=torch.complex128, device=d), -1, 1e-12,
                   "x must be float32, float16, bfloat16 or float64, got complex128"),
    "dim_too_large": (lambda d: _x(device=d), 2, 1e-12,
                      "dim must be in [-2, 1] for a 2-d x, got 2"),
    "dim_too_negative": (lambda d: _x(device=d), -3, 1e-12,
                         "dim must be in [-2, 1] for a 2-d x, got -3"),
    "dim_1d": (lambda d: _x((5,), device=d), 1, 1e-12,
               "dim must be in [-1, 0] for a 1-d x, got 1"),
    "dim_4d": (lambda d: _x((2, 1, 3, 4), device=d), -5, 1e-12,
               "dim must be in [-4, 3] for a 4-d x, got -5"),
    "eps_negative": (lambda d: _x(device=d), -1, -1e-6, "eps must be >= 0, got -1e-06"),
    "eps_nan": (lambda d: _x(device=d), -1, float("nan"), "eps must be >= 0, got nan"),
    "zero_dim": (lambda d: torch.tensor(1.5, device=d), 0, 1e-12,
                 "x must have at least one dimension, got a 0-d tensor"),
}  # fmt: skip


def _pattern(prefix: str, message: str) -> str:
    return re.escape(prefix + message)


@pytest.mark.parametrize("case", FORWARD_CASES)
def test_forward_bad_input_op(device, case):
    build, dim, eps, message = FORWARD_CASES[case]
    x = build(device)
    with pytest.raises(RuntimeError, match=_pattern(FWD, message)):
        torch.ops.rownorm.l2_normalize(x, dim, eps)
    with pytest.raises(RuntimeError, match=_pattern(FWD, message)):
        rownorm.l2_normalize(x, dim, eps)


@pytest.mark.parametrize("case", FORWARD_CASES)
def test_forward_bad_input_fake(case):
    """The fake (run for meta tensors and by torch.compile) raises the eager message."""
    build, dim, eps, message = FORWARD_CASES[case]
    x = build("cpu").to("meta")
    with pytest.raises(RuntimeError, match=_pattern(FWD, message)):
        torch.ops.rownorm.l2_normalize(x, dim, eps)


@pytest.mark.parametrize("case", ["int64", "complex64", "dim_too_large", "eps_negative"])
def test_forward_bad_input_compiled(device, case):
    build, dim, eps, message = FORWARD_CASES[case]
    x = build(device)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: rownorm.l2_normalize(t, dim, eps), fullgraph=True)
    with pytest.raises(RuntimeError, match=_pattern(FWD, message)) as info:
        compiled(x)
    # Raised while tracing (by the fake), not by an eager fallback.
    assert isinstance(info.value, torch._dynamo.exc.TorchRuntimeError)
    torch._dynamo.reset()


def test_zero_dim_compiled(device):
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: rownorm.l2_normalize(t * 2), fullgraph=True)
    with pytest.raises(RuntimeError, match=re.escape(FWD + "x must have at least one dim")):
        compiled(torch.tensor(3.0, device=device))
    torch._dynamo.reset()


@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_sparse_via_python_api(device, fmt):
    x = _x((3, 4), device=device)
    x = x.to_sparse() if fmt == "coo" else x.to_sparse_csr()
    with pytest.raises(ValueError, match=re.escape(FWD + "x must be a dense (strided) tensor")):
        rownorm.l2_normalize(x)
    with pytest.raises(ValueError, match=re.escape(FWD + "x must be a dense (strided) tensor")):
        rownorm.nn.L2Norm()(x)


def test_sparse_via_op(device):
    x = _x((3, 4), device=device).to_sparse()
    with pytest.raises(RuntimeError, match=re.escape(FWD + "x must be a dense (strided) tensor")):
        torch.ops.rownorm.l2_normalize(x, -1, 1e-12)
    g = _x((3, 4), device=device)
    pattern = re.escape(BWD + "x and grad must be dense (strided) tensors")
    with pytest.raises(RuntimeError, match=pattern):
        torch.ops.rownorm.l2_normalize_backward(g.to_sparse(), g, -1, 1e-12)
    with pytest.raises(RuntimeError, match=pattern):
        torch.ops.rownorm.l2_normalize_backward(g, g.to_sparse(), -1, 1e-12)


def test_sparse_csr_via_op(device):
    """Sparse layouts other than COO are rejected with the same message as COO."""
    x = _x((3, 4), device=device).to_sparse_csr()
    with pytest.raises(RuntimeError, match=re.escape(FWD + "x must be a dense (strided) tensor")):
        torch.ops.rownorm.l2_normalize(x, -1, 1e-12)


def test_module_negative_eps():
    with pytest.raises(ValueError, match=re.escape("L2Norm: eps must be >= 0, got -0.5")):
        rownorm.nn.L2Norm(dim=1, eps=-0.5)


# ---------------------------------------------------------------------------------------------
# The backward op: x, dim and eps as in the forward; grad must match x in shape, dtype, device.

# (grad builder(x), x builder(device), dim, eps, message)
BACKWARD_CASES = {
    "grad_shape": (lambda x: _x((3, 5), device=x.device), lambda d: _x(device=d), -1, 1e-12,
                   "grad must have x's shape (3, 4), got (3, 5)"),
    "grad_rank": (lambda x: _x((12,), device=x.device), lambda d: _x(device=d), -1, 1e-12,
                  "grad must have x's shape (3, 4), got (12,)"),
    "grad_dtype": (lambda x: _x(dtype=torch.float64, device=x.device), lambda d: _x(device=d),
                   -1, 1e-12, "grad must have x's dtype float32, got float64"),
    "grad_int": (lambda x: _x(dtype=torch.int64, device=x.device), lambda d: _x(device=d), -1,
                 1e-12, "grad must have x's dtype float32, got int64"),
    "x_dtype": (lambda x: _x(dtype=torch.int64, device=x.device),
                lambda d: _x(dtype=torch.int64, device=d), -1, 1e-12,
                "x must be float32, float16, bfloat16 or float64, got int64"),
    "dim": (lambda x: torch.ones_like(x), lambda d: _x(device=d), 2, 1e-12,
            "dim must be in [-2, 1] for a 2-d x, got 2"),
    "dim_negative": (lambda x: torch.ones_like(x), lambda d: _x(device=d), -3, 1e-12,
                     "dim must be in [-2, 1] for a 2-d x, got -3"),
    "eps": (lambda x: torch.ones_like(x), lambda d: _x(device=d), 0, -2.0,
            "eps must be >= 0, got -2"),
    "zero_dim": (lambda x: torch.ones_like(x), lambda d: torch.tensor(2.0, device=d), 0, 1e-12,
                 "x must have at least one dimension, got a 0-d tensor"),
}  # fmt: skip


@pytest.mark.parametrize("case", BACKWARD_CASES)
def test_backward_bad_input_op(device, case):
    build_grad, build_x, dim, eps, message = BACKWARD_CASES[case]
    x = build_x(device)
    grad = build_grad(x)
    with pytest.raises(RuntimeError, match=_pattern(BWD, message)):
        torch.ops.rownorm.l2_normalize_backward(grad, x, dim, eps)


@pytest.mark.parametrize("case", BACKWARD_CASES)
def test_backward_bad_input_fake(case):
    build_grad, build_x, dim, eps, message = BACKWARD_CASES[case]
    x = build_x("cpu")
    grad = build_grad(x)
    with pytest.raises(RuntimeError, match=_pattern(BWD, message)):
        torch.ops.rownorm.l2_normalize_backward(grad.to("meta"), x.to("meta"), dim, eps)


@cuda_only
def test_backward_device_mismatch():
    x = _x(device="cuda")
    with pytest.raises(RuntimeError, match=re.escape(BWD + "grad must be on x's device (cuda:0)")):
        torch.ops.rownorm.l2_normalize_backward(x.cpu(), x, -1, 1e-12)
    with pytest.raises(RuntimeError, match=re.escape(BWD + "grad must be on x's device (cpu)")):
        torch.ops.rownorm.l2_normalize_backward(x, x.cpu(), -1, 1e-12)


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.cuda
def test_backward_other_gpu():
    x = _x(device="cuda:1")
    with pytest.raises(RuntimeError, match=re.escape(BWD + "grad must be on x's device (cuda:1)")):
        torch.ops.rownorm.l2_normalize_backward(x.to("cuda:0"), x, -1, 1e-12)
