"""Backward of every op of the op table: autograd (x, residual, weight and bias gradients) and
the raw ``*_backward`` ops, against the float64 reference backward of :mod:`rownorm.reference`.

Specification (DESIGN §2, the op contract):

* rms_norm: ``dx = r·(g − ŷ·mean(ŷ⊙g))``, g = w⊙dy; ``dw = Σ_rows dy⊙ŷ``. layer_norm: ``dx =
  r·(g − mean(g) − ŷ·mean(ŷ⊙g))``, ``dw = Σ dy⊙ŷ``, ``db = Σ dy``. l1 / mean-abs: ``dx = dy/s −
  sign(x)·Σ(dy⊙x)/(s²·D')``, ``dy/eps`` where clamped. softmax ``dx = y⊙(dy − Σ dy⊙y)`` and
  log_softmax ``dx = dy − exp(y)·Σ dy`` from the forward's OUTPUT y. add_rms_norm: ``dx =
  dresidual = d r_out + rms_norm's dx`` at r = x + residual.
* The backward ops return dx (a new contiguous tensor of x's dtype) and the parameter
  gradients in float32 (float64 for float64 x) of shape (N,), or of shape (0,) when not
  requested; autograd casts them to the parameter's dtype and respects
  ``ctx.needs_input_grad``. Parameter gradients are deterministic (no float atomics):
  bit-identical run to run; per-row results do not depend on the batch.
* First-order only: a double backward raises (only l2_normalize has one).

The grid follows test_ops_forward.py (every case × dtype × N; layouts, dims and gradient
layouts on one case per family and a few N); gradcheck runs in float64 on small shapes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from op_table import (
    OP_FAMILIES,
    OPS,
    PARAM_OPS,
    ROW_INPUTS,
    OpCase,
    check_grads,
    dim_cases,
    empty_cases,
    inputs_for,
    layout_cases,
)
from torch.utils._python_dispatch import TorchDispatchMode
from utils import (
    DIM_CASES,
    DTYPES,
    GPU_TIER_LENGTHS,
    GRAD_LAYOUTS,
    LAYOUTS,
    assert_matches,
    assert_new_contiguous,
    cuda_only,
    dtype_id,
    gpu_rows,
    poison_blocks,
    randn,
    row_count,
    scaled_rows,
    with_zero_rows,
)

BACKWARD_LENGTHS = (1, 7, 32, 33, 255, 1025, 4097, 65537)

dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
all_ops = pytest.mark.parametrize("op_id", OPS)
op_families = pytest.mark.parametrize("op_id", OP_FAMILIES)
param_ops = pytest.mark.parametrize("op_id", PARAM_OPS)

pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")


def param_grad_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of the backward ops' parameter gradients: the kernels' accumulator."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def random_grads(op: OpCase, outs) -> tuple[torch.Tensor, ...]:
    return tuple(randn(o.shape, o.dtype, o.device) for o in outs)


def autograd_grads(op: OpCase, inp, dim: int, dys=None, *, frozen=()):
    """Forward + backward through autograd; returns (outputs, dys, {name: grad or None})."""
    leaves = {k: v.detach().requires_grad_(k not in frozen) for k, v in inp.items()}
    outs = op.call(leaves, dim)
    dys = random_grads(op, outs) if dys is None else dys
    wrt = [k for k in leaves if k not in frozen]
    used = [(o, g) for o, g in zip(outs, dys, strict=True) if g is not None]
    grads = torch.autograd.grad(
        [o for o, _ in used], [leaves[k] for k in wrt], [g for _, g in used], allow_unused=True
    )
    return outs, dys, dict(zip(wrt, grads, strict=True))


def check_backward_autograd(op: OpCase, inp, dim: int, *, what: str = ""):
    outs, dys, got = autograd_grads(op, inp, dim)
    for name, g in got.items():
        assert g is not None, f"{op}: no gradient for {name}"
        assert g.dtype == inp[name].dtype and g.shape == inp[name].shape
    check_grads(op, inp, dim, dys, got, what=what)
    return outs, dys, got


# ---------------------------------------------------------------------------------------------
# Through autograd: row lengths, layouts, dims


@all_ops
@dtypes
@pytest.mark.parametrize("n", BACKWARD_LENGTHS)
def test_backward_row_lengths(device, op_id, dtype, n):
    op = OPS[op_id]
    x = scaled_rows(row_count(n), n, dtype, device)
    check_backward_autograd(op, op.inputs(x, -1), -1, what=f"N={n}")


@cuda_only
@all_ops
@dtypes
@pytest.mark.parametrize("n", GPU_TIER_LENGTHS)
def test_backward_gpu_tiers(op_id, dtype, n):
    op = OPS[op_id]
    x = scaled_rows(gpu_rows(n), n, dtype, "cuda")
    check_backward_autograd(op, op.inputs(x, -1), -1, what=f"N={n}")


@pytest.mark.parametrize(("op_id", "layout"), layout_cases(OP_FAMILIES))
@dtypes
@pytest.mark.parametrize("n", (33, 1025))
def test_backward_layouts(device, op_id, layout, dtype, n):
    op = OPS[op_id]
    if op.name == "layer_norm" and layout == "expanded_along_dim" and "weight" in op.params:
        # Constant rows: var = 0, so ŷ = (x − μ)·rsqrt(eps) is μ's float32 rounding error
        # times 316 and dweight = Σ dy⊙ŷ is that noise (torch's float32 kernels alike); the
        # float64 reference has none. dx and the forward on this layout are checked elsewhere.
        pytest.skip("dweight of constant rows is float32 rounding noise")
    inp, dim = inputs_for(op, LAYOUTS[layout], row_count(n), n, dtype, device)
    check_backward_autograd(op, inp, dim, what=f"{layout} N={n}")


@pytest.mark.parametrize(("op_id", "case"), dim_cases(OP_FAMILIES))
@dtypes
@pytest.mark.parametrize("n", (1, 33, 65))
def test_backward_dims(device, op_id, case, dtype, n):
    op = OPS[op_id]
    inp, dim = inputs_for(op, DIM_CASES[case], n, dtype, device)
    check_backward_autograd(op, inp, dim, what=f"{case} N={n}")


@cuda_only
@pytest.mark.parametrize(("op_id", "case"), dim_cases(OP_FAMILIES))
@dtypes
@pytest.mark.parametrize("n", (7, 64, 255, 1025, 4097))
def test_backward_dims_gpu(op_id, case, dtype, n):
    op = OPS[op_id]
    inp, dim = inputs_for(op, DIM_CASES[case], n, dtype, "cuda")
    check_backward_autograd(op, inp, dim, what=f"{case} N={n}")


@param_ops
@pytest.mark.parametrize(
    ("x_dtype", "p_dtype"),
    [
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
        (torch.float64, torch.float32),
    ],
    ids=["bf16-fp32", "fp16-fp32", "fp64-fp32"],
)
@pytest.mark.parametrize("n", (7, 1025))
def test_backward_param_dtypes(device, op_id, x_dtype, p_dtype, n):
    """Parameter gradients come back in the parameter's dtype (float32 with 16-bit x)."""
    op = OPS[op_id]
    x = scaled_rows(row_count(n), n, x_dtype, device)
    _, _, got = check_backward_autograd(op, op.inputs(x, -1, param_dtype=p_dtype), -1)
    assert got["weight"].dtype == p_dtype


