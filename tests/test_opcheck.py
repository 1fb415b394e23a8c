"""torch.library.opcheck of every rownorm op: schema, autograd registration, fake, AOT dispatch.

Each op is checked with inputs that do and do not require grad, on the CPU and CUDA, for a
few layouts (contiguous, non-contiguous, reduction over a non-last dim, empty) and dtypes.
The fakes must give the real kernels' output shapes, dtypes and strides (a new contiguous
tensor); opcheck's fake-tensor test compares them.
"""

from __future__ import annotations

import pytest
import rownorm  # noqa: F401  (registers the fakes and autograd)
import torch
from torch.library import opcheck
from utils import DTYPES, dtype_id, randn

UTILS = (
    "test_schema",
    "test_autograd_registration",
    "test_faketensor",
    "test_aot_dispatch_dynamic",
)

# (name, builder(dtype, device) -> (x, dim))
CASES = {
    "rows": lambda dt, dev: (randn((5, 33), dt, dev), -1),
    "dim0": lambda dt, dev: (randn((17, 3), dt, dev), 0),
    "middle_3d": lambda dt, dev: (randn((2, 9, 4), dt, dev), 1),
    "transposed": lambda dt, dev: (randn((65, 6), dt, dev).t(), -1),
    "sliced": lambda dt, dev: (randn((4, 40), dt, dev)[:, 3:36], 1),
    "empty_rows": lambda dt, dev: (randn((0, 8), dt, dev), -1),
}


def _check(op, args) -> None:
    result = opcheck(op, args, test_utils=UTILS)
    assert set(result) == set(UTILS)
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "requires_grad"])
@pytest.mark.parametrize("case", CASES)
def test_opcheck_forward(device, case, requires_grad):
    x, dim = CASES[case](torch.float32, device)
    x.requires_grad_(requires_grad)
    _check(torch.ops.rownorm.l2_normalize.default, (x, dim, 1e-12))


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "requires_grad"])
@pytest.mark.parametrize("case", CASES)
def test_opcheck_backward(device, case, requires_grad):
    x, dim = CASES[case](torch.float32, device)
    grad = randn(x.shape, torch.float32, device)
    x.requires_grad_(requires_grad)
    grad.requires_grad_(requires_grad)
    _check(torch.ops.rownorm.l2_normalize_backward.default, (grad, x, dim, 1e-12))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_opcheck_dtypes(device, dtype):
    x = randn((3, 7), dtype, device).requires_grad_(True)
    _check(torch.ops.rownorm.l2_normalize.default, (x, -1, 0.5))
    grad = randn((3, 7), dtype, device)
    _check(torch.ops.rownorm.l2_normalize_backward.default, (grad, x.detach(), 0, 0.5))


@pytest.mark.parametrize("op_name", ["l2_normalize", "l2_normalize_backward"])
def test_fake_matches_kernel_on_meta(op_name):
    """The fake (also the Meta kernel) promises a new contiguous tensor for any input layout."""
    x = torch.empty((6, 5, 4), device="meta").transpose(0, 2)
    args = (x, 1, 1e-12) if op_name == "l2_normalize" else (torch.empty_like(x), x, 1, 1e-12)
    out = getattr(torch.ops.rownorm, op_name)(*args)
    assert out.device.type == "meta"
    assert out.shape == x.shape and out.dtype == x.dtype
    assert out.is_contiguous()
    real = getattr(torch.ops.rownorm, op_name)(
        *[torch.ones_like(a, device="cpu") if isinstance(a, torch.Tensor) else a for a in args]
    )
    assert real.stride() == out.stride()


def _signature(op) -> list[tuple[str, str, object]]:
    schema = op.default._schema
    return [(a.name, str(a.type), a.default_value) for a in schema.arguments]


def test_schemas():
    fwd = torch.ops.rownorm.l2_normalize
    bwd = torch.ops.rownorm.l2_normalize_backward
    assert _signature(fwd) == [("x", "Tensor", None), ("dim", "int", -1), ("eps", "float", 1e-12)]
    assert _signature(bwd) == [
        ("grad", "Tensor", None),
        ("x", "Tensor", None),
        ("dim", "int", -1),
        ("eps", "float", 1e-12),
    ]
    for op in (fwd, bwd):
        returns = op.default._schema.returns
        assert [str(r.type) for r in returns] == ["Tensor"]
        assert not op.default._schema.is_mutable
