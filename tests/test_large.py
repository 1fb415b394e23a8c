"""Full-size workloads (``-m large``, CUDA only): the seed workload and tensors of > 2^31 elements.

* The seed workload of DESIGN §2: ``x / torch.norm(x, p=2, dim=1, keepdim=True)`` on a
  32768 × 65535 float32 tensor (8 GiB) equals ``rownorm.l2_normalize(x, dim=1, eps=0)``,
  checked chunk by chunk (1024 rows) against the float64 reference and the seed expression.
* More than 2^31 elements on the row tiers (scalar streaming and vectorized) and on the
  strided-dim path, forward and backward: catches 32-bit index arithmetic. Rows are
  independent, so a sample of rows (the first, random ones and the last, where 32-bit
  offsets would wrap) is compared with the reference; the whole output is checked for NaN.

* More than 2^31 rows (of 2 fp16 elements: 8 GiB a tensor), forward and backward of rms_norm
  with its weight gradient (a column sum over every row): catches a 32-bit row index or row
  count, in the launch grids and in the parameter-gradient chunks.

* The op set: seed 003 (``x / torch.mean(torch.abs(x), dim=1, keepdim=True)``, 32768 × 65535
  fp32) and seed 001 (``x / sqrt(mean(x², dim=1) + 1e-5)`` over the channels of a
  112 × 64 × 512 × 512 fp32 tensor) in chunks; rms_norm (with its weight gradient, checked
  against a chunked float64 sum) and softmax on > 2^31 elements, rows and strided dim.

Each test skips when the GPU has too little free memory, and frees what it used.

Why the grid is what it is: one id per workload (each takes tens of GB and seconds of GPU
time); 32-bit index arithmetic is per path (row tiers, strided dim), not per op.
"""

from __future__ import annotations

import dataclasses
import gc
import math

import pytest
import rownorm
import torch
from utils import (
    HAS_CUDA,
    OPS,
    ROW_INPUTS,
    assert_grad_matches,
    assert_matches,
    assert_unit_rows,
    check_grads,
    free_bytes,
    gib,
    l2,
    l2_backward,
    poison_allocator,
    reference_forward,
)

pytestmark = [
    pytest.mark.large,
    pytest.mark.cuda,
    pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device"),
]


@pytest.fixture(autouse=True)
def _free_memory():
    gc.collect()
    torch.cuda.empty_cache()
    yield
    gc.collect()
    torch.cuda.empty_cache()


def _need(nbytes: int) -> None:
    free = free_bytes("cuda")
    if free < nbytes:
        pytest.skip(f"needs {gib(nbytes)} of free GPU memory, {gib(free)} free")


def test_seed_workload_full_size():
    rows, n, chunk = 32768, 65535, 1024
    numel = rows * n
    _need(2 * numel * 4 + 6 * chunk * n * 8)
    x = torch.randn((rows, n), device="cuda")
    out = l2(x, 1, 0.0)
    torch.cuda.synchronize()
    assert out.is_contiguous() and out.shape == x.shape
    for start in range(0, rows, chunk):
        xc = x[start : start + chunk]
        oc = out[start : start + chunk]
        assert_matches(oc, reference_forward(xc, 1, 0.0), what=f"rows {start}..")
        seed = xc / torch.norm(xc, p=2, dim=1, keepdim=True)
        torch.testing.assert_close(oc, seed, rtol=1e-5, atol=1e-5 * seed.abs().max().item())
        assert_unit_rows(oc, 1)


# (shape, dim, dtype): > 2^31 elements each; 2^31 = 2147483648.
HUGE = {
    "rows_odd_n_streaming": ((2**16 + 1, 2**15 + 3), -1, torch.float16),
    "rows_vectorized_cta": ((2**18 + 1, 8192), -1, torch.bfloat16),
    "rows_cluster": ((2**14 + 1, 2**17), -1, torch.float16),
    "strided_dim": ((16, 2**27 + 1), 0, torch.float16),
}