@dtypes
@pytest.mark.parametrize("params", [("weight",), ("bias",)], ids=["weight_only", "bias_only"])
def test_backward_layer_norm_one_param(device, dtype, params):
    op = dataclasses.replace(OPS["layer_norm_affine"], params=params)
    for x, dim in (randn((19, 257), dtype, device), -1), DIM_CASES["middle"](33, dtype, device):
        check_backward_autograd(op, op.inputs(x, dim), dim, what=str(params))


@op_families
@dtypes
@pytest.mark.parametrize("grad_layout", ["expanded_rows", "transposed"])
def test_backward_autograd_non_contiguous_grad(device, op_id, dtype, grad_layout):
    """Non-contiguous gradients reach the backward op through autograd."""
    op = OPS[op_id]
    rows, n = 9, 257
    inp = op.inputs(randn((rows, n), dtype, device), -1)
    dys = tuple(GRAD_LAYOUTS[grad_layout](rows, n, dtype, device) for _ in range(op.n_outputs))
    _, _, got = autograd_grads(op, inp, -1, dys)
    check_grads(op, inp, -1, dys, got, what=grad_layout)
    # out.sum(0) hands the backward its gradient expanded over the rows (row stride 0).
    leaf = inp["x"].detach().requires_grad_(True)
    out = op.call({**inp, "x": leaf}, -1)[0]
    dy0 = randn((n,), dtype, device)
    (dx,) = torch.autograd.grad(out.sum(0), leaf, dy0)
    dys = (dy0.expand(rows, n),) + tuple(
        torch.zeros_like(inp["x"]) for _ in range(op.n_outputs - 1)
    )
    check_grads(op, inp, -1, dys, {"x": dx}, what="sum(0)")


