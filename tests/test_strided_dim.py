"""Reductions over a dim that is not the last: the strided-dim path, per op family.

Why the grid is what it is: on CUDA a reduction over a non-last dim of a contiguous
(outer, N, inner) tensor runs its own kernels, chosen by N and inner only: columns of up to 64
elements are cached in registers (one read), longer ones streamed (two reads); inner a
multiple of the 16-byte pack and at least one tile of columns, with aligned operands, runs the
packed kernel (several columns per thread), with a partial last tile when inner is not a
multiple of the tile. The op body is the only op-specific part, so one id per (op family,
dtype, device) iterates the dim positions of :data:`rownorm.testing.samples.DIM_CASES` × N
on both sides of the register cache's edge (64), forward, backward (autograd and the raw
op) and with poisoned outputs. The CPU makes the tensor contiguous and runs one loop for
every position (inner == 1 or not is its only variable), so it runs three positions and two
N. add_rms_norm reduces the last dim only.
"""

from __future__ import annotations

import pytest
import torch
from utils import (
    DIM_CASES,
    DTYPES,
    HAS_CUDA,
    OPS,
    ROW_INPUTS,
    assert_matches,
    check_backward,
    check_forward,
    check_grads,
    dtype_id,
    families,
    param_grad_dtype,
    poison_blocks,
    randn,
    random_grads,
    raw_case,
    strided_keeps_inputs_in_l2,
)

pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")

STRIDED_OPS = [op_id for op_id, op in families().items() if not op.last_dim_only]
# Every position at N = 33 (cached) and 65 (streamed); the edges 1 and 64 and a long column on
# a few. float16 and float64 (which has no packed kernel) run those few only.
CUDA_LENGTHS = (33, 65)
EDGE_CASES = {"middle": (1, 64, 1025), "nchw_wide": (1, 64), "first": (1, 64, 1025)}
CPU_CASES = ("1d", "middle", "nhwc_channels")


