"""Full-size workloads (``-m large``, CUDA only): the seed workload and tensors of > 2^31 elements.

* The seed workload of DESIGN §2: ``x / torch.norm(x, p=2, dim=1, keepdim=True)`` on a
  32768 × 65535 float32 tensor (8 GiB) equals ``rownorm.l2_normalize(x, dim=1, eps=0)``,
  checked chunk by chunk (1024 rows) against the float64 reference and the seed expression.
* More than 2^31 elements on the row tiers (scalar streaming and vectorized) and on the
  strided-dim path, forward and backward: catches 32-bit index arithmetic. Rows are
  independent, so a sample of rows (the first, random ones and the last, where 32-bit
  offsets would wrap) is compared with the reference; the whole output is checked for NaN.

Each test skips when the GPU has too little free memory, and frees what it used.
"""

from __future__ import annotations

import gc

import pytest
import torch
from utils import (
    HAS_CUDA,
    assert_grad_matches,
    assert_matches,
    assert_unit_rows,
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


def _sample(count: int, gen: torch.Generator) -> torch.Tensor:
    picks = torch.randint(0, count, (10,), generator=gen)
    edges = torch.tensor([0, 1, 2, count - 3, count - 2, count - 1])
    return torch.unique(torch.cat([edges, picks])).cuda()


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