# ---------------------------------------------------------------------------------------------
# The raw backward ops


def raw_case(op: OpCase, x: torch.Tensor) -> OpCase:
    """The op with eps resolved (the backward ops take a plain float), so that the raw backward
    and its reference use the same eps."""
    return dataclasses.replace(op, eps=op.resolved_eps(x))


@op_families
@dtypes
@pytest.mark.parametrize("grad_layout", GRAD_LAYOUTS)
@pytest.mark.parametrize("x_layout", ["contiguous", "transposed", "odd_offset"])
@pytest.mark.parametrize("n", (7, 1025))
def test_backward_op_layouts(device, op_id, dtype, grad_layout, x_layout, n):
    op = OPS[op_id]
    rows = row_count(n)
    inp, dim = inputs_for(op, LAYOUTS[x_layout], rows, n, dtype, device)
    op = raw_case(op, inp["x"])
    outs = op.raw(inp, dim)
    dys = tuple(GRAD_LAYOUTS[grad_layout](rows, n, dtype, device) for _ in outs)
    want = frozenset(op.params)
    got = op.raw_backward(dys, inp, dim, outs, want)
    assert_new_contiguous(got["x"], inp["x"])
    for name in op.params:
        assert got[name].dtype == param_grad_dtype(inp["x"])
    check_grads(op, inp, dim, dys, got, what=f"{x_layout}/{grad_layout}")


@pytest.mark.parametrize(("op_id", "case"), dim_cases(PARAM_OPS, ("last_negative", "middle")))
@dtypes
def test_param_grads_not_requested(device, op_id, case, dtype):
    """weight_grad / bias_grad False: shape (0,) in the accumulator dtype; dx unchanged."""
    op = OPS[op_id]
    x, dim = DIM_CASES[case](33, dtype, device)
    inp = op.inputs(x, dim)
    op = raw_case(op, x)
    outs = op.raw(inp, dim)
    dys = random_grads(op, outs)
    full = op.raw_backward(dys, inp, dim, outs, frozenset(op.params))
    none = op.raw_backward(dys, inp, dim, outs, frozenset(), every=True)
    for name in op.params:
        assert full[name].shape == (x.shape[dim],)
        assert none[name].shape == (0,)
        assert none[name].dtype == param_grad_dtype(x) == full[name].dtype
        assert none[name].device == x.device
    assert torch.equal(none["x"], full["x"]), "dx depends on whether dweight was asked for"
    if op.name == "layer_norm":  # one of the two
        for want in ({"weight"}, {"bias"}):
            one = op.raw_backward(dys, inp, dim, outs, frozenset(want), every=True)
            for name in op.params:
                assert one[name].shape == ((x.shape[dim],) if name in want else (0,))
                if name in want:
                    assert torch.equal(one[name], full[name])


@dtypes
@pytest.mark.parametrize("with_weight", [False, True], ids=["no_weight", "weight"])
def test_add_rms_norm_backward_op_grad_residual(device, dtype, with_weight):
    """grad_residual None counts as zeros; given, it is added to the norm's dx."""
    op = dataclasses.replace(
        OPS["add_rms_norm_weight" if with_weight else "add_rms_norm"], eps=1e-6
    )
    inp = op.inputs(randn((13, 129), dtype, device), -1)
    outs = op.raw(inp, -1)
    dy = randn(outs[0].shape, dtype, device)
    dr = randn(outs[0].shape, dtype, device)
    want = frozenset(op.params)
    got_none = op.raw_backward((dy, None), inp, -1, outs, want)
    got_zero = op.raw_backward((dy, torch.zeros_like(dy)), inp, -1, outs, want)
    assert torch.equal(got_none["x"], got_zero["x"])
    check_grads(op, inp, -1, (dy, None), got_none, what="grad_residual=None")
    got = op.raw_backward((dy, dr), inp, -1, outs, want)
    check_grads(op, inp, -1, (dy, dr), got, what="grad_residual")


