"""torch.library.opcheck of every rownorm op: schema, autograd registration, fake, AOT dispatch.

Each op is checked with inputs that do and do not require grad, on the CPU and CUDA, for a
few layouts (contiguous, non-contiguous, reduction over a non-last dim, empty) and dtypes.
The backward ops of the op table are first order only: with inputs that require grad, the
AOT test (which differentiates them) must meet the double-backward error.
The fakes must give the real kernels' output shapes, dtypes and strides (a new contiguous
tensor); opcheck's fake-tensor test compares them.
"""

from __future__ import annotations

import dataclasses

import pytest
import rownorm  # noqa: F401  (registers the fakes and autograd)
import torch
from op_table import OP_FAMILIES, OPS, PARAM_OPS
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


# ---------------------------------------------------------------------------------------------
# The op set of the op table (l1 / mean-abs normalize, rms_norm, layer_norm, softmax,
# log_softmax, add_rms_norm): every forward op and every backward op, with and without
# requires_grad, on rows, a non-last dim, a transposed input and an empty batch.

OP_CASES = {
    "rows": lambda dt, dev: (randn((5, 33), dt, dev), -1),
    "middle_3d": lambda dt, dev: (randn((2, 9, 4), dt, dev), 1),
    "transposed": lambda dt, dev: (randn((65, 6), dt, dev).t(), -1),
    "empty_rows": lambda dt, dev: (randn((0, 8), dt, dev), -1),
}


def _op_params(op_ids=tuple(OPS)):
    params = []
    for op_id in op_ids:
        for case, build in OP_CASES.items():
            x, dim = build(torch.float32, "cpu")
            if OPS[op_id].supports(x, dim):
                params.append(pytest.param(op_id, case, id=f"{op_id}-{case}"))
    return params


def _inputs(op_id: str, case: str, dtype, device, *, param_dtype=None):
    op = OPS[op_id]
    x, dim = OP_CASES[case](dtype, device)
    return op, op.inputs(x, dim, param_dtype=param_dtype), dim


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "requires_grad"])
@pytest.mark.parametrize(("op_id", "case"), _op_params())
def test_opcheck_op_forward(device, op_id, case, requires_grad):
    op, inp, dim = _inputs(op_id, case, torch.float32, device)
    for t in inp.values():
        t.requires_grad_(requires_grad)
    _check(op.op, op.raw_args(inp, dim))


def _backward_args(op, inp, dim, *, requires_grad: bool):
    outs = op.raw(inp, dim)
    dys = tuple(randn(o.shape, o.dtype, o.device) for o in outs)
    op = dataclasses.replace(op, eps=op.resolved_eps(inp["x"]))
    args = op.backward_args(dys, inp, dim, tuple(o.detach() for o in outs), frozenset(op.params))
    for a in args:
        if isinstance(a, torch.Tensor):
            a.requires_grad_(requires_grad)
    return op, args


@pytest.mark.parametrize(("op_id", "case"), _op_params())
def test_opcheck_op_backward(device, op_id, case):
    op, inp, dim = _inputs(op_id, case, torch.float32, device)
    op, args = _backward_args(op, inp, dim, requires_grad=False)
    _check(op.backward_op, args)


@pytest.mark.parametrize(("op_id", "case"), _op_params(OP_FAMILIES))
def test_opcheck_op_backward_requires_grad(device, op_id, case):
    """The backward ops have no derivative (first order only): everything but differentiating
    them passes, and differentiating them raises the clear double-backward error."""
    op, inp, dim = _inputs(op_id, case, torch.float32, device)
    op, args = _backward_args(op, inp, dim, requires_grad=True)
    result = opcheck(op.backward_op, args, test_utils=UTILS, raise_exception=False)
    aot = result.pop("test_aot_dispatch_dynamic")
    assert all(v == "SUCCESS" for v in result.values()), result
    if aot != "SUCCESS":  # SUCCESS: no gradient reached the op (e.g. an empty batch)
        assert isinstance(aot, NotImplementedError) and "double backward" in str(aot), aot