def _sample(count: int, gen: torch.Generator, device="cuda") -> torch.Tensor:
    """Rows to compare: the first and last, random ones, and those around 2^31 where there
    are more (where a 32-bit row index wraps)."""
    picks = torch.randint(0, count, (10,), generator=gen)
    edges = [0, 1, 2, count - 3, count - 2, count - 1]
    if count > 2**31 + 1:
        edges += [2**31 - 2, 2**31 - 1, 2**31, 2**31 + 1]
    return torch.unique(torch.cat([torch.tensor(edges), picks])).to(device)


@pytest.mark.parametrize("case", HUGE)
def test_more_than_2_31_elements(case):
    shape, dim, dtype = HUGE[case]
    numel = shape[0] * shape[1]
    assert numel > 2**31
    nbytes = numel * torch.tensor([], dtype=dtype).element_size()
    _need(3 * nbytes + 2**31)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape, device="cuda", dtype=dtype)
    other = 1 - dim % 2  # the dim that indexes the rows
    idx = _sample(shape[other], gen)

    poison_allocator(shape, dtype, "cuda")
    y = l2(x, dim)
    torch.cuda.synchronize()
    assert not torch.isnan(y).any(), "unwritten (NaN-poisoned) or NaN output elements"
    xs, ys = x.index_select(other, idx), y.index_select(other, idx)
    assert_matches(ys, reference_forward(xs, dim, 1e-12), what="forward sample")
    assert_unit_rows(ys, dim)
    del y, ys
    torch.cuda.empty_cache()

    dy = torch.randn(shape, device="cuda", dtype=dtype)
    dx = l2_backward(dy, x, dim)
    torch.cuda.synchronize()
    assert not torch.isnan(dx).any()
    dys, dxs = dy.index_select(other, idx), dx.index_select(other, idx)
    assert_grad_matches(dxs, dys, xs, dim, 1e-12, what="backward sample")


# ---------------------------------------------------------------------------------------------
# The op set at full size: the seed workloads 003 (mean-abs normalize) and 001 (channel
# RMSNorm), and tensors of > 2^31 elements for rms_norm (with its weight gradient) and softmax.


def test_seed_003_mean_abs_full_size():
    """Seed 003: ``x / torch.mean(torch.abs(x), dim=1, keepdim=True)`` on 32768 × 65535 fp32."""
    rows, n, chunk = 32768, 65535, 1024
    _need(2 * rows * n * 4 + 6 * chunk * n * 8)
    x = torch.randn((rows, n), device="cuda")
    poison_allocator(x.shape, x.dtype, "cuda")
    out = rownorm.l1_normalize(x, dim=1, eps=0.0, mean=True)
    torch.cuda.synchronize()
    assert out.is_contiguous() and out.shape == x.shape
    for start in range(0, rows, chunk):
        xc, oc = x[start : start + chunk], out[start : start + chunk]
        assert_matches(oc, rownorm.reference.l1_normalize(xc, 1, 0.0, True), what=f"rows {start}..")
        seed = xc / torch.mean(torch.abs(xc), dim=1, keepdim=True)
        torch.testing.assert_close(oc, seed, rtol=1e-5, atol=1e-5 * seed.abs().max().item())