# ---------------------------------------------------------------------------------------------
# Every output element is written


@all_ops
@dtypes
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("n", (7, 1025))
def test_backward_poisoned_output(device, op_id, dtype, layout, n):
    op = OPS[op_id]
    inp, dim = inputs_for(op, LAYOUTS[layout], row_count(n), n, dtype, device)
    op = raw_case(op, inp["x"])
    outs = op.raw(inp, dim)
    dys = random_grads(op, outs)
    x = inp["x"]
    acc = param_grad_dtype(x)
    ptrs = poison_blocks([(x.shape, x.dtype)] * 2 + [((n,), acc)] * 3, device)
    got = op.raw_backward(dys, inp, dim, outs, frozenset(op.params))
    if device == "cuda":
        assert got["x"].data_ptr() in ptrs, "the allocator did not hand back a poisoned block"
    for name, g in got.items():
        assert not torch.isnan(g).any(), f"d{name}: unwritten (NaN-poisoned) elements"
    check_grads(op, inp, dim, dys, got, what=layout)


@pytest.mark.parametrize(
    ("op_id", "case"), dim_cases(OP_FAMILIES, ("middle", "first", "nchw_channels", "nchw_wide"))
)
@dtypes
def test_backward_poisoned_output_dims(device, op_id, case, dtype):
    op = OPS[op_id]
    inp, dim = inputs_for(op, DIM_CASES[case], 65, dtype, device)
    op = raw_case(op, inp["x"])
    outs = op.raw(inp, dim)
    dys = random_grads(op, outs)
    x = inp["x"]
    poison_blocks([(x.shape, x.dtype)] * 2 + [((65,), param_grad_dtype(x))] * 3, device)
    got = op.raw_backward(dys, inp, dim, outs, frozenset(op.params))
    for name, g in got.items():
        assert not torch.isnan(g).any(), f"d{name}: unwritten (NaN-poisoned) elements"
    check_grads(op, inp, dim, dys, got, what=case)


# ---------------------------------------------------------------------------------------------
# Determinism and batch invariance of the parameter gradients


@param_ops
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("shape", [(4099, 257), (4099, 256), (65, 4097), (3, 65537)], ids=str)
def test_param_grads_deterministic(device, op_id, dtype, shape):
    """The same inputs give bit-identical dweight / dbias (no float atomics), and
    Σ_rows is linear: the gradient of a batch is the sum of its halves' (to rounding)."""
    op = OPS[op_id]
    inp = op.inputs(randn(shape, dtype, device), -1)
    op = raw_case(op, inp["x"])
    outs = op.raw(inp, -1)
    dys = random_grads(op, outs)
    want = frozenset(op.params)
    first = op.raw_backward(dys, inp, -1, outs, want)
    for _ in range(2):
        again = op.raw_backward(dys, inp, -1, outs, want)
        for name in ("x", *op.params):
            assert torch.equal(first[name], again[name]), f"d{name} differs between runs"
    # Halves: rows [0, h) and [h, M).
    h = shape[0] // 2
    parts = []
    for sl in (slice(0, h), slice(h, None)):
        sub = {k: (v[sl] if k in ROW_INPUTS else v) for k, v in inp.items()}
        sub_outs = tuple(o[sl] for o in outs)
        sub_dys = tuple(d[sl] for d in dys)
        parts.append(op.raw_backward(sub_dys, sub, -1, sub_outs, want))
    for name in op.params:
        total = parts[0][name].double() + parts[1][name].double()
        mag = op.grad_magnitudes(dys, inp, -1)[name]
        assert_matches(first[name], total.to(first[name].dtype), magnitude=mag, what=name)
    # dx of a row does not depend on the rows around it (bit-identical) where the halves'
    # rows keep their 16-byte alignment (see test_forward_backward_batch_invariant).
    if shape[-1] % 8 == 0:
        for sl, part in zip((slice(0, h), slice(h, None)), parts, strict=True):
            assert torch.equal(part["x"], first["x"][sl]), "dx depends on the batch"


