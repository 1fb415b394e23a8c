"""Extreme values for every op case of the op table, forward and backward, in fp32 / fp16 /
bf16 / fp64: against the float64 reference, against torch on the same device and, on CUDA,
against the CPU op on the same samples.

The contract (README, "Extreme values"): rownorm evaluates each op's formula (written in its
kernel header and docstring) with the statistics in its accumulator, float64 on the CPU for
every dtype, float32 on CUDA for fp32 / fp16 / bf16 and float64 for fp64, and rounds the
result once. For one op and one accumulator, each row of a sample is in one of four classes
(decided from the data in float64, by :func:`row_classes`):

* special: the row holds NaN or ±inf. NaN and ±inf are exactly where torch has them, forward
  and backward (a NaN in a row makes the whole row NaN); finite values match the reference.
* in range: every sum of the op stays well inside the accumulator's range: zero rows, constant
  rows of many magnitudes, tiny and subnormal rows, the largest fp16 values and, on the CPU,
  the huge rows of fp32 / bf16. Outputs and gradients match the float64 reference within the
  dtype's tolerance, and torch where torch's own accumulator (float32 for 16/32-bit x, float64
  for fp64) keeps the row in range too.
* overflow: a sum certainly overflows the accumulator: Σx² (l2, rms_norm, add_rms_norm: an
  element above ~1.8e19 in float32), Σ|x| (l1), (x − μ)² (layer_norm). The result is then what
  the formula gives in IEEE arithmetic: outputs 0 (x · 0), layer_norm's the bias (rstd = 0),
  every dx 0 (add_rms_norm: the gradient of its second output) and dweight 0. On CUDA that is
  torch's forward too (its float32 statistics overflow alike). The CPU never overflows on
  fp32 / bf16 / fp16 x: there the same rows are in range and give the right result where torch's
  float32 arithmetic gives 0 or NaN (a documented difference: the README's "Extreme values").
* underflow (l2, rms_norm, add_rms_norm): Σx² below the accumulator's smallest normal number,
  which then holds too few bits for the tolerances (fp32 x of 1e-21 on CUDA); outputs and dx
  must be finite.
* layer_norm sum overflow (test_layer_norm_sum_overflow): constant rows whose Σx overflows;
  the shifted mean gives the bias.

A row between classes, whose result would depend on a reduction's order, is "ambiguous": the
samples have none, which test_extremal_rows_are_decided checks on the CPU for every length
and accumulator the CUDA run uses too.

test_correctness's softmax special values and test_l2_normalize's special rows check the same
for those ops on hand-picked rows (with the conventions at eps's kink); this file is the
general net: every op case, every kind of extreme, each device's accumulator.

Why the grid is what it is: one id per (op case, dtype, device), every kind of extreme row
(rownorm.testing.samples.extremal_rows) in one sample per row length: 1, 7 and 33 (the CPU runs
one row loop for every length); on CUDA also one length per tier (CTA, cluster, streaming)
and the strided-dim path, short (registers) and long (streamed).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import pytest
import torch
from rownorm.testing.checks import assert_same_specials, noisy_grads, torch_grads
from rownorm.testing.opinfo import Tol, along
from rownorm.testing.samples import extremal_rows
from utils import (
    DTYPES,
    OPS,
    ROW_INPUTS,
    TOL,
    assert_matches,
    autograd_grads,
    check_grads,
    check_outputs,
    dtype_id,
    raw_case,
)

pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")


def accumulator(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """rownorm's accumulator: float64 on the CPU; on CUDA float32 (float64 for fp64 x)."""
    return torch.float64 if device_type == "cpu" or dtype == torch.float64 else torch.float32