def test_seed_001_channel_rms_norm_full_size():
    """Seed 001: ``x / sqrt(mean(x², dim=1) + 1e-5)`` over the 64 channels of a
    112 × 64 × 512 × 512 fp32 tensor (the strided-dim path), checked two images at a time."""
    shape, eps, chunk = (112, 64, 512, 512), 1e-5, 2
    numel = math.prod(shape)
    _need(2 * numel * 4 + 8 * chunk * numel // shape[0] * 8)
    x = torch.randn(shape, device="cuda")
    poison_allocator(x.shape, x.dtype, "cuda")
    out = rownorm.rms_norm(x, dim=1, eps=eps)
    torch.cuda.synchronize()
    assert out.is_contiguous() and out.shape == x.shape
    for start in range(0, shape[0], chunk):
        xc, oc = x[start : start + chunk], out[start : start + chunk]
        assert_matches(oc, rownorm.reference.rms_norm(xc, None, 1, eps), what=f"images {start}..")
        seed = xc / torch.sqrt(torch.mean(xc**2, dim=1, keepdim=True) + eps)
        torch.testing.assert_close(oc, seed, rtol=1e-5, atol=1e-5 * seed.abs().max().item())


# (op case, shape, dim, dtype, parameter dtype): > 2^31 elements each.
HUGE_OPS = {
    "rms_norm_rows": ("rms_norm_weight", (2**16 + 1, 2**15 + 3), -1, torch.float16, torch.float32),
    "rms_norm_strided_dim": ("rms_norm_weight", (16, 2**27 + 1), 0, torch.bfloat16, None),
    "softmax_rows": ("softmax", (2**16 + 1, 2**15 + 3), -1, torch.bfloat16, None),
    "softmax_strided_dim": ("softmax", (16, 2**27 + 1), 0, torch.float16, None),
}


def _chunked_weight_grad(x, dy, dim: int, eps: float, other: int):
    """Σ_rows dy⊙ŷ and Σ_rows |dy⊙ŷ| of rms_norm in float64, ~2^22 elements at a time."""
    chunk = max(1, 2**22 // x.shape[dim])
    total = magnitude = 0
    for start in range(0, x.shape[other], chunk):
        xc = x.narrow(other, start, min(chunk, x.shape[other] - start)).double()
        dyc = dy.narrow(other, start, xc.shape[other]).double()
        terms = dyc * xc * torch.rsqrt((xc * xc).mean(dim, keepdim=True) + eps)
        total = total + terms.sum(other)
        magnitude = magnitude + terms.abs().sum(other)
    return total, magnitude


def check_op_at_size(op_id, shape, dim, dtype, param_dtype, device) -> None:
    """Forward and backward of one op on a big 2-D tensor: the whole output is written (no
    NaN after poisoning), sampled rows (first, last, random) match the reference, and a
    parameter gradient matches a chunked float64 sum over every row."""
    op = OPS[op_id]
    gen = torch.Generator().manual_seed(1)
    inp = op.inputs(torch.randn(shape, device=device, dtype=dtype), dim, param_dtype=param_dtype)
    op = dataclasses.replace(op, eps=op.resolved_eps(inp["x"]))
    other = 1 - dim % 2  # the dim that indexes the rows
    idx = _sample(shape[other], gen, device)

    def sample(t):
        return t.index_select(other, idx)

    sub = {k: (sample(v) if k in ROW_INPUTS else v) for k, v in inp.items()}
    poison_allocator(shape, dtype, device)
    outs = op.raw(inp, dim)
    assert not torch.isnan(outs[0]).any(), "unwritten (NaN-poisoned) or NaN output elements"
    for o, ref in zip(outs, op.reference(sub, dim), strict=True):
        assert_matches(sample(o), ref, dim=dim, what="forward sample")

    dys = tuple(torch.randn(shape, device=device, dtype=dtype) for _ in outs)
    got = op.raw_backward(dys, inp, dim, outs, frozenset(op.params))
    assert not torch.isnan(got["x"]).any()
    sub_dys = tuple(sample(d) for d in dys)
    check_grads(op, sub, dim, sub_dys, {"x": sample(got["x"])}, what="backward sample")
    if "weight" in got:
        expected, magnitude = _chunked_weight_grad(inp["x"], dys[0], dim, op.eps, other)
        dw = got["weight"]
        assert_matches(dw, expected.to(dw.dtype), magnitude=magnitude, what="dweight")


@pytest.mark.parametrize("case", HUGE_OPS)
def test_ops_more_than_2_31_elements(case):
    op_id, shape, dim, dtype, param_dtype = HUGE_OPS[case]
    numel = math.prod(shape)
    assert numel > 2**31
    nbytes = numel * torch.tensor([], dtype=dtype).element_size()
    _need(5 * nbytes + 2**31)
    check_op_at_size(op_id, shape, dim, dtype, param_dtype, "cuda")


def test_more_than_2_31_rows():
    """(2^31 + 7, 2) fp16 with a float32 weight: rms_norm forward and backward, dweight over
    all the rows. Peak: x, y, dy, dx (8 GiB each) and the backward's per-row statistics
    (2 float32 per row: 16 GiB)."""
    shape = (2**31 + 7, 2)
    nbytes = shape[0] * shape[1] * 2
    _need(6 * nbytes + 2**32)
    check_op_at_size("rms_norm_weight", shape, -1, torch.float16, torch.float32, "cuda")