@all_ops
@pytest.mark.parametrize("n", (32, 1024, 4096))
def test_forward_backward_batch_invariant(device, op_id, n):
    """A row's output and dx are bit-identical whatever the batch it is computed in.

    The guarantee holds for rows that keep their 16-byte alignment: with N a multiple of the
    pack width every row of a contiguous tensor starts aligned. A row of odd N moved to
    another alignment (a slice starting at another row, against a fresh output) may take
    another vector width and round differently in the last bit (README, Limitations)."""
    op = OPS[op_id]
    inp = op.inputs(randn((37, n), torch.float32, device), -1)
    op = raw_case(op, inp["x"])
    outs = op.raw(inp, -1)
    dys = random_grads(op, outs)
    got = op.raw_backward(dys, inp, -1, outs, frozenset())
    for sl in (slice(0, 1), slice(5, 6), slice(3, 20), slice(36, 37)):
        sub = {k: (v[sl] if k in ROW_INPUTS else v) for k, v in inp.items()}
        sub_outs = op.raw(sub, -1)
        for o, so in zip(outs, sub_outs, strict=True):
            assert torch.equal(o[sl], so), f"rows {sl}: output depends on the batch"
        sub_got = op.raw_backward(tuple(d[sl] for d in dys), sub, -1, sub_outs, frozenset())
        assert torch.equal(got["x"][sl], sub_got["x"]), f"rows {sl}: dx depends on the batch"


# ---------------------------------------------------------------------------------------------
# needs_input_grad, unused outputs


