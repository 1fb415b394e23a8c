"""The registration of every op: schemas, ``opcheck`` (schema, autograd registration, fake
tensors, AOT dispatch) and the fakes' agreement with the kernels.

Why the grid is what it is: the registration is per registered op (forward and backward),
not per dtype or layout, so one id per (op case, device) iterates a few inputs (rows, a
non-last dim, a transposed x, an empty batch), with and without requires_grad, and for one
case per op family every dtype and float32 parameters with 16-bit x. The schemas are one
snapshot of ``op._schema`` for every op the table names: a change of a signature is a change
of the op contract.
"""

from __future__ import annotations

import dataclasses

import pytest
import rownorm  # noqa: F401  (registers the fakes and autograd)
import torch
from rownorm.testing import op_names
from torch.library import opcheck
from utils import DTYPES, OPS, families, randn, raw_case

UTILS = (
    "test_schema",
    "test_autograd_registration",
    "test_faketensor",
    "test_aot_dispatch_dynamic",
)
CASES = {
    "rows": lambda dt, dev: (randn((5, 33), dt, dev), -1),
    "middle_3d": lambda dt, dev: (randn((2, 9, 4), dt, dev), 1),
    "transposed": lambda dt, dev: (randn((65, 6), dt, dev).t(), -1),
    "empty_rows": lambda dt, dev: (randn((0, 8), dt, dev), -1),
}


def _check(op, args) -> None:
    result = opcheck(op, args, test_utils=UTILS)
    assert set(result) == set(UTILS)
    assert all(v == "SUCCESS" for v in result.values()), result


def _samples(op, device):
    """(what, inputs, dim, requires_grad variants): the cases in float32 with and without
    requires_grad; for one case per op family every other dtype and float32 parameters with
    16-bit x, with requires_grad (which checks the autograd registration too)."""
    for case, build in CASES.items():
        x, dim = build(torch.float32, device)
        if op.supports(x, dim):
            yield case, op.inputs(x, dim), dim, (False, True)
    if op.id not in families():
        return
    for dtype in DTYPES[1:]:
        x, dim = CASES["rows"](dtype, device)
        yield f"rows {dtype}", op.inputs(x, dim), dim, (True,)
        if op.params and dtype in (torch.float16, torch.bfloat16):
            inp = op.inputs(x, dim, param_dtype=torch.float32)
            yield f"rows {dtype}, float32 params", inp, dim, (True,)


def _backward_args(op, inp, dim, *, requires_grad: bool):
    case = raw_case(op, inp["x"])
    outs = case.raw(inp, dim)
    dys = tuple(randn(o.shape, o.dtype, o.device) for o in outs)
    detached = tuple(o.detach() for o in outs)
    args = case.backward_args(dys, inp, dim, detached, frozenset(op.params))
    for a in args:
        if isinstance(a, torch.Tensor):
            a.requires_grad_(requires_grad)
    return case, args


@pytest.mark.parametrize("op_id", OPS)
def test_opcheck(device, op_id):
    """The forward with and without requires_grad, and the backward op, on every sample."""
    op = OPS[op_id]
    for _, inp, dim, grad_variants in _samples(op, device):
        for requires_grad in grad_variants:
            args = op.raw_args({k: v.detach().requires_grad_(requires_grad)
                                for k, v in inp.items()}, dim)  # fmt: skip
            _check(op.op, args)
        case, args = _backward_args(op, inp, dim, requires_grad=False)
        _check(case.backward_op_for(inp), args)


@pytest.mark.parametrize("op_id", [k for k, op in OPS.items() if op.name != "l2_normalize"])
def test_opcheck_backward_requires_grad(device, op_id):
    """The backward ops have no derivative (first order only): everything but differentiating
    them passes, and differentiating them raises the clear double-backward error."""
    op = OPS[op_id]
    for case_name in ("rows", "empty_rows"):
        x, dim = CASES[case_name](torch.float32, device)
        case, args = _backward_args(op, op.inputs(x, dim), dim, requires_grad=True)
        result = opcheck(case.backward_op, args, test_utils=UTILS, raise_exception=False)
        aot = result.pop("test_aot_dispatch_dynamic")
        assert all(v == "SUCCESS" for v in result.values()), result
        if aot != "SUCCESS":  # SUCCESS: no gradient reached the op (an empty batch)
            assert isinstance(aot, NotImplementedError) and "double backward" in str(aot), aot


@pytest.mark.parametrize("op_id", OPS)
def test_fake_matches_kernel_on_meta(op_id):
    """The fakes (also the Meta kernels) give the real outputs' shapes, dtypes and strides:
    new contiguous tensors for any input layout; (N,) / (0,) parameter gradients."""
    op = OPS[op_id]
    base = randn((6, 5, 4), torch.float32, "cpu")
    x, dim = (base.transpose(0, 2), -1) if op.last_dim_only else (base.transpose(0, 2), 1)
    inp = op.inputs(x, dim)
    if op.residual:
        inp["residual"] = randn((4, 5, 6), torch.float32, "cpu")

    def run(inputs, backward, want):
        if not backward:
            return op.raw(inputs, dim)
        case = raw_case(op, inputs["x"])
        outs = case.raw(inputs, dim)
        dys = tuple(torch.ones_like(o) for o in outs)
        res = case.backward_op(*case.backward_args(dys, inputs, dim, outs, want))
        return res if isinstance(res, tuple) else (res,)

    variants = [(False, frozenset()), (True, frozenset())]
    if op.params:
        variants.append((True, frozenset(op.params)))
    for backward, want in variants:
        real = run(inp, backward, want)
        fake = run({k: v.to("meta") for k, v in inp.items()}, backward, want)
        assert len(real) == len(fake)
        for r, f in zip(real, fake, strict=True):
            assert f.device.type == "meta"
            assert (f.shape, f.dtype, f.stride()) == (r.shape, r.dtype, r.stride()), (
                backward,
                want,
            )
            assert r.is_contiguous()


