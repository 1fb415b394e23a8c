"""Shared helpers of the rownorm tests: devices, ids, poisoned allocations, re-exported checks.

The op table, its samples, tolerances and comparisons live in the shipped package
(:mod:`rownorm.testing`), where ``python -m rownorm`` uses them too; this module adds what only
the tests need.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import rownorm
import torch
from rownorm.testing import DTYPE_IDS, DTYPES, OPS, TOL, OpInfo, families
from rownorm.testing.checks import (
    assert_matches,
    assert_new_contiguous,
    assert_row_stat,
    autograd_grads,
    check_backward,
    check_forward,
    check_grads,
    check_outputs,
    random_grads,
)
from rownorm.testing.opinfo import ROW_INPUTS
from rownorm.testing.samples import (
    DIM_CASES,
    EMPTY_CASES,
    GRAD_LAYOUTS,
    LAYOUTS,
    gpu_rows,
    randn,
    rows_of,
    scaled_rows,
    with_zero_rows,
)

__all__ = [
    "DIM_CASES", "DTYPES", "EMPTY_CASES", "GRAD_LAYOUTS", "LAYOUTS", "OPS", "ROW_INPUTS", "TOL",
    "OpInfo",
    "assert_matches", "assert_new_contiguous", "assert_row_stat", "autograd_grads",
    "check_backward", "check_forward", "check_grads", "check_outputs", "families", "gpu_rows",
    "random_grads", "randn", "rows_of", "scaled_rows", "with_zero_rows",
]  # fmt: skip

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


def cuda_only(obj):
    """Marks a test (or a parameter) `cuda` and skips it where no GPU is present."""
    return pytest.mark.cuda(requires_cuda(obj))


def dram_gbps_per_sm() -> float:
    """The current GPU's peak DRAM bandwidth per SM in GB/s, as the planner reads it (two
    transfers per memory clock over the bus width): where per-GPU rules of the plan switch
    (the cluster tier's kept parameters, the slice sums' prefetch of full rows, the strided
    prefetch of 4-byte tiles). 0 where torch does not report them."""
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return 2 * p.memory_clock_rate * 1e3 * (p.memory_bus_width // 8) / p.multi_processor_count / 1e9


def strided_keeps_inputs_in_l2(plan, dtype: torch.dtype) -> bool:
    """Whether a strided plan's staged kernel copies its inputs under L2's evict_last (plan.h,
    StridedKeepsInputsInL2): staged tiles of the warp layouts or of 4-byte elements, on a GPU
    whose planner keeps inputs in L2 (KeepsRowInputInL2: ROWNORM_L2_KEEP where set, 0 off and
    any other value on, else at least 30 GB/s of DRAM bandwidth per SM)."""
    forced = os.environ.get("ROWNORM_L2_KEEP", "")
    device_keeps = forced != "0" if forced else dram_gbps_per_sm() >= 30
    return bool(plan.stages) and bool(plan.warp_rows or dtype.itemsize == 4) and device_keeps


def slice_chunk_rows(rows: int, chunk_rows: int, teams: int) -> int:
    """The slice sums' chunk length for `rows` aligned rows on `teams` teams (plan.h,
    SliceChunkMultiple): chunk_rows times the largest of 2, 4, 8 whose chunks take no more
    waves of the teams and keep 15/16 of them busy in every wave, else chunk_rows."""

    def waves(chunks: int) -> int:
        return -(-chunks // teams)

    base = waves(-(-rows // chunk_rows))
    multiple = 1
    for k in (2, 4, 8):
        chunks = -(-rows // (k * chunk_rows))
        if k * waves(chunks) <= base and 16 * chunks >= 15 * waves(chunks) * teams:
            multiple = k
    return multiple * chunk_rows


def dtype_id(dtype: torch.dtype) -> str:
    return DTYPE_IDS[dtype]


def op_params(ops) -> list:
    """pytest params of op ids (the id is the op case's id)."""
    return [pytest.param(op_id, id=op_id) for op_id in ops]


def raw_case(op: OpInfo, x: torch.Tensor) -> OpInfo:
    """The op with eps resolved (the backward ops take a plain float), so that the raw backward
    and its reference use the same eps."""
    return dataclasses.replace(op, eps=op.resolved_eps(x)) if op.has_eps else op


def param_grad_dtype(inp: dict) -> torch.dtype:
    """The dtype of the raw backward ops' parameter gradients for the inputs ``op.inputs``
    makes (parameters of x's dtype): x's, written by the kernels' finalize (on the float32
    residual stream too: its parameters run as x's would). (Mixed parameter dtypes:
    test_correctness.test_layer_norm_mixed_param_dtypes.)"""
    return inp["x"].dtype


def poison_blocks(blocks, device) -> set[int]:
    """Leaves freed NaN-filled blocks, one per ``(shape, dtype)`` of ``blocks``, in the
    allocator; returns their addresses.

    The ops allocate their outputs themselves, so unwritten output elements are caught by
    handing the allocator NaN-filled blocks of exactly the outputs' sizes just before the op
    runs: CUDA's caching allocator gives the next request of that size the same block (the
    tests check the address). On the CPU this is best effort.
    """
    held = [torch.full(tuple(shape), float("nan"), dtype=dt, device=device) for shape, dt in blocks]
    ptrs = {t.data_ptr() for t in held}
    del held
    return ptrs


def poison_allocator(shape, dtype: torch.dtype, device) -> int:
    """:func:`poison_blocks` for one block."""
    (ptr,) = poison_blocks([(shape, dtype)], device)
    return ptr


def clamped_rows(rows: int, n: int, dtype: torch.dtype, device, eps: float) -> torch.Tensor:
    """Rows whose L2 norms lie well below, well above, and at zero relative to ``eps``.

    Norms are kept at least a factor 2 away from eps so the clamp's kink is never crossed by
    rounding or by gradcheck's finite differences.
    """
    x = randn((rows, n), torch.float64, "cpu")
    x = x / torch.linalg.vector_norm(x, dim=1, keepdim=True)
    scales = torch.tensor([0.1, 0.45, 3.0, 20.0], dtype=torch.float64).repeat(rows)[:rows]
    x = x * (scales * eps).unsqueeze(1)
    x[rows // 2] = 0
    return x.to(device=device, dtype=dtype)


def free_bytes(device) -> int:
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return free


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


# ---- l2_normalize's own helpers -------------------------------------------------------------

# Odd and boundary row lengths, on every device.
ROW_LENGTHS = (1, 7, 31, 32, 33, 255, 1000, 1024, 1025, 4097, 65535, 65537)
# The tier edges of both element sizes (tests/test_tier_edges.py derives its own from the tier
# table mirror, rownorm.testing.tiers).
GPU_TIER_LENGTHS = (
    64, 128, 136, 256, 512, 513, 520, 1024, 1032, 2048, 2056, 4096, 8192, 8193, 8200,
    16384, 16385, 16392, 32768, 32776, 65536, 65544, 131072, 131073, 131080,
    262144, 262145, 262152, 1048576,
)  # fmt: skip


def row_count(n: int) -> int:
    """Rows for a row length: many short rows, few long ones (bounded CPU time)."""
    return 67 if n <= 64 else 19 if n <= 1100 else 7 if n <= 5000 else 3


def l2(x: torch.Tensor, dim: int = -1, eps: float = 1e-12) -> torch.Tensor:
    return torch.ops.rownorm.l2_normalize(x, dim, eps)


def l2_backward(grad: torch.Tensor, x: torch.Tensor, dim: int = -1, eps: float = 1e-12):
    return torch.ops.rownorm.l2_normalize_backward(grad, x, dim, eps)


def reference_forward(x: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    return rownorm.reference.l2_normalize(x, dim, eps)


def reference_backward(grad: torch.Tensor, x: torch.Tensor, dim: int, eps: float):
    return rownorm.reference.l2_normalize_backward(grad, x, dim, eps)


def grad_magnitude(dy: torch.Tensor, x: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    """|dy| / max(‖x‖, eps): the size of the terms the L2 backward is computed from."""
    norm = torch.linalg.vector_norm(x.detach().double(), dim=dim, keepdim=True)
    return dy.detach().double().abs() / norm.clamp_min(eps)


def assert_grad_matches(dx, dy, x, dim: int, eps: float, *, what: str = "") -> None:
    """dx equals the reference gradient, errors measured against dy / ‖x‖ row by row."""
    ref = reference_backward(dy, x, dim, eps)
    assert_matches(dx, ref, magnitude=grad_magnitude(dy, x, dim, eps), dim=dim, what=what)


def assert_unit_rows(out: torch.Tensor, dim: int, *, skip_zero_of: torch.Tensor | None = None):
    """Every row of ``out`` along ``dim`` has L2 norm 1 (rows of x that are all zero excepted)."""
    norms = torch.linalg.vector_norm(out.detach().double(), dim=dim)
    if skip_zero_of is not None:
        norms = norms[torch.linalg.vector_norm(skip_zero_of.detach().double(), dim=dim) > 0]
    if norms.numel() == 0:
        return
    worst = (norms - 1).abs().max().item()
    assert worst <= TOL[out.dtype].unit, f"a row has norm off 1 by {worst:.3e}"


def run_logged(
    code: str, *args: str, unset: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Runs ``code`` (after ``import rownorm, torch``) in a new interpreter with the plan log on
    (ROWNORM_LOG_PLAN), ``args`` as its ``sys.argv[1:]``, the environment variables ``unset``
    removed and those of ``env`` set; the plan lines are on its stderr."""
    env = {k: v for k, v in os.environ.items() if k not in unset} | (env or {})
    env["ROWNORM_LOG_PLAN"] = "1"
    return subprocess.run(
        [sys.executable, "-c", f"import rownorm, torch\n{code}", *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