class OpLog(TorchDispatchMode):
    """Records the rownorm ops dispatched (with their arguments) while active."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "rownorm":
            self.calls.append((func.overloadpacket.__name__, args))
        return func(*args, **(kwargs or {}))

    def args_of(self, name: str) -> list[tuple]:
        return [a for n, a in self.calls if n == name]


# (op id, frozen inputs): what autograd must not compute.
FROZEN_CASES = [
    ("rms_norm_weight", ("weight",)),
    ("rms_norm_weight", ("x",)),
    ("layer_norm_affine", ("weight",)),
    ("layer_norm_affine", ("bias",)),
    ("layer_norm_affine", ("weight", "bias")),
    ("layer_norm_affine", ("x", "weight")),
    ("add_rms_norm_weight", ("weight",)),
    ("add_rms_norm_weight", ("residual",)),
    ("add_rms_norm_weight", ("x", "residual")),
]


@pytest.mark.parametrize(("op_id", "frozen"), FROZEN_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_needs_input_grad(device, op_id, frozen, dtype):
    """A frozen input gets no gradient, the others the right one, and no parameter gradient
    is computed for a frozen parameter (the backward op is asked for weight_grad=False)."""
    op = OPS[op_id]
    inp = op.inputs(randn((11, 129), dtype, device), -1)
    leaves = {k: v.detach().requires_grad_(k not in frozen) for k, v in inp.items()}
    with OpLog() as log:
        outs = op.call(leaves, -1)
        dys = random_grads(op, outs)
        torch.autograd.backward(outs, dys)
    for k, leaf in leaves.items():
        if k in frozen:
            assert leaf.grad is None, f"frozen {k} got a gradient"
    got = {k: leaf.grad for k, leaf in leaves.items() if k not in frozen}
    assert all(g is not None for g in got.values()), got.keys()
    check_grads(op, inp, -1, dys, got, what=f"frozen {frozen}")
    (args,) = log.args_of(op.name + "_backward")
    flags = {"rms_norm": {"weight": 5}, "add_rms_norm": {"weight": 5},
             "layer_norm": {"weight": 5, "bias": 6}}[op.name]  # fmt: skip
    for name, pos in flags.items():
        assert args[pos] is (name not in frozen), f"{name}_grad={args[pos]} with {frozen} frozen"


@pytest.mark.parametrize("op_id", ["add_rms_norm", "add_rms_norm_weight"])
@pytest.mark.parametrize("used", ["out", "r", "both"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_add_rms_norm_one_output_used(device, op_id, used, dtype):
    """Only out, only r, or both reach the loss: the gradients are those of what was used."""
    op = OPS[op_id]
    inp = op.inputs(randn((9, 257), dtype, device), -1)
    leaves = {k: v.detach().requires_grad_(True) for k, v in inp.items()}
    out, r = op.call(leaves, -1)
    dy = randn(out.shape, dtype, device)
    dr = randn(r.shape, dtype, device)
    if used == "out":
        loss, dys = (out * dy).sum(), (dy, None)
    elif used == "r":
        loss, dys = (r * dr).sum(), (None, dr)
    else:
        loss, dys = (out * dy).sum() + (r * dr).sum(), (dy, dr)
    loss.backward()
    got = {k: leaf.grad for k, leaf in leaves.items()}
    if used == "r" and "weight" in leaves:
        # The weight does not reach r: no gradient (None) or a zero one.
        assert got["weight"] is None or torch.count_nonzero(got["weight"]) == 0
        del got["weight"]
    assert got["x"] is not None and got["residual"] is not None
    assert torch.equal(got["x"], got["residual"])
    check_grads(op, inp, -1, dys, got, what=f"used={used}")


# ---------------------------------------------------------------------------------------------
# Special values and zero rows


@pytest.mark.parametrize("op_id", ["softmax", "log_softmax"])
@dtypes
@pytest.mark.parametrize("where", ["last", "middle"])
def test_backward_softmax_special_values(device, op_id, dtype, where):
    """-inf entries get a zero gradient (softmax) / the plain dy (log_softmax), all -inf and
    +inf rows NaN: as torch's autograd gives."""
    op = OPS[op_id]
    inf = float("inf")
    x = randn((6, 33), torch.float64, "cpu")
    x[0, ::2] = -inf
    x[1] = -inf
    x[2, 5] = inf
    x[3, :3] = 1e4
    x = x.to(device=device, dtype=dtype)
    dim = -1
    if where == "middle":
        x, dim = x.t().unsqueeze(0).contiguous(), 1
    outs, dys, got = autograd_grads(op, {"x": x}, dim)
    check_grads(op, {"x": x}, dim, dys, got)
    leaf = x.detach().requires_grad_(True)
    fn = torch.log_softmax if op.name == "log_softmax" else torch.softmax
    (expected,) = torch.autograd.grad(fn(leaf, dim), leaf, dys[0])
    assert torch.equal(torch.isnan(got["x"]), torch.isnan(expected))


@pytest.mark.parametrize("op_id", ["l1", "mean_abs"])
@dtypes
@pytest.mark.parametrize("eps", [0.5, 7.0])
@pytest.mark.parametrize("n", (1, 7, 33, 1025))
def test_backward_l1_clamped(device, op_id, dtype, eps, n):
    """Where s < eps the gradient is dy / eps; elsewhere the projection."""
    op = dataclasses.replace(OPS[op_id], eps=eps)
    x = randn((16, n), torch.float64, "cpu")
    s = x.abs().sum(-1, keepdim=True) / (n if op.mean else 1)
    x = x / s * torch.tensor([0.1, 0.45, 3.0, 20.0], dtype=torch.float64).repeat(4)[:, None]
    x[8] = 0
    x = x.to(device=device, dtype=dtype)
    _, dys, got = check_backward_autograd(op, {"x": x}, -1, what=f"eps={eps}")
    small = x.double().abs().sum(-1) / (n if op.mean else 1) < eps
    assert small.any() and (~small).any()
    clamped = (dys[0][small].double() / eps).to(dtype)
    assert_matches(got["x"][small], clamped, dim=-1, what="clamped rows")


@all_ops
@dtypes
def test_backward_zero_rows(device, op_id, dtype):
    op = OPS[op_id]
    x = with_zero_rows(randn((13, 65), dtype, device), -1)
    inp = op.inputs(x, -1)
    if op.residual:
        inp["residual"] = torch.where((x == 0).all(-1, keepdim=True), 0, inp["residual"])
    _, _, got = check_backward_autograd(op, inp, -1)
    for g in got.values():
        assert not torch.isnan(g).any()