@pytest.mark.parametrize("op_id", OP_FAMILIES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_opcheck_op_dtypes(device, op_id, dtype):
    op, inp, dim = _inputs(op_id, "rows", dtype, device)
    for t in inp.values():
        t.requires_grad_(True)
    _check(op.op, op.raw_args(inp, dim))
    op, args = _backward_args(op, inp, dim, requires_grad=False)
    _check(op.backward_op, args)


@pytest.mark.parametrize("op_id", PARAM_OPS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_opcheck_op_mixed_param_dtype(device, op_id, dtype):
    """float32 parameters with 16-bit x: the fakes give the kernels' dtypes (x's for the
    outputs and dx, float32 for the parameter gradients)."""
    op, inp, dim = _inputs(op_id, "rows", dtype, device, param_dtype=torch.float32)
    for t in inp.values():
        t.requires_grad_(True)
    _check(op.op, op.raw_args(inp, dim))
    op, args = _backward_args(op, inp, dim, requires_grad=False)
    _check(op.backward_op, args)


@pytest.mark.parametrize(
    ("op_id", "backward", "want"),
    [(op_id, False, False) for op_id in OPS]
    + [
        (op_id, True, want)
        for op_id in OPS
        for want in (False, True)[: 1 + bool(OPS[op_id].params)]
    ],
    ids=str,
)
def test_op_fake_matches_kernel_on_meta(op_id, backward, want):
    """The fakes (also the Meta kernels) give the real outputs' shapes, dtypes and strides:
    new contiguous tensors for any input layout; (N,) / (0,) parameter gradients."""
    op = OPS[op_id]
    base = randn((6, 5, 4), torch.float32, "cpu")
    x, dim = (base.transpose(0, 2), -1) if op.last_dim_only else (base.transpose(0, 2), 1)
    inp = op.inputs(x, dim)
    inp = {k: v.t().contiguous().t() if v.dim() == 2 else v for k, v in inp.items()}
    if op.residual:
        inp["residual"] = randn((4, 5, 6), torch.float32, "cpu")

    def run(inputs):
        if not backward:
            return op.raw(inputs, dim)
        case = dataclasses.replace(op, eps=op.resolved_eps(inputs["x"]))
        outs = case.raw(inputs, dim)
        dys = tuple(torch.ones_like(o) for o in outs)
        wanted = frozenset(op.params) if want else frozenset()
        res = case.backward_op(*case.backward_args(dys, inputs, dim, outs, wanted))
        return res if isinstance(res, tuple) else (res,)

    real = run(inp)
    fake = run({k: v.to("meta") for k, v in inp.items()})
    assert len(real) == len(fake)
    for r, f in zip(real, fake, strict=True):
        assert f.device.type == "meta"
        assert (f.shape, f.dtype, f.stride()) == (r.shape, r.dtype, r.stride())
        assert r.is_contiguous()


# The op contract's schemas (SPEC: argument names, types and defaults; returns).
SCHEMAS = {
    "l1_normalize": ([("x", "Tensor", None), ("dim", "int", -1), ("eps", "float", 1e-12),
                      ("mean", "bool", False)], 1),
    "l1_normalize_backward": ([("grad", "Tensor", None), ("x", "Tensor", None),
                               ("dim", "int", -1), ("eps", "float", 1e-12),
                               ("mean", "bool", False)], 1),
    "rms_norm": ([("x", "Tensor", None), ("weight", "Optional[Tensor]", None),
                  ("dim", "int", -1), ("eps", "Optional[float]", None)], 1),
    "rms_norm_backward": ([("grad", "Tensor", None), ("x", "Tensor", None),
                           ("weight", "Optional[Tensor]", None), ("dim", "int", None),
                           ("eps", "float", None), ("weight_grad", "bool", None)], 2),
    "layer_norm": ([("x", "Tensor", None), ("weight", "Optional[Tensor]", None),
                    ("bias", "Optional[Tensor]", None), ("dim", "int", -1),
                    ("eps", "float", 1e-5)], 1),
    "layer_norm_backward": ([("grad", "Tensor", None), ("x", "Tensor", None),
                             ("weight", "Optional[Tensor]", None), ("dim", "int", None),
                             ("eps", "float", None), ("weight_grad", "bool", None),
                             ("bias_grad", "bool", None)], 3),
    "softmax": ([("x", "Tensor", None), ("dim", "int", -1)], 1),
    "softmax_backward": ([("grad", "Tensor", None), ("y", "Tensor", None), ("dim", "int", -1)], 1),
    "log_softmax": ([("x", "Tensor", None), ("dim", "int", -1)], 1),
    "log_softmax_backward": ([("grad", "Tensor", None), ("y", "Tensor", None),
                              ("dim", "int", -1)], 1),
    "add_rms_norm": ([("x", "Tensor", None), ("residual", "Tensor", None),
                      ("weight", "Optional[Tensor]", None), ("eps", "Optional[float]", None)], 2),
    "add_rms_norm_backward": ([("grad", "Tensor", None),
                               ("grad_residual", "Optional[Tensor]", None),
                               ("r", "Tensor", None), ("weight", "Optional[Tensor]", None),
                               ("eps", "float", None), ("weight_grad", "bool", None)], 2),
}  # fmt: skip


@pytest.mark.parametrize("name", SCHEMAS)
def test_op_schemas(name):
    op = getattr(torch.ops.rownorm, name)
    args, n_returns = SCHEMAS[name]
    assert _signature(op) == args
    schema = op.default._schema
    assert [str(r.type) for r in schema.returns] == ["Tensor"] * n_returns
    assert not schema.is_mutable