def torch_accumulator(dtype: torch.dtype) -> torch.dtype:
    """The accumulator of torch's own kernels (and of the float32 copies 16-bit x is compared
    on), on both devices."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---- samples ---------------------------------------------------------------------------------


# Long rows (CUDA's cluster tier) take one row of each kind of value, not every magnitude.
LONG_ROW_KINDS = ("normal", "nan", "+inf and -inf", "all -inf", "zero", "tiny", "huge", "one huge")


@functools.lru_cache(maxsize=2)
def _rows(n: int, dtype: torch.dtype):
    """(names, x, x as float64, residual, weight, bias, output gradients): everything a sample
    of n takes, the same for every op (so that row_stats can be shared between ops)."""
    gen = torch.Generator().manual_seed(n)
    names, x = extremal_rows(n, dtype, gen)
    if n > 8192:
        keep = [i for i, m in enumerate(names)
                if m in LONG_ROW_KINDS or m.rsplit(" ", 1)[0] in LONG_ROW_KINDS]  # fmt: skip
        keep += [names.index(m) for m in names if m.startswith("constant")][-2:]  # 1e15, big
        names, x = [names[i] for i in keep], x[keep]
    x64 = x.double()
    res = (x64.flip(-1) / 8).to(dtype)
    weight = (1 + 0.1 * torch.randn(n, dtype=torch.float64, generator=gen)).to(dtype)
    bias = (0.1 * torch.randn(n, dtype=torch.float64, generator=gen)).to(dtype)
    top = torch.where(torch.isfinite(x64), x64, 0).abs().amax(-1, keepdim=True)
    scale = torch.where(top > 0, (1024 * top).clamp_max(1) / top.clamp_min(1), 1.0)
    dys = tuple(
        (torch.randn(x.shape, dtype=torch.float64, generator=gen) * scale).to(dtype)
        for _ in range(2)
    )
    return names, x, x64, res, weight, bias, dys


def sample(op, n: int, dtype: torch.dtype):
    """(row names, inputs, output gradients) of one row length, on the CPU, the same every run.

    The residual is x reversed and scaled by 1/8 (as extreme as x); weight 1 + 0.1·N(0, 1) and
    bias 0.1·N(0, 1) as in the op table. Gradients are random, scaled per row by 1/max|x| where
    the row is large (so Σ x·dy stays far inside the accumulator, as in training, where dy does
    not grow with x) and by 1024·max|x| where it is small (so an fp16 dx = dy/‖x‖ stays far
    from fp16's overflow)."""
    names, x, _, res, weight, bias, dys = _rows(n, dtype)
    inp = {"x": x} | ({"residual": res} if op.residual else {})
    inp |= {k: v for k, v in (("weight", weight), ("bias", bias)) if k in op.params}
    return names, inp, dys[: op.n_outputs]


class RowStats(NamedTuple):
    """Per row: what the classes are decided from (logarithms of sums of magnitudes; see
    row_classes). h is x (add_rms_norm: x + residual rounded to x's dtype); g = dy·w."""

    n: int
    finite: torch.Tensor
    same_sign: torch.Tensor
    log_h: torch.Tensor  # log max|h|
    log_abs: torch.Tensor  # log Σ|h|
    log_sq: torch.Tensor  # log Σh²
    log_hg: torch.Tensor  # log Σ|h·g|
    log_g_sum: torch.Tensor  # log Σ|g|
    log_d: torch.Tensor  # log max|d|, d = x − mean(x)
    log_d2: torch.Tensor  # log Σd²
    log_dg: torch.Tensor  # log Σ|d·g|


def row_stats(inp, dys) -> RowStats:
    """Sums bounded in float64 from their terms' magnitudes, rows scaled by their largest
    element (so that fp64 rows do not overflow float64 here)."""
    x = inp["x"].double()
    n = x.shape[-1]
    finite = torch.isfinite(x).all(-1)
    h = x
    if "residual" in inp:  # (x + residual rounded to x's dtype, as the kernel and torch have it)
        h = (inp["x"] + inp["residual"]).double()
        finite &= torch.isfinite(h).all(-1) & torch.isfinite(inp["residual"].double()).all(-1)
    w = inp["weight"].double() if "weight" in inp else 1.0

    def scaled(t: torch.Tensor):  # (t / max|t|, log max|t|) per row; non-finite rows as zeros
        t = torch.where(finite.unsqueeze(-1), t, 0.0)
        top = t.abs().amax(-1, keepdim=True)
        return t / torch.where(top > 0, top, 1.0), top.squeeze(-1).log()

    def log_sum(t: torch.Tensor, log_scale: torch.Tensor) -> torch.Tensor:  # log Σ|t|·scale
        return t.abs().sum(-1).log() + log_scale

    hs, log_h = scaled(h)
    gs, log_g = scaled(dys[0].double() * w)
    ds = hs - hs.mean(-1, keepdim=True)  # (layer_norm has no residual: h = x)
    return RowStats(
        n=n,
        finite=finite,
        same_sign=(x > 0).all(-1) | (x < 0).all(-1),
        log_h=log_h,
        log_abs=log_sum(hs, log_h),
        log_sq=log_sum(hs * hs, 2 * log_h),
        log_hg=log_sum(hs * gs, log_h + log_g),
        log_g_sum=log_sum(gs, log_g),
        log_d=ds.abs().amax(-1).log() + log_h,
        log_d2=log_sum(ds * ds, 2 * log_h),
        log_dg=log_sum(ds * gs, log_h + log_g),
    )


def row_classes(op, inp, dys, acc: torch.dtype, stats: RowStats | None = None) -> list[str]:
    """The class of every row of a (rows, n) sample for ``op`` with accumulator ``acc`` (see the
    module docstring): "special", "in range", "overflow", "sum overflow" (layer_norm's known
    bug) or "ambiguous".

    A sum is certainly finite, in any order, if Σ|terms| is below a quarter of the
    accumulator's largest value (room for the steps after it), and certainly infinite if one
    term is, or if its non-negative terms add up to over 1.05 times it.
    """
    st = row_stats(inp, dys) if stats is None else stats
    n = st.n
    info = torch.finfo(acc)
    log_max, unit = math.log(info.max), info.eps / 2
    inside = math.log(0.99 if n == 1 else 0.25) + log_max  # one term: no rounding to allow for
    over = math.log(1.05) + log_max
    rows = range(len(st.finite))
    if op.name in ("softmax", "log_softmax"):
        cls = ["in range" for _ in rows]  # m = max, Σ exp(x − m) <= n: nothing grows
    elif op.name in ("l2_normalize", "rms_norm", "add_rms_norm"):
        # Σh² below the smallest normal number holds fewer bits than the tolerance asks for
        # (fp32 x of 1e-21 on CUDA: x² is subnormal): "underflow", IEEE's result
        low = math.log(info.tiny)
        cls = [
            "underflow" if -math.inf < st.log_sq[i] < low
            else "in range" if st.log_sq[i] < inside and st.log_hg[i] < inside
            else "overflow" if 2 * st.log_h[i] > over and st.log_hg[i] < inside
            else "ambiguous"
            for i in rows
        ]  # fmt: skip
    elif op.name == "l1_normalize":
        cls = [
            "in range" if st.log_abs[i] < inside and st.log_hg[i] < inside
            else "overflow" if st.log_abs[i] > over and st.log_hg[i] < inside
            else "ambiguous"
            for i in rows
        ]  # fmt: skip
    else:  # layer_norm: μ₀ = Σx/n, then Σd², Σd, Σd·g, Σg with d = x − μ₀ (layer_norm.cuh)
        # |μ₀ − μ| and the mean correction Σd/n (the shift) are at most ~5n·u·max|x| (u: the
        # unit roundoff; both exact for one element)
        log_shift = st.log_h + math.log(5 * n * unit) if n > 1 else st.log_h - math.inf
        moments = torch.logaddexp(st.log_d2, math.log(n) + 2 * log_shift)
        sums_ok = (st.log_dg < inside) & (st.log_g_sum < inside)
        cls = []
        for i in rows:
            ratio = math.exp(min(0.0, log_shift[i] - st.log_d[i]))  # shift / max|d|
            if st.log_abs[i] > over and st.same_sign[i]:
                cls.append("sum overflow")
            elif st.log_abs[i] < inside and moments[i] < inside and sums_ok[i]:
                cls.append("in range")
            elif (
                st.log_abs[i] < inside
                and ratio < 0.5
                and 2 * (st.log_d[i] + math.log1p(-ratio)) > math.log(1.2) + log_max  # d² = inf
                and 2 * log_shift[i] < inside
                and sums_ok[i]
            ):
                cls.append("overflow")
            else:
                cls.append("ambiguous")
    return ["special" if not f else c for f, c in zip(st.finite.tolist(), cls, strict=True)]


def squares_inside(op, inp, acc: torch.dtype) -> torch.Tensor:
    """Rows whose Σx² (add_rms_norm: of x + residual) is far inside ``acc``'s range, and
    softmax's rows (nothing squared)."""
    h = (inp["x"] + inp["residual"]).double() if op.residual else inp["x"].double()
    if op.name in ("softmax", "log_softmax"):
        return torch.ones(len(h), dtype=torch.bool)
    log_sq = torch.logsumexp(2 * h.abs().log(), -1)
    return log_sq < math.log(0.25 * torch.finfo(acc).max)


def lengths(device_type: str, dtype: torch.dtype, op) -> list[tuple[str, int]]:
    """(where, n): rows of n elements ("rows") or a strided dim of n ("dim"). CUDA: the group
    tier (odd, and 1024: aligned), the CTA tier (aligned and odd), the cluster tier (the
    streaming tier where clusters are off: scripts/gpu_check.sh runs these tests so too), the
    streaming tier past the clusters' end for every op (2^20 bytes + one element: a thread's
    share of the row is 512 elements long), fp64's one streaming kernel (odd and aligned) and
    the strided-dim kernels (registers, streamed)."""
    if device_type == "cpu":
        return [("rows", 1), ("rows", 33)]
    short = [("rows", 1), ("rows", 7), ("rows", 33)]
    if dtype == torch.float64:
        long = [("rows", 1023), ("rows", 4096)]
    else:  # (1024 and 4096 with fused parameter gradients where the op has them)
        streamed = (1 << 20) // dtype.itemsize + 1
        long = [("rows", 1024), ("rows", 4096), ("rows", 4097), ("rows", 65537), ("rows", streamed)]
    strided = [] if op.last_dim_only else [("dim", 33), ("dim", 100)]
    return short + long + strided


def to_layout(t: torch.Tensor, where: str) -> torch.Tensor:
    """A (rows, n) tensor in the layout of ``where``: as is, or (1, n, rows) reduced over dim 1."""
    return t if where == "rows" else t.t().unsqueeze(0).contiguous()


def from_layout(t: torch.Tensor, where: str) -> torch.Tensor:
    return t if where == "rows" else t.squeeze(0).t().contiguous()


# ---- what is compared ------------------------------------------------------------------------


def run_rownorm(op, inp, dys, where: str, device):
    """Outputs and the gradients of every input (autograd), as (rows, n) tensors on ``device``."""
    dim = -1 if where == "rows" else 1
    placed = {k: (to_layout(v, where) if k in ROW_INPUTS else v).to(device) for k, v in inp.items()}
    placed_dys = tuple(to_layout(d, where).to(device) for d in dys)
    outs, _, grads = autograd_grads(op, placed, dim, placed_dys)
    outs = tuple(from_layout(o.detach(), where) for o in outs)
    grads = {k: (from_layout(g, where) if k in ROW_INPUTS else g) for k, g in grads.items()}
    return outs, grads


def loose(dtype: torch.dtype, n: int = 1):
    """The tolerance against another implementation's rounded result (torch's, or the other
    device's): the elementwise one, also as the bound on the relative error, and room for
    that implementation's own sums of n terms in float32 (torch's CPU sums of a constant
    fp32 row of 4096 are off by ~5e-5)."""
    tol = TOL[dtype]
    sums = 16 * math.sqrt(n) * torch.finfo(torch_accumulator(dtype)).eps / 2
    return Tol(rtol=max(tol.rtol, sums), atol=max(2 * tol.atol, sums),
               relerr=max(tol.relerr, tol.rtol, sums), unit=tol.unit)  # fmt: skip


def rows(t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return t[keep.to(t.device)]


def check_in_range(op, inp, dys, outs, grads, what: str) -> None:
    """Outputs and gradients match the float64 reference (layer_norm's dweight excepted where a
    row is constant: rounding noise, see checks.noisy_grads)."""
    check_outputs(op, inp, -1, outs, what=what, vs_torch=False, stat=False)
    skip = noisy_grads(op, inp, -1)
    compared = {k: v for k, v in grads.items() if k not in skip}
    check_grads(op, inp, -1, dys, compared, what=what)


def check_special(op, inp, dys, outs, grads, what: str) -> None:
    """NaN exactly where the reference has it, ±inf and finite values equal (forward); the
    gradients likewise, and their ±inf where the reference's are."""
    refs = op.reference(inp, -1)
    for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
        assert_same_specials(o, r, f"{what} output {i} vs reference")
        assert_matches(o, r.to(o.device), dim=-1, what=f"{what} output {i} vs reference")
    check_grads(op, inp, -1, dys, grads, what=what)
    want = op.reference_grads(dys, {k: v if k in ROW_INPUTS else v.double()
                                    for k, v in inp.items()}, -1)  # fmt: skip
    for k, g in grads.items():
        assert_same_specials(g, want[k], f"{what} d{k} vs reference")


def check_underflow(outs, grads, what: str) -> None:
    """Rows whose Σx² is subnormal in the accumulator: every output and dx finite (the row's
    norm is positive, if imprecise)."""
    for i, o in enumerate(outs):
        assert torch.isfinite(o).all(), f"{what} output {i}: not finite"
    for k, g in grads.items():
        if k in ROW_INPUTS:
            assert torch.isfinite(g).all(), f"{what} d{k}: not finite"


def check_overflow(op, inp, dys, outs, grads, what: str) -> None:
    """The formula in IEEE arithmetic once a sum is infinite: outputs 0 (layer_norm: the bias;
    add_rms_norm's second output x + residual), dx 0 (add_rms_norm: the gradient of its second
    output), dweight 0, dbias Σ dy."""
    x = inp["x"]
    y = outs[0]
    want = torch.zeros_like(y)
    if op.name == "layer_norm" and "bias" in inp:
        want = along(inp["bias"].to(y.dtype), y, -1).expand(y.shape).to(y.device)
    assert torch.equal(y, want), f"{what}: output is not {'the bias' if want.any() else 0}"
    if op.residual:
        h = (x + inp["residual"]).to(y.device)
        assert torch.equal(outs[1], h), f"{what}: output 1 is not x + residual"
    row_grad = dys[1].to(y.device) if op.residual else torch.zeros_like(y)
    for k in ROW_INPUTS:
        if k in grads:
            assert torch.equal(grads[k], row_grad), f"{what}: d{k} is not {row_grad.abs().max()}"
    if "weight" in grads:
        assert torch.count_nonzero(grads["weight"]) == 0, f"{what}: dweight is not 0"
    if "bias" in grads:
        db = dys[0].double().sum(0).to(grads["bias"].dtype)
        assert_matches(grads["bias"], db, magnitude=dys[0].double().abs().sum(0), what=what)


# ---- the tests ---------------------------------------------------------------------------------


def compare_with_torch(op, sub, sub_dys, keep, outs, grads, mags, cls, what) -> None:
    """rownorm's outputs against torch's on ``keep``'s rows (same device): values and special
    values; gradients' special values (overflowing rows: the forward only)."""
    dev = outs[0].device
    t_outs, t_grads = torch_grads(op, sub, -1, sub_dys, dev)
    n = sub["x"].shape[-1]
    for i, (o, t) in enumerate(zip(outs, t_outs, strict=True)):
        m = None if mags[i] is None else rows(mags[i], keep)
        o, t, what_i = rows(o, keep), rows(t, keep), f"{what} output {i} vs torch"
        assert_same_specials(o, t, what_i)
        assert_matches(o, t, magnitude=m, dim=-1, what=what_i, tol=loose(o.dtype, n))
    if cls == "overflow":
        return
    for k, g in grads.items():
        if k in ROW_INPUTS:
            assert_same_specials(rows(g, keep), rows(t_grads[k], keep), f"{what} d{k} vs torch")
        elif cls == "special" or keep.all():  # (a column sum over every row)
            assert_same_specials(g, t_grads[k], f"{what} d{k} vs torch")


def compare_with_cpu(op, sub, sub_dys, keep, where, outs, grads, mags, what) -> None:
    """CUDA's outputs and gradients against the CPU op's on the same samples, on ``keep``'s
    rows (those in the same class for both accumulators); the other rows (float32 overflow on
    CUDA) are right on the CPU: its outputs and dx match the float64 reference."""
    dev = outs[0].device
    c_outs, c_grads = run_rownorm(op, sub, sub_dys, where, "cpu")
    n = sub["x"].shape[-1]
    for i, (o, c) in enumerate(zip(outs, c_outs, strict=True)):
        m = None if mags[i] is None else rows(mags[i], keep)
        o, c, what_i = rows(o, keep), rows(c, keep).to(dev), f"{what} output {i} vs cpu"
        assert_same_specials(o, c, what_i)
        assert_matches(o, c, magnitude=m, dim=-1, what=what_i, tol=loose(o.dtype, n))
    for k, g in grads.items():
        if k in ROW_INPUTS:
            assert_same_specials(rows(g, keep), rows(c_grads[k], keep), f"{what} d{k} vs cpu")
    if not keep.all():
        other = ~keep
        inp = {k: (v[other] if k in ROW_INPUTS else v) for k, v in sub.items()}
        got = {k: v[other] for k, v in c_grads.items() if k in ROW_INPUTS}
        dys = tuple(d[other] for d in sub_dys)
        check_in_range(op, inp, dys, tuple(c[other] for c in c_outs), got, what + " on the cpu")


@pytest.mark.parametrize("op_id", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_extremal_values(device, op_id, dtype):
    dev = torch.device(device)
    acc = accumulator(dev.type, dtype)
    for where, n in lengths(dev.type, dtype, OPS[op_id]):
        names, inp, dys = sample(OPS[op_id], n, dtype)
        op = raw_case(OPS[op_id], inp["x"])
        stats = row_stats(inp, dys)
        classes = row_classes(op, inp, dys, acc, stats)
        torch_safe = squares_inside(op, inp, torch_accumulator(dtype))
        cpu_classes = row_classes(op, inp, dys, torch.float64, stats)
        bad = [m for m, c in zip(names, classes, strict=True) if c == "ambiguous"]
        assert not bad, f"{op} {dtype_id(dtype)} n={n}: ambiguous rows {bad}"
        for cls in ("special", "in range", "overflow", "underflow"):
            idx = [i for i, c in enumerate(classes) if c == cls]
            if not idx:
                continue
            what = f"{op} {dtype_id(dtype)} {where} n={n} {cls} rows"
            sel = torch.tensor(idx)
            sub = {k: (v[sel] if k in ROW_INPUTS else v) for k, v in inp.items()}
            sub_dys = tuple(d[sel] for d in dys)
            outs, grads = run_rownorm(op, sub, sub_dys, where, dev)
            placed = {k: v.to(dev) for k, v in sub.items()}
            placed_dys = tuple(d.to(dev) for d in sub_dys)
            if cls == "underflow":  # finite where the reference is; nothing else to hold it to
                check_underflow(outs, grads, what)
                continue
            check = {"special": check_special, "in range": check_in_range}.get(cls, check_overflow)
            check(op, placed, placed_dys, outs, grads, what)
            mags = [op.output_magnitude(placed, -1, op.reference(placed, -1)[0])]
            mags += [None] * (len(outs) - 1)
            # torch on the same device: special rows; rows whose squares its accumulator holds
            # (torch's CPU layer_norm sums x², and gives NaN past that); overflowing rows on
            # CUDA, whose accumulator is rownorm's, but not of one element (torch's CPU norm
            # of one element is |x|, unsquared)
            if cls == "overflow":
                keep = torch.full((len(idx),), dev.type == "cuda" and n > 1)
            else:
                keep = torch_safe[sel] | (cls == "special")
            if keep.any():
                compare_with_torch(op, sub, sub_dys, keep, outs, grads, mags, cls, what)
            if dev.type == "cuda":
                keep = torch.tensor([cpu_classes[i] == cls for i in idx])
                compare_with_cpu(op, sub, sub_dys, keep, where, outs, grads, mags, what)


def test_extremal_rows_are_decided():
    """Every sample of test_extremal_values, CUDA's lengths included, is in one class for every
    accumulator: none is ambiguous, and each class the samples mean to reach is reached."""
    ops = [op for op in OPS.values() if op.name not in ("softmax", "log_softmax")]
    # (nothing grows in softmax: every finite row is in range)
    todo = {}  # (dtype, n) -> {(op id, accumulator)}: samples of one length together
    for op in ops:
        for dtype in DTYPES:
            for device_type in ("cpu", "cuda"):
                accs = {accumulator(device_type, dtype), torch_accumulator(dtype)}
                for _, n in lengths(device_type, dtype, op):
                    todo.setdefault((dtype, n), set()).update((op.id, a) for a in accs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (small ops: a second thread only adds waits on a busy machine)
    try:
        seen = _decide(todo)
    finally:
        torch.set_num_threads(threads)
    float32 = (torch.float32, torch.bfloat16)
    for name in ("l2_normalize", "l1_normalize", "rms_norm", "add_rms_norm", "layer_norm"):
        for dtype in float32:
            assert (name, dtype, torch.float32, "overflow") in seen, (name, dtype)
            assert (name, dtype, torch.float64, "overflow") not in seen, (name, dtype)
        assert (name, torch.float64, torch.float64, "overflow") in seen, name
        assert (name, torch.float16, torch.float32, "overflow") not in seen, name
    assert ("layer_norm", torch.float32, torch.float32, "sum overflow") in seen


def _decide(todo) -> set:
    """Classifies every sample of ``todo`` ({(dtype, n): {(op id, accumulator)}}); asserts that
    none is ambiguous; returns the (op name, dtype, accumulator, class) seen."""
    seen = set()
    for (dtype, n), cases in todo.items():
        stats = {}  # by the inputs that matter: residual, weight (the values are shared)
        for op_id, acc in sorted(cases, key=str):
            op = OPS[op_id]
            names, inp, dys = sample(op, n, dtype)
            key = (op.residual, "weight" in inp)
            if key not in stats:
                stats[key] = row_stats(inp, dys)
            classes = row_classes(raw_case(op, inp["x"]), inp, dys, acc, stats[key])
            bad = [m for m, c in zip(names, classes, strict=True) if c == "ambiguous"]
            assert not bad, f"{op} {dtype_id(dtype)} n={n} {acc}: ambiguous {bad}"
            seen.update((op.name, dtype, acc, c) for c in classes)
    return seen


# ---- documented differences and the known bug ---------------------------------------------------


def test_cpu_accumulates_in_float64(device):
    """The README's examples. A float32 row of 1e20: rms_norm gives 1 on the CPU (float64
    statistics) and 0 on CUDA, as torch does on both (x² overflows float32). A row of 1e-30
    with eps = 0: 1 on the CPU; on CUDA x² underflows to 0 and the result is inf, as torch's."""
    x = torch.full((2, 8), 1e20, device=device)
    x[1] = -1e20
    y = torch.ops.rownorm.rms_norm(x, None, -1, None)
    expected = torch.nn.functional.rms_norm(x, (8,))
    cuda = torch.device(device).type == "cuda"
    assert torch.equal(expected, torch.zeros_like(x))
    assert torch.equal(y, expected if cuda else x.sign())
    x = torch.full((1, 8), 1e-30, device=device)
    y = torch.ops.rownorm.rms_norm(x, None, -1, 0.0)
    expected = torch.nn.functional.rms_norm(x, (8,), eps=0.0)
    assert torch.isposinf(expected).all()
    assert torch.equal(y, expected if cuda else torch.ones_like(x))


def test_16_bit_statistics_are_float32(device):
    """fp16 x: rownorm's norms are float32, F.normalize rounds its norm to fp16 first. A row of
    fp16's largest values: ‖x‖ = 6e4·√8 overflows fp16, so torch gives 0 (l2) where rownorm
    gives 1/√8, which is torch's result on float32 copies (the comparison every test uses)."""
    x = torch.full((1, 8), 6e4, dtype=torch.float16, device=device)
    for p, fn in ((2.0, torch.ops.rownorm.l2_normalize), (1.0, torch.ops.rownorm.l1_normalize)):
        y = fn(x, -1, 1e-12) if p == 2.0 else fn(x, -1, 1e-12, False)
        half = torch.nn.functional.normalize(x, p=p, dim=-1)
        single = torch.nn.functional.normalize(x.float(), p=p, dim=-1).half()
        assert torch.equal(half, torch.zeros_like(x)), f"p={p}: {half}"
        assert torch.equal(y, single), f"p={p}: {y} != {single}"


def test_layer_norm_sum_overflow(device):
    """Constant rows whose sum overflows the accumulator: y = bias and dx = 0, as torch's
    Welford mean gives. The mean is shifted by the row's first element (layer_norm.cuh), so no
    sum of the row's values is formed; Σx/n gave NaN here."""
    cuda = torch.device(device).type == "cuda"
    cases = [(torch.float64, 1e308)] + ([(torch.float32, 1e38)] if cuda else [])
    for dtype, c in cases:
        x = torch.full((2, 33), c, dtype=dtype, device=device)
        b = torch.linspace(-1, 1, 33, dtype=dtype, device=device)
        leaf = x.clone().requires_grad_(True)
        y = torch.ops.rownorm.layer_norm(leaf, None, b, -1, 1e-5)
        assert torch.equal(y, b.expand_as(y)), f"{dtype}: {y[0, :4]}"
        dy = torch.ones_like(x)
        (dx,) = torch.autograd.grad(y, leaf, dy)
        assert torch.count_nonzero(dx) == 0, f"{dtype}: {dx[0, :4]}"
