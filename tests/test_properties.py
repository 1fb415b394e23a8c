"""Property tests (hypothesis): random op cases, dtypes, shapes, reduced dims, layouts and
values against the float64 reference, forward and backward.

Why the grid is what it is: the curated grids elsewhere test each code path once; these
properties cross the axes at random instead of in full (which is what made the old grid
large) and shrink a failure to a minimal shape. Shapes have rank 1-4 with sizes 0-6 outside
the reduced dim; the reduced length is short, or (CUDA) a tier edge of the dtype's element
size from the tier-table mirror. Layouts: contiguous, a misaligned start (storage offset),
sliced rows (a row stride), a permuted storage order, a step along an outer dim, and stride-0
(expanded) dims, the reduced one included. Values: normal, scaled by 1e-3 .. 1e3, zero rows,
constant rows, and NaN entries (forward: NaN exactly where the reference has it).

Values also include ±inf entries and magnitudes from 1e-30 to 1e15 (fp16: 1e-2 to 1e4), all
inside the float32 accumulator's range (test_extremal covers the ranges past it).

The CUDA fuzz net (test_cuda_matches_cpu_and_torch): each example runs on CUDA, forward and
backward (every input's gradient), and is compared with the CPU op and torch on the same
samples (special values exactly, finite values within the dtype's tolerance) and with the
float64 reference. It is sharded over FUZZ_SHARDS test ids so that pytest-xdist spreads it;
each shard reports its example count, and the session prints the total
(``rownorm fuzz: N CUDA cases ...``, tests/conftest.py).

Profiles (``ROWNORM_HYPOTHESIS_PROFILE``, tests/conftest.py): ``ci`` (default) runs a few
dozen derandomized examples per test (per shard); ``gpu`` runs 2,000 per test, which is
52,000 CUDA cases in the fuzz net's 26 shards.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from rownorm.testing.checks import assert_same_specials, check_grads, noisy_grads, torch_grads
from rownorm.testing.tiers import tier_edge_lengths
from utils import (
    DTYPES,
    OPS,
    ROW_INPUTS,
    TOL,
    assert_matches,
    autograd_grads,
    check_backward,
    check_outputs,
    randn,
    raw_case,
)

pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")

LAYOUT_KINDS = ("contiguous", "offset", "sliced", "permuted", "step", "expanded")
VALUE_KINDS = ("normal", "scaled", "tiny", "huge", "zero_rows", "constant_rows", "nan", "inf")
SPECIAL_KINDS = ("nan", "inf")  # compared by where NaN and ±inf are, and finite values
MAX_ELEMS = {"cpu": 1 << 15, "cuda": 1 << 21, "fuzz": 1 << 17}
# Magnitudes of the "tiny" and "huge" values, per element size: far inside the float32
# accumulator (x² and its sums stay finite and normal, or vanish next to eps), and for fp16
# far from overflowing dx = dy / ‖x‖.
TINY = {2: 1e-2, 4: 1e-30, 8: 1e-30}
HUGE = {2: 1e4, 4: 1e15, 8: 1e15}
FUZZ_SHARDS = 26


@st.composite
def problems(draw, device: str, max_elems: int | None = None):
    """(op, inputs, dim, description, value kind) of a random problem on ``device``."""
    max_elems = max_elems or MAX_ELEMS[device]
    op = draw(st.sampled_from(list(OPS.values())))
    dtype = draw(st.sampled_from(DTYPES))
    rank = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(0, 6), min_size=rank, max_size=rank))
    dim = rank - 1 if op.last_dim_only else draw(st.integers(-rank, rank - 1))
    lengths = st.integers(1, 80)
    if device == "cuda":
        edges = tier_edge_lengths(torch.empty((), dtype=dtype).element_size())
        lengths = lengths | st.sampled_from(edges)
    shape[dim] = draw(lengths)
    others = math.prod(s for i, s in enumerate(shape) if i != dim % rank)
    while others * shape[dim] > max_elems and others > 1:  # bounded memory and time
        i = max((i for i in range(rank) if i != dim % rank), key=lambda i: shape[i])
        shape[i] = max(1, shape[i] // 2)
        others = math.prod(s for i, s in enumerate(shape) if i != dim % rank)
    layout = draw(st.sampled_from(LAYOUT_KINDS))
    values = draw(st.sampled_from(VALUE_KINDS))
    with_params = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    torch.manual_seed(seed)
    make = _layout(draw, layout, shape, dim, rank)
    x = _values(draw, values, make(dtype, device), dim)
    res = _values(draw, "normal", make(dtype, device), dim) if op.residual else None
    inp = op.inputs(x, dim, residual=res)
    if not with_params:
        inp = {k: v for k, v in inp.items() if k in op.row_inputs}
        op = op.without_params()
    desc = f"{op.id} {dtype} {tuple(shape)} dim={dim} {layout} {values} params={with_params}"
    return op, inp, dim, desc, values


def _layout(draw, kind: str, shape: list[int], dim: int, rank: int):
    """A builder (dtype, device) -> tensor of ``shape`` in the layout ``kind``."""
    shape = tuple(shape)
    if kind == "offset":  # a storage offset: rows not 16-byte aligned
        k = draw(st.integers(1, 7))
        n = math.prod(shape)
        return lambda dt, dev: randn((n + k,), dt, dev)[k:].view(shape)
    if kind == "sliced":  # padded last dim, sliced: a row stride, maybe a start offset
        pad = draw(st.integers(1, 9))
        start = draw(st.integers(0, pad))
        big = (*shape[:-1], shape[-1] + pad)
        return lambda dt, dev: randn(big, dt, dev)[..., start : start + shape[-1]]
    if kind == "permuted":  # stored in another dim order
        perm = draw(st.permutations(range(rank)))
        inv = [perm.index(i) for i in range(rank)]
        stored = tuple(shape[p] for p in perm)
        return lambda dt, dev: randn(stored, dt, dev).permute(*inv)
    if kind == "step":  # every other element along a dim
        i = draw(st.integers(0, rank - 1))
        big = tuple(s * 2 if j == i else s for j, s in enumerate(shape))
        index = tuple(slice(None, None, 2) if j == i else slice(None) for j in range(rank))
        return lambda dt, dev: randn(big, dt, dev)[index]
    if kind == "expanded":  # stride 0 along one dim (the reduced one, possibly)
        i = draw(st.integers(0, rank - 1))
        small = tuple(1 if j == i else s for j, s in enumerate(shape))
        return lambda dt, dev: randn(small, dt, dev).expand(shape)
    return lambda dt, dev: randn(shape, dt, dev)


def _values(draw, kind: str, x: torch.Tensor, dim: int) -> torch.Tensor:
    if x.numel() == 0 or kind == "normal":
        return x
    if kind == "scaled":
        return (x.double() * 10.0 ** draw(st.integers(-3, 3))).to(x.dtype)
    if kind in ("tiny", "huge"):
        scale = (TINY if kind == "tiny" else HUGE)[x.element_size()]
        return (x.double() * scale).to(x.dtype)
    x = x.clone()  # (a writable copy of expanded layouts keeps their strides only if dense)
    moved = x.movedim(dim, -1)
    row = draw(st.integers(0, max(0, moved.numel() // moved.shape[-1] - 1)))
    flat_index = torch.unravel_index(torch.tensor(row), moved.shape[:-1]) if moved.dim() > 1 else ()
    target = moved[tuple(int(i) for i in flat_index)]
    if kind == "zero_rows":
        target.zero_()
    elif kind == "constant_rows":
        target.fill_(draw(st.sampled_from([0.5, -2.0, 0.1, 12345.678])))
    elif kind == "nan":
        target[draw(st.integers(0, target.numel() - 1))] = float("nan")
    elif kind == "inf":
        for _ in range(draw(st.integers(1, 2))):
            sign = draw(st.sampled_from([1.0, -1.0]))
            target[draw(st.integers(0, target.numel() - 1))] = sign * float("inf")
    return x


def _check(op, inp, dim, desc, values, device):
    x = inp["x"]
    if x.numel() == 0:
        outs = op.call(inp, dim)
        assert all(o.shape == x.shape for o in outs), desc
        return
    outs = op.call(inp, dim)
    refs = op.reference(inp, dim)
    if values in SPECIAL_KINDS:  # NaN and ±inf where the reference has them, the rest as usual
        for o, r in zip(outs, refs, strict=True):
            assert_matches(o, r, dim=dim, what=desc)
        return
    check_outputs(op, inp, dim, outs, what=desc, vs_torch=False)
    check_backward(raw_case(op, x), inp, dim, what=desc)  # (but checks.noisy_grads)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_matches_reference(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")

    @given(problems(device))
    def run(problem):
        op, inp, dim, desc, values = problem
        _check(op, inp, dim, desc, values, device)

    run()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, NaN equal to NaN (a row with ±inf has NaN outputs of its own)."""
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(
        a.nan_to_num(), b.nan_to_num()
    )


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_rows_are_independent(device):
    """Changing one row (to NaN) changes no other row's output or dx, bit for bit: a row's
    result does not depend on its neighbours' values."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")

    @given(problems(device))
    def run(problem):
        op, inp, dim, desc, _ = problem
        # Contiguous copies: the original and the changed input then share their layout and
        # alignment (a row moved to another alignment may round differently in the last bit).
        inp = {k: v.contiguous() for k, v in inp.items()}
        x = inp["x"]
        if x.numel() == 0 or x.numel() == x.shape[dim]:
            return
        case = raw_case(op, x)
        outs = case.raw(inp, dim)
        dys = tuple(torch.ones_like(o) for o in outs)
        got = case.raw_backward(dys, inp, dim, outs)
        bad = {**inp, "x": x.clone()}
        moved = bad["x"].movedim(dim, -1)
        moved[(0,) * (moved.dim() - 1)] = float("nan")
        bad_outs = case.raw(bad, dim)
        bad_got = case.raw_backward(dys, bad, dim, bad_outs)
        keep = ~torch.isnan(moved).any(-1)
        for a, b in ((o, bo) for o, bo in zip(outs, bad_outs, strict=True)):
            a_rows, b_rows = a.movedim(dim, -1)[keep], b.movedim(dim, -1)[keep]
            assert _same(a_rows, b_rows), f"{desc}: another row's output changed"
        dx, bad_dx = got["x"].movedim(dim, -1)[keep], bad_got["x"].movedim(dim, -1)[keep]
        assert _same(dx, bad_dx), f"{desc}: another row's dx changed"

    run()


# ---- the CUDA fuzz net -------------------------------------------------------------------------


def _fuzz_case(op, inp, dim, desc, values) -> None:
    """One CUDA example against the CPU op and torch on the same samples and the reference.

    rownorm and torch run on the example's device; the rest (the CPU op, the float64
    references, every comparison) on host copies of their results. On the GPU the comparisons'
    small kernels and synchronizations, shared by every worker, bounded the net at ~75 cases/s
    with 4 workers as with 15 (benchmarks/results/h100/NOTES.md §16); on the host they spread
    over the workers."""
    x = inp["x"]
    outs, dys, grads = autograd_grads(op, inp, dim)
    if x.numel() == 0:
        assert all(o.shape == x.shape for o in outs), desc
        return
    t_outs, t_grads = torch_grads(op, inp, dim, dys)

    def host(t):
        return None if t is None else t.cpu()

    inp = {k: host(v) for k, v in inp.items()}
    outs, dys, t_outs = (tuple(host(t) for t in ts) for ts in (outs, dys, t_outs))
    grads, t_grads = ({k: host(g) for k, g in gs.items()} for gs in (grads, t_grads))
    c_outs, _, c_grads = autograd_grads(op, inp, dim, dys)
    loose = {k: dataclasses.replace(t, relerr=max(t.relerr, t.rtol), atol=2 * t.atol)
             for k, t in TOL.items()}  # fmt: skip
    refs = op.reference(inp, dim)
    mags = [op.output_magnitude(inp, dim, refs[0])] + [None] * (len(outs) - 1)
    for i, (o, c, t) in enumerate(zip(outs, c_outs, t_outs, strict=True)):
        assert_same_specials(o, c, f"{desc} output {i} vs cpu")
        assert_same_specials(o, t, f"{desc} output {i} vs torch")
        for other, name in ((c, "cpu"), (t, "torch")):
            assert_matches(o, other, magnitude=mags[i], dim=dim, tol=loose[o.dtype],
                           what=f"{desc} output {i} vs {name}")  # fmt: skip
    for k, g in grads.items():
        assert_same_specials(g, c_grads[k], f"{desc} d{k} vs cpu")
        if k in ROW_INPUTS or values not in SPECIAL_KINDS:
            assert_same_specials(g, t_grads[k], f"{desc} d{k} vs torch")
    if values in SPECIAL_KINDS:  # finite values: against the reference, as _check does
        for o, r in zip(outs, refs, strict=True):
            assert_matches(o, r, dim=dim, what=desc)
        return
    check_outputs(op, inp, dim, outs, what=desc, vs_torch=False)
    skip = noisy_grads(op, inp, dim)
    compared = {k: v for k, v in grads.items() if k not in skip}
    check_grads(op, inp, dim, dys, compared, what=desc + " autograd")
    for k, g in compared.items():  # the CPU op's gradients are the reference's too
        mag = op.grad_magnitudes(dys, inp, dim)[k]
        assert_matches(g, c_grads[k], magnitude=mag, dim=dim if k in ROW_INPUTS
                       else None, what=f"{desc} d{k} vs cpu", tol=loose[g.dtype])  # fmt: skip


@pytest.mark.cuda
@pytest.mark.parametrize("shard", range(FUZZ_SHARDS))
def test_cuda_matches_cpu_and_torch(shard, record_property):
    """The fuzz net: random problems (every op case, dtype, rank 1-4, dim, layout: storage
    offsets, row strides, permutations, steps, stride 0; values with NaN, ±inf, zero and
    constant rows, 1e-30 .. 1e15) on CUDA, forward and backward, against the CPU op and torch
    on the same samples and the float64 reference. ``fuzz_cases`` (the examples run) is summed
    over the shards into the session's last lines."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    count = 0

    @given(problems("cuda", MAX_ELEMS["fuzz"]))
    def run(problem):
        nonlocal count
        count += 1
        op, inp, dim, desc, values = problem
        case = raw_case(op, inp["x"])
        _fuzz_case(case, inp, dim, f"shard {shard}: {desc}", values)

    try:
        run()
    finally:
        record_property("fuzz_cases", count)