# ---------------------------------------------------------------------------------------------
# Empty tensors


@pytest.mark.parametrize(("op_id", "shape_dim"), empty_cases())
def test_empty(device, op_id, shape_dim):
    """Empty x: empty dx; parameter gradients of a batch without rows are zeros of shape (N,)."""
    shape, dim = shape_dim
    for dtype in DTYPES:
        op = OPS[op_id]
        x = torch.empty(shape, dtype=dtype, device=device)
        inp = op.inputs(x, dim)
        op = raw_case(op, x)
        outs = op.raw(inp, dim)
        dys = tuple(torch.empty_like(o) for o in outs)
        got = op.raw_backward(dys, inp, dim, outs, frozenset(op.params))
        assert_new_contiguous(got["x"], x)
        for name in op.params:
            assert got[name].shape == (x.shape[dim],)
            assert got[name].dtype == param_grad_dtype(x)
            assert torch.count_nonzero(got[name]) == 0, f"d{name} of no rows is not zero"
        leaves = {k: v.clone().requires_grad_(True) for k, v in inp.items()}
        sum(o.sum() for o in op.call(leaves, dim)).backward()
        for k, leaf in leaves.items():
            assert leaf.grad is not None and leaf.grad.shape == leaf.shape, k


# ---------------------------------------------------------------------------------------------
# gradcheck (float64), double backward

# (op id or (op id, overrides), shape, dim): every differentiable input of every op; reduced
# dim last, middle and first; l1 with rows on both sides of a clamping eps.
GRADCHECK_CASES = {
    "l1-rows": ("l1", (4, 9), -1),
    "l1-middle": ("l1", (3, 6, 4), 1),
    "l1-clamped": (("l1", {"eps": 1.0}), (4, 6), -1),
    "mean_abs-rows": ("mean_abs", (4, 9), -1),
    "mean_abs-dim0": ("mean_abs", (7, 3), 0),
    "mean_abs-clamped": (("mean_abs", {"eps": 0.5}), (4, 6), -1),
    "rms_norm-rows": ("rms_norm", (4, 9), -1),
    "rms_norm-middle": ("rms_norm", (2, 5, 3), 1),
    "rms_norm_weight-rows": ("rms_norm_weight", (4, 9), -1),
    "rms_norm_weight-dim0": ("rms_norm_weight", (7, 3), 0),
    "rms_norm_weight-middle": ("rms_norm_weight", (2, 5, 3), -2),
    "layer_norm-rows": ("layer_norm", (4, 9), -1),
    "layer_norm_affine-rows": ("layer_norm_affine", (4, 9), -1),
    "layer_norm_affine-middle": ("layer_norm_affine", (2, 5, 3), 1),
    "layer_norm_affine-dim0": ("layer_norm_affine", (7, 3), 0),
    "layer_norm_bias_only": (("layer_norm_affine", {"params": ("bias",)}), (4, 9), -1),
    "layer_norm_weight_only": (("layer_norm_affine", {"params": ("weight",)}), (3, 6, 4), 1),
    "softmax-rows": ("softmax", (4, 9), -1),
    "softmax-middle": ("softmax", (3, 6, 4), 1),
    "log_softmax-rows": ("log_softmax", (4, 9), -1),
    "log_softmax-dim0": ("log_softmax", (7, 3), 0),
    "add_rms_norm-rows": ("add_rms_norm", (4, 9), -1),
    "add_rms_norm_weight-rows": ("add_rms_norm_weight", (2, 3, 8), -1),
}


def gradcheck_case(name: str, device) -> tuple[OpCase, dict, int]:
    spec, shape, dim = GRADCHECK_CASES[name]
    op_id, overrides = (spec, {}) if isinstance(spec, str) else spec
    op = dataclasses.replace(OPS[op_id], **overrides)
    x = randn(shape, torch.float64, device)
    if op.name == "l1_normalize" and op.eps > 0.1:
        # Scale alternate rows to s = 0.2·eps and 3·eps: far from the clamp's kink.
        moved = x.movedim(dim, -1)
        s = moved.abs().sum(-1, keepdim=True) / (moved.shape[-1] if op.mean else 1)
        scale = torch.tensor([0.2, 3.0], dtype=torch.float64, device=device).repeat(8)
        moved = moved / s * op.eps * scale[: moved.shape[0], None]
        x = moved.movedim(-1, dim).contiguous()
    return op, op.inputs(x, dim), dim


