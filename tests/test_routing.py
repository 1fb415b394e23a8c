"""How a problem reaches the kernels: every input layout, per arity and element size.

Why the grid is what it is: on CUDA the layout of the operands decides only the binding's
route (a row view without a copy, a contiguous copy) and the vector width (the widest pack at
which every operand's rows start at the same phase: ``RowVecWidth``). Both depend on the
number of row inputs, whether there are per-feature parameters (loaded vectorised next to
misaligned rows) and the element size -- not on which op runs. So one op case per arity
(row inputs, parameters, outputs: derived from the op table) × one dtype per element size
(bfloat16 for 2 bytes: float16 plans identically) × device; the layouts, row lengths (a few
packs, a whole number of packs, odd) and gradient layouts are iterated inside. The CPU makes
every operand contiguous first, so it runs float32 only, on one length.
"""

from __future__ import annotations

import pytest
import torch
from utils import (
    GRAD_LAYOUTS,
    LAYOUTS,
    OPS,
    assert_new_contiguous,
    autograd_grads,
    check_backward,
    check_forward,
    check_grads,
    dtype_id,
    param_grad_dtype,
    randn,
    raw_case,
)

pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")


def _arity_cases() -> dict[str, str]:
    """{arity id: op id}: the first op case of each arity in the table."""
    cases: dict[str, str] = {}
    for op_id, op in OPS.items():
        a = op.arity
        cases.setdefault(f"in{a.inputs}-p{a.params}-out{a.outputs}", op_id)
    return cases


ARITIES = _arity_cases()
# (device, dtype): one dtype per element size on CUDA; float32 on the CPU.
TARGETS = [
    pytest.param(("cpu", torch.float32), id="cpu-fp32"),
    *[
        pytest.param(("cuda", dt), id=f"cuda-{dtype_id(dt)}", marks=pytest.mark.cuda)
        for dt in (torch.bfloat16, torch.float32, torch.float64)
    ],
]


@pytest.fixture
def target(request):
    device, dtype = request.param
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return device, dtype


def _lengths(device) -> tuple[int, ...]:
    # a few packs; a whole number of 16-byte packs for every dtype; odd (head and tail scalars)
    return (33, 1032, 1025) if device == "cuda" else (33,)


@pytest.mark.parametrize("target", TARGETS, indirect=True)
@pytest.mark.parametrize("arity", ARITIES)
def test_layouts(target, arity):
    """Every layout of the row inputs (the residual in the same layout), forward and
    backward through autograd."""
    device, dtype = target
    op = OPS[ARITIES[arity]]
    for layout, build in LAYOUTS.items():
        for n in _lengths(device):
            rows = 19 if n > 64 else 35
            x, dim = build(rows, n, dtype, device)
            if not op.supports(x, dim):
                continue
            res = build(rows, n, dtype, device)[0] if op.residual else None
            inp = op.inputs(x, dim, residual=res)
            what = f"{layout} N={n}"
            check_forward(op, inp, dim, what=what)
            check_backward(raw_case(op, x), inp, dim, what=what, raw=False)


@pytest.mark.parametrize("target", TARGETS, indirect=True)
@pytest.mark.parametrize("arity", [a for a, op_id in ARITIES.items() if OPS[op_id].residual])
def test_mixed_operand_layouts(target, arity):
    """x and residual in different layouts: their rows start at different phases, so the
    vector width must fall to what both allow (or the route to a copy)."""
    device, dtype = target
    op = OPS[ARITIES[arity]]
    pairs = [("contiguous", "odd_offset"), ("odd_offset", "contiguous"),
             ("row_strided", "contiguous"), ("contiguous", "transposed"),
             ("expanded_rows", "odd_offset")]  # fmt: skip
    for lx, lr in pairs:
        for n in _lengths(device):
            x, dim = LAYOUTS[lx](19, n, dtype, device)
            res, _ = LAYOUTS[lr](19, n, dtype, device)
            inp = op.inputs(x, dim, residual=res)
            check_forward(op, inp, dim, what=f"x {lx}, residual {lr}, N={n}")
            check_backward(raw_case(op, x), inp, dim, what=f"x {lx}, residual {lr}, N={n}")


@pytest.mark.parametrize("target", TARGETS, indirect=True)
@pytest.mark.parametrize("arity", ARITIES)
def test_grad_layouts(target, arity):
    """The raw backward op with every gradient layout against x in an aligned, a copied and a
    misaligned layout; and autograd handing it gradients of stride 0 (out.sum(0))."""
    device, dtype = target
    op = OPS[ARITIES[arity]]
    for x_layout in ("contiguous", "transposed", "odd_offset"):
        for grad_layout, grad in GRAD_LAYOUTS.items():
            for n in (7, 1025) if device == "cuda" else (7,):
                rows = 19
                x, dim = LAYOUTS[x_layout](rows, n, dtype, device)
                res = LAYOUTS[x_layout](rows, n, dtype, device)[0] if op.residual else None
                inp = op.inputs(x, dim, residual=res)
                case = raw_case(op, x)
                outs = case.raw(inp, dim)
                dys = tuple(grad(rows, n, dtype, device) for _ in outs)
                got = case.raw_backward(dys, inp, dim, outs, frozenset(op.params))
                assert_new_contiguous(got["x"], x)
                for name in op.params:
                    assert got[name].dtype == param_grad_dtype(inp)
                check_grads(case, inp, dim, dys, got, what=f"x {x_layout}, dy {grad_layout}")
    rows, n = 9, 257
    inp = op.inputs(randn((rows, n), dtype, device), -1)
    leaf = inp["x"].detach().requires_grad_(True)
    out = op.call({**inp, "x": leaf}, -1)[0]
    dy0 = randn((n,), dtype, device)
    (dx,) = torch.autograd.grad(out.sum(0), leaf, dy0)
    dys = (dy0.expand(rows, n),) + tuple(torch.zeros_like(leaf) for _ in range(op.n_outputs - 1))
    check_grads(raw_case(op, leaf), inp, -1, dys, {"x": dx}, what="sum(0)")
    _, dys, got = autograd_grads(op, inp, -1, dys)
    check_grads(raw_case(op, leaf), inp, -1, dys, got, what="sum(0) every input")
