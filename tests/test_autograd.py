"""Autograd and the backward ops beyond matching the reference: determinism, batch invariance,
``needs_input_grad``, unused outputs, unrequested parameter gradients, gradcheck, second order.

Specification (DESIGN §2): parameter gradients are deterministic (chunk partials added in a
fixed order, no float atomics): bit-identical run to run, and a batch's is the sum of its
parts'; a row's output and dx do not depend on the rows around it; a frozen input gets no
gradient and its parameter gradient is not computed; the backward ops return (0,)-shaped
parameter gradients when not asked; first-order only (l2_normalize has a double backward).

Why the grid is what it is: determinism and batch invariance run per op case with
parameters (the parameter-gradient kernels: chunk partials of several chunks, the fused
column sums on aligned rows, the two-pass path on odd N) and per op family for the rows;
gradcheck runs in float64 on small shapes of every op case (reduced dim last, middle and
first, where the op allows), generated from the table.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from utils import (
    DIM_CASES,
    OPS,
    ROW_INPUTS,
    assert_matches,
    check_grads,
    cuda_only,
    dram_gbps_per_sm,
    dtype_id,
    families,
    param_grad_dtype,
    randn,
    random_grads,
    raw_case,
)

PARAM_OPS = [op_id for op_id, op in OPS.items() if op.params]
# The fused sums of rows in phase: one case per op body and parameter kind (an offset weight:
# rms_norm_offset); the mixed problems' operands (the float32 residual stream) are never in
# phase.
PHASED_OPS = ["rms_norm_weight", "rms_norm_offset", "layer_norm_affine", "add_rms_norm_weight"]
needs_clusters = pytest.mark.skipif(
    not torch.cuda.is_available()
    or torch.cuda.get_device_capability()[0] < 9
    or os.environ.get("ROWNORM_DISABLE_CLUSTERS", "0") not in ("", "0"),
    reason="needs a CUDA device with thread-block clusters (sm_90+), not disabled",
)


@pytest.mark.parametrize("op_id", PARAM_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_param_grads_deterministic(device, op_id, dtype):
    """The same inputs give bit-identical dweight / dbias; they equal the reference; and
    Σ_rows is linear: a batch's gradient is the sum of its halves' (to rounding). Shapes:
    many chunks of aligned rows (fused sums), odd N (fused sums of rows in phase), few long
    rows (the two-pass chunk partials)."""
    op = OPS[op_id]
    shapes = [(4099, 257), (4099, 256), (65, 4097), (3, 65537)]
    if torch.device(device).type == "cpu":  # one loop over columns: one small shape
        shapes = [(259, 33)]
    for shape in shapes:
        inp = op.inputs(randn(shape, dtype, device), -1)
        case = raw_case(op, inp["x"])
        outs = case.raw(inp, -1)
        dys = random_grads(outs)
        want = frozenset(op.params)
        first = case.raw_backward(dys, inp, -1, outs, want)
        check_grads(case, inp, -1, dys, first, what=str(shape))
        again = case.raw_backward(dys, inp, -1, outs, want)
        for name in ("x", *op.params):
            assert torch.equal(first[name], again[name]), f"{shape}: d{name} differs between runs"
        h = shape[0] // 2
        parts = []
        for sl in (slice(0, h), slice(h, None)):
            sub = {k: (v[sl] if k in ROW_INPUTS else v) for k, v in inp.items()}
            sub_outs = tuple(o[sl] for o in outs)
            parts.append(case.raw_backward(tuple(d[sl] for d in dys), sub, -1, sub_outs, want))
        mags = case.grad_magnitudes(dys, inp, -1)
        for name in op.params:
            total = (parts[0][name].double() + parts[1][name].double()).to(first[name].dtype)
            assert_matches(first[name], total, magnitude=mags[name], what=f"{shape} halves")
        # dx of a row does not depend on the rows around it (bit-identical) where the
        # halves' rows keep their 16-byte alignment (see test_forward_backward_batch_invariant).
        if shape[-1] % 8 == 0:
            for sl, part in zip((slice(0, h), slice(h, None)), parts, strict=True):
                assert torch.equal(part["x"], first["x"][sl]), f"{shape}: dx depends on the batch"


@pytest.mark.gpu_heavy
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_staged_param_grads_many_chunks_per_cta(dtype):
    """layer_norm's fused column sums on the staged persistent kernel (plan.h: 64-row chunks,
    a grid of the CTAs the GPU holds at once). With ten chunks per SM every CTA runs several
    chunks in turn, its row pipeline crossing their boundaries: the sums match the reference
    and are bit-identical run to run. (The shapes of test_param_grads_deterministic give a
    CTA one chunk at most.)"""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # 128 threads x 2 packs (the most CTAs per SM, ten chunks each); fp32 also 512 x 4 packs
    # (one CTA per SM, three chunks each), bf16 320 x 2 packs (held to two CTAs per SM on
    # sm_90, three chunks each)
    shapes = [(64 * 10 * sms + 37, 2048 if dtype == torch.bfloat16 else 1024)]
    if dtype == torch.float32:
        shapes.append((64 * 3 * sms + 37, 8192))
    else:
        shapes.append((64 * 3 * 2 * sms + 37, 5120))
    for shape in shapes:
        _check_fused_param_grads("layer_norm", randn(shape, dtype, "cuda"), stages=2, chunk_rows=64)


def _check_fused_param_grads(op_id: str, x: torch.Tensor, **plan_fields):
    """x's backward with every parameter gradient runs the fused plan with `plan_fields`; the
    gradients match the reference and are bit-identical run to run. Returns the case, its
    inputs, outputs, output gradients and the backward's gradients."""
    import rownorm

    plan = rownorm.explain(x, OPS[op_id].name, backward=True, param_grads=True)
    assert plan.param_grads == "fused", plan.raw
    for field, value in plan_fields.items():
        assert getattr(plan, field) == value, (field, plan.raw)
    op = OPS[op_id]
    inp = op.inputs(x, -1)
    case = raw_case(op, x)
    outs = case.raw(inp, -1)
    dys = random_grads(outs)
    want = frozenset(op.params)
    first = case.raw_backward(dys, inp, -1, outs, want)
    check_grads(case, inp, -1, dys, first, what=f"{tuple(x.shape)}")
    again = case.raw_backward(dys, inp, -1, outs, want)
    for name in ("x", *op.params):
        assert torch.equal(first[name], again[name]), f"{tuple(x.shape)}: d{name} differs"
    return case, inp, outs, dys, first