@pytest.mark.parametrize("case", GRADCHECK_CASES)
def test_gradcheck(device, case):
    op, inp, dim = gradcheck_case(case, device)
    names = op.grad_inputs(inp)

    def fn(*tensors):
        return op.call(dict(zip(names, tensors, strict=True)), dim)

    args = tuple(inp[k].detach().requires_grad_(True) for k in names)
    assert torch.autograd.gradcheck(fn, args)


@pytest.mark.parametrize("case", ["mean_abs-rows", "rms_norm_weight-rows",
                                  "layer_norm_affine-rows", "softmax-rows",
                                  "log_softmax-rows", "add_rms_norm-rows"])  # fmt: skip
def test_gradcheck_non_contiguous(device, case):
    """Transposed storage (same values): the made-contiguous route, differentiated."""
    op, inp, dim = gradcheck_case(case, device)
    inp = {k: (v.t().contiguous().t() if v.dim() == 2 else v) for k, v in inp.items()}
    assert not inp["x"].is_contiguous()
    names = op.grad_inputs(inp)

    def fn(*tensors):
        return op.call(dict(zip(names, tensors, strict=True)), dim)

    assert torch.autograd.gradcheck(fn, tuple(inp[k].requires_grad_(True) for k in names))


@pytest.mark.parametrize("op_id", [k for k, op in OPS.items() if not op.double_backward])
def test_double_backward_raises(device, op_id):
    """Second-order gradients are not supported: differentiating the backward raises a clear
    error instead of silently returning a wrong (or no) second-order term."""
    op = OPS[op_id]
    inp = op.inputs(randn((3, 8), torch.float64, device), -1)
    leaves = {k: v.detach().requires_grad_(True) for k, v in inp.items()}
    outs = op.call(leaves, -1)
    dys = random_grads(op, outs)
    grads = torch.autograd.grad(outs, list(leaves.values()), dys, create_graph=True)
    with pytest.raises((RuntimeError, NotImplementedError), match="double backward"):
        torch.autograd.grad(sum(g.square().sum() for g in grads), leaves["x"])


# ---------------------------------------------------------------------------------------------
# The reference backward is the truth above: it agrees with float64 autograd through the torch
# expressions (F.rms_norm, F.layer_norm, ...).


@all_ops
@pytest.mark.parametrize("where", ["last", "middle"])
def test_reference_backward_matches_torch_autograd(op_id, where):
    op = OPS[op_id]
    x, dim = (randn((5, 7), torch.float64, "cpu"), -1)
    if where == "middle":
        if op.last_dim_only:
            pytest.skip("add_rms_norm reduces the last dim only")
        x, dim = DIM_CASES["middle"](7, torch.float64, "cpu")
    inp = op.inputs(x, dim)
    leaves = {k: v.detach().requires_grad_(True) for k, v in inp.items()}
    outs = op.torch_equivalent(leaves, dim)
    dys = random_grads(op, outs)
    expected = torch.autograd.grad(outs, list(leaves.values()), dys)
    ref = op.reference_grads(dys, inp, dim)
    for k, e in zip(leaves, expected, strict=True):
        torch.testing.assert_close(ref[k], e, rtol=1e-10, atol=1e-10, msg=lambda m, k=k: k + m)


def test_rms_norm_reference_default_eps_torch():
    """F.rms_norm of 16-bit x with eps=None in float64 equals ours resolved (sanity of the
    op table's eps resolution the raw-backward tests rely on)."""
    x = randn((4, 16), torch.bfloat16, "cpu") * 1e-3
    eps = OPS["rms_norm"].resolved_eps(x)
    torch.testing.assert_close(
        F.rms_norm(x.float(), (16,), eps=eps).to(x.dtype), F.rms_norm(x, (16,))
    )