@pytest.mark.parametrize("op_id", STRIDED_OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_strided_dims(device, op_id, dtype):
    op = OPS[op_id]
    cuda = torch.device(device).type == "cuda"
    few = dtype in (torch.float16, torch.float64)
    for case, build in DIM_CASES.items():
        if (not cuda and case not in CPU_CASES) or (cuda and few and case not in EDGE_CASES):
            continue
        lengths = CUDA_LENGTHS + EDGE_CASES.get(case, ()) if cuda else (1, 65)
        for n in lengths:
            x, dim = build(n, dtype, device)
            inp = op.inputs(x, dim)
            what = f"{case} N={n}"
            check_forward(op, inp, dim, what=what)
            case_op = raw_case(op, x)
            outs, dys, _ = check_backward(case_op, inp, dim, what=what)
            # The raw backward again, into NaN-poisoned blocks: every element is written.
            grads = [((x.shape[dim],), param_grad_dtype(inp))] * 3
            poison_blocks([(x.shape, x.dtype)] * 2 + grads, device)
            got = case_op.raw_backward(dys, inp, dim, tuple(o.detach() for o in outs),
                                       frozenset(op.params))  # fmt: skip
            for name, g in got.items():
                assert not torch.isnan(g).any(), f"{op} {what}: d{name} has unwritten elements"
            poison_blocks([(x.shape, x.dtype)] * 2, device)
            for o in op.call(inp, dim):
                assert not torch.isnan(o).any(), f"{op} {what}: unwritten output elements"


@pytest.mark.parametrize("op_id", STRIDED_OPS)
def test_long_constant_columns(device, op_id):
    """Long streamed columns of one value, float32: the sums must not drift. A thread of the
    streamed kernel sums d / 8 elements (512 at d = 4097); summed in one serial chain, l1's
    output of such a column was 2.7e-6 off against the 1e-6 relative tolerance (the CUDA fuzz
    net, 2026-11-23); they are now summed in two levels of blocks (strided_views.cuh). On the
    CPU (float64 sums) this holds by construction."""
    op = OPS[op_id]
    for n in (4097, 16385, 65537):
        for layout in ("contiguous", "expanded"):
            x = torch.full((2, n, 3), 0.0119, dtype=torch.float32, device=device)
            if layout == "expanded":  # stride 0 along the reduced dim
                x = x[:, :1].expand(2, n, 3)
            inp = op.inputs(x, 1)
            # against the float64 reference only: torch's own float32 sums of these columns
            # drift further (the CPU's l1 and l2 by 2e-5 to 5e-5)
            check_forward(op, inp, 1, what=f"{layout} N={n}", vs_torch=False)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("op_id", STRIDED_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_strided_warp_layout(op_id, dtype):
    """Packed columns of up to 32 elements split d among 1, 2 or 4 lanes of a warp (plan.h,
    StridedWarpRows: the fewest that hold d in 8 packs each), reducing by shuffles; longer
    ones among a CTA's 8 thread rows. Both sides of each edge (8 / 9, 16 / 17, 32 / 33), with a
    tile of 8-32 packs per warp and 64-256 per CTA: inner = 272 is part of one tile, 2560 (fp32:
    640 packs, 16-bit: 320) whole tiles and a partial one. Forward, backward, poisoned outputs."""
    import rownorm

    op = OPS[op_id]
    for d in (1, 3, 8, 9, 16, 17, 24, 32, 33):
        for inner in ((16, 17), (40, 64)):
            x = torch.randn((2, d, *inner), dtype=dtype, device="cuda")
            plan = rownorm.explain(x, op.name, dim=1)
            rows = 1 if d <= 8 else 2 if d <= 16 else 4 if d <= 32 else None
            assert (plan.kernel, plan.warp_rows) == ("packed", rows), (d, inner, plan.raw)
            # 8 d-rows in every thread (the kernels without bounds) at d = 8, 16, 32
            full = "full" if d in (8, 16, 32) else None
            assert plan.columns == full, (d, inner, plan.raw)
            # the staged kernel's inputs under L2's evict_last where the device keeps them, in
            # the warp layouts and on 4-byte tiles (plan.h, StridedKeepsInputsInL2)
            keep = strided_keeps_inputs_in_l2(plan, dtype)
            assert plan.l2 == ("keep" if keep else None), plan.raw
            inp = op.inputs(x, 1)
            what = f"d={d} inner={inner}"
            check_forward(op, inp, 1, what=what)
            check_backward(raw_case(op, x), inp, 1, what=what)
            poison_blocks([(x.shape, x.dtype)] * 2, "cuda")
            for o in op.call(inp, 1):
                assert not torch.isnan(o).any(), f"{op} {what}: unwritten output elements"


STRIDED_PARAM_OPS = [op_id for op_id, op in OPS.items() if op.params and not op.last_dim_only]


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("op_id", STRIDED_PARAM_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
def test_strided_fused_param_grads(op_id, dtype, monkeypatch):
    """The packed strided kernel's backward sums the parameter gradients' column terms per tile
    (plan.h, StridedSumPlan: one partial a tile, added by the finalize's fixed tree): the warp
    layout (1, 2 and 4 lanes a column: d = 3, 16, 32) and the CTA layout (d = 33, 64), inner of
    one partial tile, of whole tiles and a partial one, several outer indices; d = 16, 32, 64
    fill every thread's 8 d-rows (the kernels without bounds); 16-bit layer_norm threads own
    half a pack of columns (plan.h's StridedSumLanes), the others a whole one, and in the CTA
    layout its tiles are staged two ahead by a persistent grid (StridedSumStages; 40 x 9 tiles
    of d = 64: more than the grid's CTAs, so each CTA runs several and reuses its stages). The
    gradients
    match the float64 reference and are bit-identical run to run; dx is the two-pass path's
    bits (ROWNORM_PARAM_GRADS=two-pass) and so are the gradients to rounding; a batch's
    gradients are the sum of its halves' (to rounding); each parameter's gradient asked alone
    is its bits asked with the others. Columns of 65 (the streamed kernel) and inner not a
    multiple of the pack (the cached kernel) stay two-pass."""
    import rownorm

    op = OPS[op_id]
    vec = 16 // dtype.itemsize
    want = frozenset(op.params)
    cases = [(3, 3, 2 * 256 * vec + 3 * vec), (2, 16, 32 * vec), (3, 32, 64 * vec + vec)]
    cases += [(4, 33, 2 * 32 * vec + 5 * vec), (3, 64, 32 * vec), (2, 64, 2 * 32 * vec + 7 * vec)]
    cases += [(40, 64, 8 * 32 * vec // 2 + vec)]
    for outer, d, inner in cases:
        x = randn((outer, d, inner), dtype, "cuda")
        what = f"{(outer, d, inner)}"
        plan = rownorm.explain(x, op.name, 1, backward=True, param_grads=True)
        assert (plan.kernel, plan.param_grads) == ("packed", "fused"), plan.raw
        assert plan.columns == ("full" if d in (16, 32, 64) else None), plan.raw
        # 16-bit layer_norm threads take half a pack (4 columns), the others a whole pack
        half = dtype.itemsize == 2 and op.name == "layer_norm"
        assert plan.vec == (vec // 2 if half else vec), plan.raw
        assert plan.stages == (2 if half and plan.warp_rows is None else None), plan.raw
        # the staged kernel's inputs under L2's evict_last where the device keeps them, in the
        # warp layouts and on 4-byte tiles (plan.h, StridedKeepsInputsInL2): the staged
        # backward's are 16-bit tiles of the CTA layout
        keep = strided_keeps_inputs_in_l2(plan, dtype)
        assert plan.l2 == ("keep" if keep else None), plan.raw
        tile = 32 * 8 // (plan.warp_rows or 8) * plan.vec  # columns a tile
        assert plan.chunks == outer * -(-inner // tile), (what, plan.raw)
        inp = op.inputs(x, 1)
        case = raw_case(op, x)
        outs = case.raw(inp, 1)
        dys = random_grads(outs)
        first = case.raw_backward(dys, inp, 1, outs, want)
        check_grads(case, inp, 1, dys, first, what=what)
        again = case.raw_backward(dys, inp, 1, outs, want)
        for name in ("x", *op.params):
            assert torch.equal(first[name], again[name]), f"{what}: d{name} differs between runs"
        if len(op.params) > 1:
            for name in op.params:
                alone = case.raw_backward(dys, inp, 1, outs, frozenset({name}))
                assert torch.equal(alone[name], first[name]), f"{what}: d{name} asked alone"
        mags = case.grad_magnitudes(dys, inp, 1)
        monkeypatch.setenv("ROWNORM_PARAM_GRADS", "two-pass")
        plan = rownorm.explain(x, op.name, 1, backward=True, param_grads=True)
        assert plan.param_grads == "two-pass", plan.raw
        two = case.raw_backward(dys, inp, 1, outs, want)
        monkeypatch.delenv("ROWNORM_PARAM_GRADS")
        assert torch.equal(two["x"], first["x"]), f"{what}: dx differs from the two-pass path"
        for name in op.params:
            assert_matches(first[name], two[name], magnitude=mags[name], what=f"{what} two-pass")
        h = outer // 2
        parts = []
        for sl in (slice(0, h), slice(h, None)):
            sub = {k: (v[sl] if k in ROW_INPUTS else v) for k, v in inp.items()}
            sub_outs = tuple(o[sl] for o in outs)
            parts.append(case.raw_backward(tuple(g[sl] for g in dys), sub, 1, sub_outs, want))
        for name in op.params:
            total = (parts[0][name].double() + parts[1][name].double()).to(first[name].dtype)
            assert_matches(first[name], total, magnitude=mags[name], what=f"{what} halves")
    for shape in ((2, 65, 32 * vec), (2, 16, 32 * vec + 1)):
        x = torch.empty(shape, dtype=dtype, device="cuda")
        plan = rownorm.explain(x, op.name, 1, backward=True, param_grads=True)
        assert plan.kernel != "packed" and plan.param_grads == "two-pass", (shape, plan.raw)