# THE OP CONTRACT: every registered schema. Changing one is changing the API.
SCHEMAS = {
    "l2_normalize": "l2_normalize(Tensor x, int dim=-1, float eps=1e-12) -> Tensor",
    "l2_normalize_backward":
        "l2_normalize_backward(Tensor grad, Tensor x, int dim=-1, float eps=1e-12) -> Tensor",
    "l1_normalize":
        "l1_normalize(Tensor x, int dim=-1, float eps=1e-12, bool mean=False) -> Tensor",
    "l1_normalize_backward": "l1_normalize_backward(Tensor grad, Tensor x, int dim=-1, "
                             "float eps=1e-12, bool mean=False) -> Tensor",
    "rms_norm": "rms_norm(Tensor x, Tensor? weight=None, int dim=-1, float? eps=None, "
                "float weight_offset=0., str casting_mode=\"once\") -> Tensor",
    "rms_norm_backward": "rms_norm_backward(Tensor grad, Tensor x, Tensor? weight, int dim, "
                         "float eps, bool weight_grad, float weight_offset=0.) "
                         "-> (Tensor, Tensor)",
    "layer_norm": "layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, int dim=-1, "
                  "float eps=1e-05) -> Tensor",
    "layer_norm_backward": "layer_norm_backward(Tensor grad, Tensor x, Tensor stats, "
                           "Tensor? weight, int dim, bool weight_grad, bool bias_grad) "
                           "-> (Tensor, Tensor, Tensor)",
    "softmax": "softmax(Tensor x, int dim=-1) -> Tensor",
    "softmax_backward": "softmax_backward(Tensor grad, Tensor y, int dim=-1) -> Tensor",
    "log_softmax": "log_softmax(Tensor x, int dim=-1) -> Tensor",
    "log_softmax_backward": "log_softmax_backward(Tensor grad, Tensor y, int dim=-1) -> Tensor",
    "add_rms_norm": "add_rms_norm(Tensor x, Tensor residual, Tensor? weight=None, "
                    "float? eps=None, float weight_offset=0., str casting_mode=\"once\") "
                    "-> (Tensor, Tensor)",
    "add_rms_norm_backward": "add_rms_norm_backward(Tensor grad, Tensor? grad_residual, "
                             "Tensor r, Tensor? weight, float eps, bool weight_grad, "
                             "float weight_offset=0.) -> (Tensor, Tensor)",
}  # fmt: skip

# The forwards that also return what their backward reads (what autograd runs for the op of
# the name without the suffix).
WITH_STATS_SCHEMAS = {
    "layer_norm_with_stats": "layer_norm_with_stats(Tensor x, Tensor? weight=None, "
                             "Tensor? bias=None, int dim=-1, float eps=1e-05) "
                             "-> (Tensor y, Tensor stats)",
}  # fmt: skip

# Backward ops besides each op's <op>_backward: the float32 residual stream's, which autograd
# runs for add_rms_norm there (the table's add_rms_norm_fp32_residual case runs it).
MORE_BACKWARD_SCHEMAS = {
    "add_rms_norm_stream_backward": "add_rms_norm_stream_backward(Tensor grad, "
                                    "Tensor? grad_residual, Tensor r, Tensor? weight, float eps, "
                                    "bool weight_grad, float weight_offset=0.) "
                                    "-> (Tensor, Tensor, Tensor)",
}  # fmt: skip

# The diagnostics (rownorm.explain): text about the plan of a call, not row ops of the table.
DIAGNOSTIC_SCHEMAS = {
    "plan_info": "plan_info(Tensor x, str op, int dim=-1, bool backward=False, "
                 "bool param_grads=False) -> str",
    "plan_row_tier": "plan_row_tier(int n, int elem_size, bool clusters=True, bool wide=True, "
                     "int cluster_packs=8, int wide_cluster_packs=0) -> str",
}  # fmt: skip


def test_schemas():
    """The registered ops are exactly the table's ops and their backward ops plus the
    saving forwards, the residual stream's backward and the diagnostics, with these schemas
    (a snapshot of ``op._schema``, compared parsed); none mutates its inputs."""
    names = [n for op in op_names() for n in (op, op + "_backward")]
    assert sorted(names) == sorted(SCHEMAS), "the op table and the schema snapshot differ"
    registered = sorted(n for n in dir(torch.ops.rownorm) if isinstance(
        getattr(torch.ops.rownorm, n, None), torch._ops.OpOverloadPacket))  # fmt: skip
    everything = SCHEMAS | WITH_STATS_SCHEMAS | MORE_BACKWARD_SCHEMAS | DIAGNOSTIC_SCHEMAS
    assert registered == sorted(everything), f"registered ops: {registered}"
    for name, text in everything.items():
        schema = getattr(torch.ops.rownorm, name).default._schema
        assert schema == torch._C.parse_schema("rownorm::" + text), str(schema)
        assert not schema.is_mutable, name


def test_op_table_covers_every_registered_op():
    """Every op of the table runs on its first sample (a new op is in the table, so it is in
    every test above): the table's calls match the registered signatures."""
    for op in OPS.values():
        desc, inp, dim = next(op.sample_inputs("cpu", torch.float32))
        assert len(op.raw(inp, dim)) == op.n_outputs == len(op.call(inp, dim)), op
        assert dataclasses.is_dataclass(op)