def _fewest_fused_rows(op: str, n: int, dtype, rows: int, grow):
    """The first of rows, grow(rows), ... whose backward with parameter gradients runs fused,
    and its plan."""
    import rownorm

    while True:
        probe = torch.empty((rows, n), dtype=dtype, device="cuda")
        plan = rownorm.explain(probe, op, backward=True, param_grads=True)
        if plan.param_grads == "fused":
            return rows, plan
        assert rows < 1 << 16, (n, plan.raw)
        rows = grow(rows)


def _check_dx_as_two_pass(op_id, case, inp, outs, dys, fused, slices):
    """The rows `slices` of a fused run, run on their own (too few rows for the fused path:
    the two-pass one), give the same dx bits."""
    import rownorm

    want = frozenset(OPS[op_id].params)
    n = inp["x"].shape[-1]
    for sl in slices:
        sub = {k: (v[sl] if k in ROW_INPUTS else v) for k, v in inp.items()}
        few = rownorm.explain(sub["x"], OPS[op_id].name, backward=True, param_grads=True)
        assert few.param_grads == "two-pass", (n, few.raw)
        part = case.raw_backward(
            tuple(d[sl] for d in dys), sub, -1, tuple(o[sl] for o in outs), want
        )
        assert torch.equal(part["x"], fused["x"][sl]), f"N={n} rows {sl}: dx differs"


@pytest.mark.cuda
@needs_clusters
@pytest.mark.parametrize("op_id", ["rms_norm", "add_rms_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_clustered_param_grads(op_id, dtype):
    """One column sum on the CTA tier: clusters of four 16-row CTAs add their sums into one
    64-row partial (plan.h, kSumClusterCtas). Rows that leave the last cluster's CTAs partly
    or wholly past the end: the sums match the reference and are bit-identical run to run,
    on rows of 128 and 256 threads x 2 packs and of 256 x 4 at bf16 (add_rms_norm: 512 x 2)."""
    vec = 16 // torch.empty((), dtype=dtype).element_size()
    shapes = [(128 * 2 * vec, 64 * 7 + 17), (256 * 2 * vec, 64 * 5 + 33)]
    if dtype == torch.bfloat16 or op_id == "add_rms_norm":  # fp32 256 x 4 rows: 16-row partials
        shapes.append((256 * 4 * vec, 64 * 3 + 49))
    for n, m in shapes:
        _check_fused_param_grads(op_id, randn((m, n), dtype, "cuda"), cluster=4, chunk_rows=64)


@pytest.mark.gpu_heavy
@cuda_only
@pytest.mark.parametrize("op_id", [*PHASED_OPS, "add_rms_norm_fp32_residual"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_fused_param_grads_of_parameters_off_the_pack_grid(op_id, dtype):
    """The fused sums' kernels copy the parameters into shared memory with vector loads where
    they start aligned to them, else an element at a time (ParamCache::Fill): parameters that
    start mid-pack (views one element into a buffer) give the bits of aligned copies of the
    same values, dx and every parameter gradient. On the group tier, the CTA tier's 2-pack rows
    (pipelined; layer_norm's staged) and 4-pack rows (one row at a time), and rows in phase
    (odd N; not the float32 residual stream, whose mixed operands are never in phase)."""
    op = OPS[op_id]
    vec = 16 // dtype.itemsize
    lengths = [64 * vec, 256 * vec, 1024 * vec]
    if op_id in PHASED_OPS:
        lengths.append(1024 * vec - 1)
    want = frozenset(op.params)
    for n in lengths:
        rows, _ = _fewest_fused_rows(op.name, n, dtype, 64, lambda r: 2 * r)
        case, inp, outs, dys, aligned = _check_fused_param_grads(
            op_id, randn((rows + 5, n), dtype, "cuda")
        )
        shifted = dict(inp)
        for name in op.params:
            p = inp[name]
            shifted[name] = torch.empty(n + 1, dtype=p.dtype, device=p.device)[1:].copy_(p)
        got = case.raw_backward(dys, shifted, -1, outs, want)
        for name in ("x", *op.params):
            assert torch.equal(got[name], aligned[name]), f"N={n}: d{name} differs"


@pytest.mark.gpu_heavy
@pytest.mark.cuda
@needs_clusters
@pytest.mark.parametrize("op_id", PARAM_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_slice_param_grads(op_id, dtype):
    """Rows past the CTA tier's 4 packs (the wide CTA, the cluster tier; 16-bit rows of 512
    threads x 4 packs, and layer_norm's of 256 x 4 past 384 x 2) sum their columns in shared
    memory on a persistent grid, in
    chunks of 32 16-bit / 16 fp32 rows (plan.h, kSliceChunkBytes), where the chunks keep the
    device's CTAs or clusters busy; fewer rows take the two-pass path. With a last chunk part
    full:
    the gradients match the reference and are bit-identical run to run, and a row's dx is the
    same bits on both paths; on 16-bit cluster rows with the next row staged in shared memory
    too (bulk copies), and on layer_norm's 16-bit rows of 512 x 4 with the sums in
    registers."""
    import rownorm

    elem = torch.empty((), dtype=dtype).element_size()
    vec = 16 // elem
    # wide CTA (rms_norm) or 2-CTA clusters; clusters of 4 (16-bit) / 8 (fp32); 16-bit: the
    # 512 x 4 CTA. 16-bit layer_norm and rms_norm: 2 CTAs of 8 packs, then clusters of 4 packs
    # a thread (kClusterPacks) on 8 and 16 CTAs of 256 and 16 of 512; layer_norm not on the
    # wide cluster of longer rows (two-pass: plan.h)
    lengths = [512 * 6 * vec, 4096 * 10 + vec]
    if elem == 2:
        lengths.append(512 * 3 * vec)
    if elem == 2 and OPS[op_id].name != "layer_norm":  # one sum pipelined (SliceSumsPipelined)
        lengths.append(512 * 4 * vec)
    if elem == 2 and OPS[op_id].name in ("layer_norm", "rms_norm"):
        lengths.append(4096 * 40 + vec)
    if elem == 2 and OPS[op_id].name == "layer_norm":
        lengths += [4096 * 30 + vec, 512 * 4 * vec, 512 * 8 * vec]  # full 512 x 4 / 2 x 256 x 8
        lengths.append(256 * 3 * vec + 2 * vec)  # 256 x 4 past 384 x 2 (plan.h, SliceSums256x4)
        shapes = ((4096 * 10 + vec, 4, 256), (4096 * 30 + vec, 4, 256), (4096 * 40 + vec, 4, 512))
        for n, packs, threads in shapes + ((4096 * 70 + vec, 8, 512),):
            probe = torch.empty((1 << 10, n), dtype=dtype, device="cuda")
            plan = rownorm.explain(probe, "layer_norm", backward=True, param_grads=True)
            assert plan.tier == "cluster" and plan.packs == packs, (n, plan.raw)
            assert plan.threads == threads, (n, plan.raw)
        assert plan.param_grads == "two-pass", plan.raw
    if elem == 4 and OPS[op_id].name == "layer_norm":
        lengths.append(4096 * 20 + vec)  # 16 CTAs of 256
    for n in lengths:
        # about the fewest rows whose chunks keep the device busy
        rows, plan = _fewest_fused_rows(OPS[op_id].name, n, dtype, 64, lambda r: r * 3 // 2)
        # plan.h, SlicePrefetchesNextRow: which teams bring their next row into L2 (sm_90+)
        cluster = plan.cluster or 1
        # on GPUs of >= 30 GB/s of DRAM bandwidth per SM (the H200), more teams
        fast = dram_gbps_per_sm() >= 30
        if OPS[op_id].name != "layer_norm":  # one column sum: 4-pack clusters, 16-bit wide CTA
            wide = cluster == 16 and plan.threads == 512
            wide_cta = cluster == 1 and plan.threads == 512 and plan.packs == 8 and elem == 2
            prefetch = cluster > 1 and plan.packs == 4 and (wide or fast) or wide_cta and fast
        else:
            team = plan.threads * plan.packs * vec * cluster
            # full 16-bit rows and fp32 ones on 8 CTAs too where fast
            if elem == 2:
                full = 4 * n > 3 * team
                prefetch = cluster == 16 or cluster > 1 and plan.packs == 4 or not full or fast
            else:
                prefetch = cluster == 16 or cluster == 8 and fast
        sm90 = torch.cuda.get_device_capability()[0] >= 9
        # one sum of whole 16-bit 512 x 4 rows of at least 3 packs a thread: the next row's
        # loads in flight instead (plan.h, SliceSumsPipelined)
        piped = (
            OPS[op_id].name != "layer_norm"
            and elem == 2
            and cluster == 1
            and (plan.threads, plan.packs) == (512, 4)
            and n % vec == 0
            and n >= 3 * 512 * vec
        )
        # whole 16-bit rows on clusters: the next row staged in shared memory instead (plan.h,
        # SliceSumsStageNextRow; for two sums where the staged CTAs fit as many per SM as the
        # plain ones, which they do on every such team: dispatch.cuh, PlanRowSumOp)
        staged = sm90 and elem == 2 and cluster > 1 and n % vec == 0
        want = (
            "next_row_loads"
            if piped
            else "next_row_staged"
            if staged
            else "next_row"
            if prefetch and sm90
            else None
        )
        assert plan.prefetch == want, (n, plan.raw)
        # two sums of whole 16-bit rows of 512 x 4 packs: the sums in registers (plan.h,
        # SliceSumsInRegisters)
        held = (
            OPS[op_id].name == "layer_norm"
            and elem == 2
            and cluster == 1
            and (plan.threads, plan.packs) == (512, 4)
            and n % vec == 0
        )
        assert plan.sums == ("registers" if held else None), (n, plan.raw)
        x = randn((rows + 17, n), dtype, "cuda")
        case, inp, outs, dys, fused = _check_fused_param_grads(
            op_id, x, params="once", chunk_rows=64 // elem
        )
        _check_dx_as_two_pass(
            op_id, case, inp, outs, dys, fused, (slice(0, 3), slice(rows + 10, rows + 17))
        )


@pytest.mark.gpu_heavy
@pytest.mark.cuda
@needs_clusters
def test_slice_param_grads_longer_chunks():
    """The slice sums' chunks are 2-8x as long where that takes no more waves of the teams the
    device holds at once and keeps 15/16 of them busy (plan.h, SliceChunkMultiple: fewer
    partials to write and add). 16-bit layer_norm rows of 256 threads x 4 packs (32-row
    chunks): rows of 2 / 4 chunks per team take 2x / 4x chunks, one chunk more takes the
    32-row chunks (2x would add a wave); on the 2x chunks the gradients match the reference,
    are bit-identical run to run, and dx is the two-pass path's."""
    import rownorm

    op_id, n, dtype = "layer_norm_affine", 6656, torch.bfloat16
    base = 64 // dtype.itemsize

    def plan(rows):
        probe = torch.empty((rows, n), dtype=dtype, device="cuda")
        return rownorm.explain(probe, "layer_norm", backward=True, param_grads=True)

    teams = plan(1 << 16).teams
    assert teams, plan(1 << 16).raw
    for rows, multiple in (
        (2 * teams * base, 2),
        (4 * teams * base, 4),
        ((2 * teams + 1) * base, 1),
    ):
        p = plan(rows)
        assert (p.params, p.threads, p.packs, p.teams) == ("once", 256, 4, teams), p.raw
        assert p.chunk_rows == multiple * base, (rows, p.raw)
        assert p.chunks == -(-rows // p.chunk_rows), (rows, p.raw)
    rows = 2 * teams * base
    x = randn((rows, n), dtype, "cuda")
    case, inp, outs, dys, fused = _check_fused_param_grads(op_id, x, chunk_rows=2 * base)
    _check_dx_as_two_pass(op_id, case, inp, outs, dys, fused, (slice(0, 3), slice(rows - 5, rows)))


@pytest.mark.gpu_heavy
@pytest.mark.cuda
@needs_clusters
@pytest.mark.parametrize("op_id", PHASED_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_phased_slice_param_grads(op_id, dtype):
    """Rows that do not start 16-byte aligned (odd N) but start alike in x, dy and dx run the
    slice sums too, in pack-width classes of rows of one alignment (plan.h, PhasedSlicePlan):
    on the 16-bit 512 x 4 CTA (and layer_norm's 256 x 4), the wide CTA or 2-CTA clusters, and
    4- and 8-pack clusters. With
    a last block of rows whose classes are partly empty (their chunks write zeros): the
    gradients match the reference and are bit-identical run to run, and a row's dx is the same
    bits as on the two-pass path. A dy out of phase with x (one element in) takes the two-pass
    path: its gradients match too (at the first length: each check holds a float64 reference of
    some 40 M elements)."""
    import rownorm

    elem = torch.empty((), dtype=dtype).element_size()
    vec = 16 // elem
    chunk_rows = 64 // elem
    block = vec * chunk_rows  # rows of one chunk of each class
    lengths = [4096 * 10 + vec - 1]
    if op_id != "rms_norm_offset":  # the offset is read alike at every length: one suffices
        lengths.append(512 * 6 * vec - 1)
        if elem == 2:
            lengths.append(512 * 3 * vec - 3)
    if elem == 2 and OPS[op_id].name == "layer_norm":  # 256 x 4 packs (plan.h, SliceSums256x4)
        lengths.append(256 * 4 * vec - 5)
    want = frozenset(OPS[op_id].params)
    for n in lengths:
        # about the fewest blocks whose chunks keep the device busy
        rows, _ = _fewest_fused_rows(OPS[op_id].name, n, dtype, block, lambda r: r + block)
        rows += block + 3  # the last block's classes 3..vec-1 hold no row
        x = randn((rows, n), dtype, "cuda")
        case, inp, outs, dys, fused = _check_fused_param_grads(
            op_id, x, params="once", chunk_rows=chunk_rows, row_classes=vec
        )
        assert rownorm.explain(x, OPS[op_id].name, backward=True, param_grads=True).chunks == (
            vec * -(-rows // block)
        )
        # rows that keep their alignment: the first three, the last block's three
        _check_dx_as_two_pass(
            op_id, case, inp, outs, dys, fused, (slice(0, 3), slice(rows - 3, rows))
        )
        del fused
        if n == lengths[0]:
            shifted = torch.empty(rows * n + 1, dtype=dtype, device="cuda")[1:].view(rows, n)
            shifted.copy_(dys[0])
            dys_out = (shifted, *dys[1:])
            got = case.raw_backward(dys_out, inp, -1, outs, want)
            check_grads(case, inp, -1, dys_out, got, what=f"N={n}, dy out of phase")
        del case, inp, outs, dys, x
        torch.cuda.empty_cache()  # the next length's float64 reference needs the room


@pytest.mark.gpu_heavy
@cuda_only
@pytest.mark.parametrize("op_id", PHASED_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_phased_cta_param_grads(op_id, dtype):
    """Rows in phase of the CTA tier's lengths (odd N past the groups, up to 512 threads x 4
    packs) sum their columns in registers, in pack-width classes of rows of one alignment
    (plan.h, PhasedSumPlan): one sum on 16-row CTAs (unclustered), two (layer_norm) on the
    staged 64-row chunks (but 16-bit layer_norm rows of 256 x 4 packs, which run the slice sums:
    test_phased_slice_param_grads). Every configuration the plan has for these lengths, with n
    at several offsets from a pack and a last block whose classes are partly empty (their chunks
    write zeros): the gradients match the reference and are bit-identical run to run. fp32
    layer_norm at 513 runs 564 chunks: where its staged kernel holds four CTAs of 128 per SM on
    132 SMs, a persistent CTA runs chunks of two classes and refills its parameters (where it
    holds five, one chunk each: NOTES.md §45 has where that path was checked)."""
    import rownorm

    name = OPS[op_id].name
    elem = torch.empty((), dtype=dtype).element_size()
    vec = 16 // elem
    two = name == "layer_norm"
    # 2-pack rows of 128 and 256 threads; then 512 x 2 (two sums, or three row inputs) or
    # 256 x 4 (rms_norm); fp32: 512 x 4
    lengths = [128 * vec + 1, 512 * vec - 3]
    if not (two and elem == 2):
        lengths.append(1024 * vec - vec + 1)
    if elem == 4:
        lengths.append(2048 * vec - 1)
    chunk_rows = 64 if two else 16
    block = vec * chunk_rows
    seen = set()
    for n in lengths:
        rows = 2 * block + 3  # the last block's classes 3..vec-1 hold no row
        if two and elem == 4 and n == 128 * vec + 1:
            rows = 140 * block + 3
        x = randn((rows, n), dtype, "cuda")
        plan = rownorm.explain(x, name, backward=True, param_grads=True)
        _check_fused_param_grads(
            op_id, x, tier="cta", chunk_rows=chunk_rows, row_classes=vec, cluster=None
        )
        assert plan.chunks == vec * -(-rows // block), (n, plan.raw)
        assert plan.stages == (2 if two else None), (n, plan.raw)
        seen.add((plan.threads, plan.packs))
        del x
        torch.cuda.empty_cache()
    want = {(128, 2), (256, 2)}
    if two and elem == 2:
        pass  # its rows of 256 x 4: the slice sums
    elif two or name == "add_rms_norm":
        want.add((512, 2))
    else:
        want.add((256, 4))
    if elem == 4:
        want.add((512, 4))
    assert seen == want, (want, seen)


@pytest.mark.gpu_heavy
@cuda_only
@pytest.mark.parametrize("op_id", ["rms_norm_weight", "layer_norm_affine", "add_rms_norm_weight"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_filled_cta_param_grads(op_id, dtype):
    """Rows past 256 threads x 2 packs that 320 or 384 threads x 2 packs hold (16-bit
    4097-6144, fp32 2049-3072) run the 2-pack CTA of the fewer of those threads that holds the
    row (plan.h, PlanFusedSums), aligned (one sum in clusters of four, two staged) and in
    phase (unclustered; not layer_norm's 16-bit rows), at both ends of each size and just past
    384; not add_rms_norm's 16-bit rows (512 threads). layer_norm's 16-bit CTAs of these run
    held to two per SM. The gradients match the reference and are bit-identical run to run."""
    import rownorm

    name = OPS[op_id].name
    elem = torch.empty((), dtype=dtype).element_size()
    vec = 16 // elem
    two = name == "layer_norm"
    fills = name != "add_rms_norm" or elem == 4
    lengths = {  # n: the threads planned (None: neither 320 nor 384)
        256 * 2 * vec + vec: 320,
        320 * 2 * vec: 320,
        320 * 2 * vec - 1: 320,
        320 * 2 * vec + vec: 384,
        384 * 2 * vec: 384,
        384 * 2 * vec - 3: 384,
        384 * 2 * vec + vec: None,
    }
    for n, threads in lengths.items():
        whole = n % vec == 0
        rows = 3 * 64 + 37 if whole else 2 * vec * (64 if two else 16) + 3
        x = randn((rows, n), dtype, "cuda")
        plan = rownorm.explain(x, name, backward=True, param_grads=True)
        if threads is None or not fills or (two and elem == 2 and not whole):
            # (16-bit layer_norm rows in phase: the slice sums, plan.h's SliceSums256x4; these
            # rows, too few for them, the two-pass path: test_phased_slice_param_grads)
            assert plan.threads not in (320, 384), (n, plan.raw)
            continue
        classes = None if whole else vec
        fields = {"tier": "cta", "threads": threads, "packs": 2, "row_classes": classes}
        if two:
            fields.update(stages=2, chunk_rows=64, cluster=None)
        elif whole:
            fields.update(cluster=4, chunk_rows=64)
        else:
            fields.update(cluster=None, chunk_rows=16)
        held = elem == 2 or threads == 384 or not whole
        if two and held and torch.cuda.get_device_capability()[0] == 9:
            # the registers ptxas gave sm_90: held to two CTAs per SM (dispatch.cuh's
            # StagedHeldCtas; rows of 384 in phase within the frame the launcher allows); aligned
            # fp32 rows of 320 hold two plain, so the plan is the plain one
            assert plan.ctas_per_sm == 2, plan.raw
        elif not two or not held:
            assert plan.ctas_per_sm is None, plan.raw
        _check_fused_param_grads(op_id, x, **fields)
        del x
        torch.cuda.empty_cache()


@cuda_only
@pytest.mark.parametrize("op_id", PHASED_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_phased_group_param_grads(op_id, dtype, monkeypatch):
    """Rows in phase of the group tier's lengths (odd N of up to 32 lanes x 4 packs: 1024
    16-bit / 512 fp32 elements) sum their columns in registers too: a CTA's groups run one
    chunk of rows of one class (plan.h, PhasedSumPlan) and add their packs' sums and their
    head and tail scalars' in group order. Groups of 8, 16 and 32 lanes, 16-bit rows shorter
    than a pack (every element a head or tail scalar), n at several offsets from a pack, and a
    last block whose classes are partly empty (their chunks write zeros): the gradients match
    the reference and are bit-identical run to run, and dx is the same bits as on the two-pass
    path (ROWNORM_PARAM_GRADS=two-pass). fp32 rows of up to 64 in phase, which the table puts
    on 4-lane groups, stay two-pass: fused on 4 lanes they took 1.14-1.24x its time (H100), and
    on 8 lanes dx would depend on whether dweight is asked for (aligned ones fuse on 4 lanes:
    test_param_grads_not_requested)."""
    import rownorm

    name = OPS[op_id].name
    elem = torch.empty((), dtype=dtype).element_size()
    vec = 16 // elem
    if elem == 4:
        for n in (vec + 1, 61):
            x = torch.empty((1 << 14, n), dtype=dtype, device="cuda")
            plan = rownorm.explain(x, name, backward=True, param_grads=True)
            assert plan.param_grads == "two-pass" and plan.lanes_per_row == 4, (n, plan.raw)
    # (n, lanes): the longest rows of 8-, 16- and 32-lane groups, n at several offsets from a
    # pack; 16-bit rows shorter than a pack and a pack and one; fp32 rows just past 4 lanes
    lengths = [(8 * 4 * vec - 1, 8), (16 * 4 * vec - 3, 16), (32 * 4 * vec - vec + 1, 32)]
    lengths += [(vec - 1, 8), (vec + 1, 8)] if elem == 2 else [(4 * 4 * vec + 3, 8)]
    seen = set()
    for n, lanes in lengths:
        chunk_rows = 128 // lanes * 16  # a CTA's groups' 16 rows each (plan.h's kFusedGroupRows)
        block = vec * chunk_rows
        rows = 2 * block + 3  # the last block's classes 3..vec-1 hold no row
        x = randn((rows, n), dtype, "cuda")
        case, inp, outs, dys, fused = _check_fused_param_grads(
            op_id, x, tier="group", chunk_rows=chunk_rows, row_classes=vec, lanes_per_row=lanes
        )
        plan = rownorm.explain(x, name, backward=True, param_grads=True)
        assert plan.chunks == vec * -(-rows // block), (n, plan.raw)
        seen.add(lanes)
        monkeypatch.setenv("ROWNORM_PARAM_GRADS", "two-pass")
        two = case.raw_backward(dys, inp, -1, outs, frozenset(OPS[op_id].params))
        monkeypatch.delenv("ROWNORM_PARAM_GRADS")
        assert torch.equal(two["x"], fused["x"]), f"N={n}: dx differs from the two-pass path"
        del case, inp, outs, dys, fused, two, x
        torch.cuda.empty_cache()
    assert seen == {8, 16, 32}, seen


@cuda_only
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
def test_param_grads_two_pass_knob(name, monkeypatch):
    """ROWNORM_PARAM_GRADS=two-pass (plan.h, ParamGradsTwoPass) takes the two-pass path where
    the plan fuses, on aligned rows and rows in phase alike, and the gradients match the
    reference; another value is ignored, with a line on stderr (a fresh process: it is said
    once)."""
    import rownorm

    op_id = "rms_norm_weight" if name == "rms_norm" else "layer_norm_affine"
    op = OPS[op_id]
    for n in (2048, 2047):
        x = randn((515, n), torch.bfloat16, "cuda")
        assert rownorm.explain(x, name, backward=True, param_grads=True).param_grads == "fused"
        monkeypatch.setenv("ROWNORM_PARAM_GRADS", "two-pass")
        plan = rownorm.explain(x, name, backward=True, param_grads=True)
        assert plan.param_grads == "two-pass", plan.raw
        inp = op.inputs(x, -1)
        case = raw_case(op, x)
        outs = case.raw(inp, -1)
        dys = random_grads(outs)
        got = case.raw_backward(dys, inp, -1, outs, frozenset(op.params))
        check_grads(case, inp, -1, dys, got, what=f"N={n}, two-pass")
        monkeypatch.delenv("ROWNORM_PARAM_GRADS")
    code = (
        "import torch, rownorm; x = torch.empty(515, 2048, device='cuda'); "
        f"print(rownorm.explain(x, {name!r}, backward=True, param_grads=True).param_grads)"
    )
    env = dict(os.environ, ROWNORM_PARAM_GRADS="fused")
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "fused", run.stdout
    assert "ROWNORM_PARAM_GRADS=fused is not two-pass" in run.stderr, run.stderr


@pytest.mark.parametrize("op_id", families())
def test_forward_backward_batch_invariant(device, op_id):
    """A row's output and dx are bit-identical whatever the batch it is computed in.

    The guarantee holds for rows that keep their 16-byte alignment: with N a multiple of the
    pack width every row of a contiguous tensor starts aligned. A row of odd N moved to
    another alignment may take another vector width and round differently in the last bit
    (README, Limitations)."""
    op = OPS[op_id]
    for n in (32, 1024, 4096):
        inp = op.inputs(randn((37, n), torch.float32, device), -1)
        case = raw_case(op, inp["x"])
        outs = case.raw(inp, -1)
        dys = random_grads(outs)
        got = case.raw_backward(dys, inp, -1, outs, frozenset())
        for sl in (slice(0, 1), slice(5, 6), slice(3, 20), slice(36, 37)):
            sub = {k: (v[sl] if k in ROW_INPUTS else v) for k, v in inp.items()}
            sub_outs = case.raw(sub, -1)
            for o, so in zip(outs, sub_outs, strict=True):
                assert torch.equal(o[sl], so), f"N={n} rows {sl}: output depends on the batch"
            sub_got = case.raw_backward(tuple(d[sl] for d in dys), sub, -1, sub_outs, frozenset())
            assert torch.equal(got["x"][sl], sub_got["x"]), f"N={n} rows {sl}: dx differs"


@pytest.mark.parametrize("op_id", PARAM_OPS)
def test_param_grads_not_requested(device, op_id):
    """weight_grad / bias_grad False: shape (0,) in the accumulator dtype; dx unchanged, to the
    bit: on CUDA the rows with and without parameter gradients run groups of the same lanes
    (fp32 rows of up to 64 on 4 lanes, aligned (32, 64) and in phase (33))."""
    op = OPS[op_id]
    for case_name, n in (("last_3d", 33), ("middle", 33), ("last_3d", 32), ("last_3d", 64)):
        x, dim = DIM_CASES[case_name](n, torch.float32, device)
        if not op.supports(x, dim):
            continue
        inp = op.inputs(x, dim)
        case = raw_case(op, x)
        outs = case.raw(inp, dim)
        dys = random_grads(outs)
        full = case.raw_backward(dys, inp, dim, outs, frozenset(op.params))
        none = case.raw_backward(dys, inp, dim, outs, frozenset(), every=True)
        for name in op.params:
            assert full[name].shape == (x.shape[dim],)
            assert none[name].shape == (0,)
            assert none[name].dtype == param_grad_dtype(inp) == full[name].dtype
            assert none[name].device == x.device
        assert torch.equal(none["x"], full["x"]), "dx depends on whether dweight was asked for"
        if len(op.params) > 1:  # one of several
            for want in op.params:
                one = case.raw_backward(dys, inp, dim, outs, frozenset({want}), every=True)
                for name in op.params:
                    assert one[name].shape == ((x.shape[dim],) if name == want else (0,))
                assert torch.equal(one[want], full[want])


class OpLog(TorchDispatchMode):
    """Records the rownorm ops dispatched (with their arguments) while active."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "rownorm":
            self.calls.append((func.overloadpacket.__name__, args))
        return func(*args, **(kwargs or {}))


def _frozen_cases() -> list:
    """(op id, frozen inputs): each parameter alone, every input but x, and x with the first
    parameter, for every op case with parameters."""
    cases = []
    for op_id in PARAM_OPS:
        names = OPS[op_id].input_names
        sets = [(p,) for p in OPS[op_id].params] + [("x",), names[1:]]
        if len(names) > 2:
            sets.append(("x", names[1]))
        cases += [pytest.param(op_id, s, id=f"{op_id}-{'+'.join(s)}") for s in dict.fromkeys(sets)]
    return cases


@pytest.mark.parametrize(("op_id", "frozen"), _frozen_cases())
def test_needs_input_grad(device, op_id, frozen):
    """A frozen input gets no gradient, the others the right one, and the backward op is not
    asked for the gradient of a frozen parameter (weight_grad / bias_grad False)."""
    op = OPS[op_id]
    for dtype in (torch.float32, torch.bfloat16):
        inp = op.inputs(randn((11, 129), dtype, device), -1)
        leaves = {k: v.detach().requires_grad_(k not in frozen) for k, v in inp.items()}
        with OpLog() as log:
            outs = op.call(leaves, -1)
            dys = random_grads(outs)
            torch.autograd.backward(outs, dys)
        for k, leaf in leaves.items():
            if k in frozen:
                assert leaf.grad is None, f"frozen {k} got a gradient"
        got = {k: leaf.grad for k, leaf in leaves.items() if k not in frozen}
        assert all(g is not None for g in got.values()), got.keys()
        check_grads(raw_case(op, inp["x"]), inp, -1, dys, got, what=f"frozen {frozen}")
        backward = op.backward_op_for(inp)._schema.name.removeprefix("rownorm::")
        (args,) = [a for name, a in log.calls if name == backward]
        flags = [a for a in args if isinstance(a, bool)][-len(op.params) :]
        for name, flag in zip(op.params, flags, strict=True):
            assert flag is (name not in frozen), f"{name}_grad={flag} with {frozen} frozen"


@pytest.mark.parametrize("op_id", [k for k, op in OPS.items() if op.n_outputs > 1])
def test_one_output_used(device, op_id):
    """Only the first output, only the second, or both reach the loss: the gradients are those
    of what was used (add_rms_norm: out and r = x + residual)."""
    op = OPS[op_id]
    for dtype in (torch.float32, torch.bfloat16):
        for used in ((0,), (1,), (0, 1)):
            inp = op.inputs(randn((9, 257), dtype, device), -1)
            leaves = {k: v.detach().requires_grad_(True) for k, v in inp.items()}
            outs = op.call(leaves, -1)
            dys = tuple(randn(o.shape, o.dtype, device) if i in used else None
                        for i, o in enumerate(outs))  # fmt: skip
            sum((o * g).sum() for o, g in zip(outs, dys, strict=True) if g is not None).backward()
            got = {k: leaf.grad for k, leaf in leaves.items()}
            if used == (1,) and "weight" in leaves:
                # The weight does not reach r: no gradient (None) or a zero one.
                assert got["weight"] is None or torch.count_nonzero(got["weight"]) == 0
                del got["weight"]
            # (x's gradient is the residual's in x's dtype: the float32 residual stream)
            assert torch.equal(got["x"], got["residual"].to(got["x"].dtype))
            check_grads(raw_case(op, inp["x"]), inp, -1, dys, got, what=f"used={used}")
            # The backward op: an absent second gradient counts as zeros.
            case = raw_case(op, inp["x"])
            detached = tuple(o.detach() for o in outs)
            if used == (0,):
                zeros = (dys[0], torch.zeros_like(outs[1]))
                a = case.raw_backward(dys, inp, -1, detached, frozenset(op.params))
                b = case.raw_backward(zeros, inp, -1, detached, frozenset(op.params))
                assert torch.equal(a["x"], b["x"])


# ---------------------------------------------------------------------------------------------
# gradcheck (float64), second order


def _gradcheck_cases() -> list:
    """Every op case with the reduced dim last, in the middle and first (where the op allows);
    layer_norm with one parameter; the normalizations with rows on both sides of a clamping
    eps."""
    cases = []
    for op_id, op in OPS.items():
        wheres = [("rows", (4, 9), -1)]
        if not op.last_dim_only:
            wheres += [("middle", (2, 5, 3), 1), ("dim0", (7, 3), 0)]
        cases += [pytest.param(op_id, {}, s, d, id=f"{op_id}-{w}") for w, s, d in wheres]
        if len(op.params) > 1:
            cases += [pytest.param(op_id, {"params": (p,)}, (3, 6, 4), 1, id=f"{op_id}-{p}-only")
                      for p in op.params]  # fmt: skip
        if op.name in ("l2_normalize", "l1_normalize"):
            cases.append(pytest.param(op_id, {"eps": 1.0}, (4, 6), -1, id=f"{op_id}-clamped"))
    return cases


def _gradcheck_inputs(op, shape, dim, device):
    x = randn(shape, torch.float64, device)
    if op.name in ("l2_normalize", "l1_normalize") and op.eps > 0.1:
        # Alternate rows at 0.2·eps and 3·eps: far from the clamp's kink.
        moved = x.movedim(dim, -1)
        if op.name == "l2_normalize":
            s = torch.linalg.vector_norm(moved, dim=-1, keepdim=True)
        else:
            s = moved.abs().sum(-1, keepdim=True) / (moved.shape[-1] if op.mean else 1)
        scale = torch.tensor([0.2, 3.0], dtype=torch.float64, device=device).repeat(8)
        x = (moved / s * op.eps * scale[: moved.shape[0], None]).movedim(-1, dim).contiguous()
    return op.inputs(x, dim)


@pytest.mark.parametrize(("op_id", "overrides", "shape", "dim"), _gradcheck_cases())
def test_gradcheck(device, op_id, overrides, shape, dim):
    op = dataclasses.replace(OPS[op_id], **overrides)
    inp = _gradcheck_inputs(op, shape, dim, device)
    names = op.grad_inputs(inp)

    def fn(*tensors):
        return op.call(dict(zip(names, tensors, strict=True)), dim)

    # fast_mode: the Jacobian checked along random directions, not column by column
    args = tuple(inp[k].detach().requires_grad_(True) for k in names)
    assert torch.autograd.gradcheck(fn, args, fast_mode=True)
    # Transposed storage (same values): the made-contiguous route, differentiated.
    if len(shape) == 2 and dim == -1:
        args = tuple(a.detach().t().contiguous().t().requires_grad_(True) if a.dim() == 2
                     else a for a in args)  # fmt: skip
        assert not args[0].is_contiguous()
        assert torch.autograd.gradcheck(fn, args, fast_mode=True)


@pytest.mark.parametrize("op_id", [k for k, op in families().items() if op.name != "l2_normalize"])
def test_double_backward_raises(device, op_id):
    """Second-order gradients are not supported (l2_normalize excepted): differentiating the
    backward raises a clear error instead of silently returning a wrong second-order term."""
    op = OPS[op_id]
    inp = op.inputs(randn((3, 8), torch.float64, device), -1)
    leaves = {k: v.detach().requires_grad_(True) for k, v in inp.items()}
    outs = op.call(leaves, -1)
    grads = torch.autograd.grad(outs, list(leaves.values()), random_grads(outs), create_graph=True)
    with pytest.raises((RuntimeError, NotImplementedError), match="double backward"):
        torch.autograd.grad(sum(g.square().sum() for g in grads), leaves["x"])


def test_layer_norm_backward_takes_stats_of_any_layout(device):
    """layer_norm_backward reads the forward's (mean, rstd) in the layout the forward made
    (pairs adjacent, rows in order); stats of the same values in another layout (a contiguous
    copy, as a DTensor gather makes) give the same gradients, bit for bit."""
    x = randn((4, 5, 6), torch.float32, device)
    dy = randn((4, 5, 6), torch.float32, device)
    w = randn((5,), torch.float32, device)
    y, stats = torch.ops.rownorm.layer_norm_with_stats(x, w, None, 1, 1e-5)
    assert stats.shape == (4, 2, 6) and stats.stride(1) == 1
    moved = stats.contiguous()
    assert moved.stride() != stats.stride()
    want = torch.ops.rownorm.layer_norm_backward(dy, x, stats, w, 1, True, True)
    got = torch.ops.rownorm.layer_norm_backward(dy, x, moved, w, 1, True, True)
    for g, h in zip(got, want, strict=True):
        assert torch.equal(g, h)
