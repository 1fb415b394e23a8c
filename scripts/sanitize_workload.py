"""Small workload for compute-sanitizer: every op of the op table (``rownorm.testing``: its case
with every parameter), forward and backward with parameter gradients, in fp32, fp16, bf16 and
fp64, on every kernel configuration: one row length per configuration of the CUDA tier table
(``plan_row_tier``: the group, CTA and cluster tiers, then the streaming tier past its end;
fp64 always streams), whole and partial chunks of the fused parameter-gradient sums, rows
that start misaligned, odd row strides, stride-0 rows, and reductions over a strided dim
(short columns in registers, 16-byte packs of columns, long columns streamed). Half the cases
carry extreme values: rows with NaN, ±inf, zeros, a constant, tiny and huge (in-range)
values. CUDA results are compared with the CPU op on the same samples: NaN and ±inf at the
same elements, finite values within a tolerance relative to each row's largest.

    compute-sanitizer --tool memcheck python scripts/sanitize_workload.py [--device cuda]

Few rows per case (the sanitizers' cost grows with the memory a kernel touches; racecheck
and initcheck are the slow ones), so every tool runs in about a minute or two on an H100.
``--dtypes`` runs a subset (to split a tool's run). Its last line is ``sanitizer workload:
results OK (...)`` or ``... RESULTS WRONG (...)`` (exit status 1), which
``scripts/gpu_check.sh`` reads; ``--device cpu`` runs the same workload on the CPU (a check of
this script without a GPU).
"""

from __future__ import annotations

import argparse
import sys
import zlib
from typing import NamedTuple

import torch
from rownorm.testing import DTYPE_IDS, OpInfo, families
from rownorm.testing.tiers import tier_boundaries


class Case(NamedTuple):
    desc: str
    shape: tuple[int, ...]
    dim: int
    layout: str  # contiguous, offset (start one element in), strided (row stride n + 3),
    #              expanded (stride-0 rows)
    special: bool  # rows of extreme values


# Tolerance of CUDA against the CPU op (float64 accumulation), relative to a row's largest
# value: a sanity check of the results, not an accuracy test (tests/ does that).
TOL = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float64: 1e-9}
ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def tier_lengths(elem_size: int) -> list[int]:
    """One row length per configuration of the tier table, alternately its largest (whole
    packs, aligned) and its smallest (odd: scalar head and tail), then one past the table's end
    (streaming). fp64 always streams: an odd length and a whole number of packs."""
    if elem_size == 8:
        return [1023, 4096]
    edges = tier_boundaries(elem_size)
    lengths = [edges[i] if i % 2 == 0 else edges[i - 1] + 1 for i in range(len(edges))]
    return [*lengths, edges[-1] + 1]


def cases(dtype: torch.dtype) -> list[Case]:
    elem = torch.empty((), dtype=dtype).element_size()
    out = []
    for i, n in enumerate(tier_lengths(elem)):
        rows = 5 if n <= 1024 else 3 if n <= 65536 else 2
        out.append(Case(f"rows n={n}", (rows, n), -1, "contiguous", i % 2 == 1))
    # Fused parameter-gradient sums over whole and partial chunks (16 rows per CTA on the CTA
    # tier, 32 per group of lanes): aligned rows of the CTA and group tiers, 512 threads x 2
    # packs (add_rms_norm, 16-bit 8192), groups of 8 lanes (16-bit 256 / fp32 128), and rows
    # of 64 (fp32: the table's 4-lane groups, run by the fused sums as 8-lane groups).
    out += [
        Case("fused sums, CTA tier", (35, 4096), -1, "contiguous", False),
        Case("fused sums, 512 x 2 packs", (35, 16384 // elem), -1, "contiguous", True),
        Case("fused sums, group tier", (70, 1024), -1, "contiguous", True),
        Case("fused sums, 8-lane groups", (70, 2048 // elem), -1, "contiguous", False),
        Case("fused sums, rows of 64", (70, 64), -1, "contiguous", True),
    ]
    # Layouts the row tiers read without a copy.
    for n in (1000, 4097):
        out += [
            Case(f"misaligned rows n={n}", (4, n), -1, "offset", n % 2 == 0),
            Case(f"odd row stride n={n}", (4, n), -1, "strided", n % 2 == 1),
            Case(f"stride-0 rows n={n}", (4, n), -1, "expanded", False),
        ]
    # Strided dims: short columns (registers), packed columns, long columns (streamed),
    # one column (dim 0 of a short inner extent).
    out += [
        Case("dim 0, 5 columns", (300, 5), 0, "contiguous", True),
        Case("dim 1, 33 x 7 columns", (3, 33, 7), 1, "contiguous", False),
        Case("dim 1, 48 x 256 columns", (2, 48, 256), 1, "contiguous", True),
        Case("dim 1, 100 x 264 columns", (2, 100, 264), 1, "contiguous", False),
        Case("dim 1, 70 x 33 columns", (3, 70, 33), 1, "offset", True),
    ]
    return out


def _values(case: Case, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """float64 values of x (the case's shape), rounded to dtype; extreme rows where asked."""
    n = case.shape[case.dim]
    moved = [s for i, s in enumerate(case.shape) if i != case.dim % len(case.shape)] + [n]
    x = torch.randn(moved, dtype=torch.float64, generator=gen)
    if case.special:
        rows = x.view(-1, n)
        huge = 1e4 if dtype == torch.float16 else 1e15
        tiny = 1e-2 if dtype == torch.float16 else 1e-30
        kinds = [
            lambda r: r.__setitem__(n // 2, float("nan")),
            lambda r: (r.__setitem__(0, float("inf")), r.__setitem__(n - 1, -float("inf"))),
            lambda r: r.zero_(),
            lambda r: r.fill_(12345.678),
            lambda r: r.mul_(tiny),
            lambda r: r.mul_(huge),
        ]
        for i in range(min(len(rows), len(kinds))):
            kinds[i](rows[i])
    return x.movedim(-1, case.dim).contiguous().to(dtype).double()


def _place(t: torch.Tensor, layout: str, device) -> torch.Tensor:
    """t (contiguous) on ``device`` in ``layout``, the same values."""
    t = t.to(device)
    # The elements around a view are left uninitialized: initcheck reports a kernel that
    # reads outside the tensor (memcheck cannot: they are inside the allocation).
    if layout == "offset":  # one element in: rows do not start 16-byte aligned
        flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=device)
        flat[1:] = t.reshape(-1)
        return flat[1:].view(t.shape)
    if layout == "strided":  # row stride n + 3 (rows start at every alignment)
        wide = torch.empty((*t.shape[:-1], t.shape[-1] + 3), dtype=t.dtype, device=device)
        wide[..., : t.shape[-1]] = t
        return wide[..., : t.shape[-1]]
    if layout == "expanded":  # every row is the first one (row stride 0)
        return t[:1].expand(t.shape)
    return t


def results(op: OpInfo, case: Case, dtype: torch.dtype, device, half_params: bool) -> list:
    """The outputs of ``op`` on ``case`` and the gradients of all its inputs, on ``device``:
    the same values on every device (drawn on the CPU from a seed of the case)."""
    gen = torch.Generator().manual_seed(zlib.crc32(case.desc.encode()))
    x = _values(case, dtype, gen)
    n = case.shape[case.dim]
    p_dtype = torch.float32 if half_params and dtype in (torch.float16, torch.bfloat16) else dtype
    values = {
        "x": x,
        "residual": torch.randn(case.shape, dtype=torch.float64, generator=gen).to(dtype),
        "weight": (1 + 0.1 * torch.randn(n, dtype=torch.float64, generator=gen)).to(p_dtype),
        "bias": (0.1 * torch.randn(n, dtype=torch.float64, generator=gen)).to(p_dtype),
    }
    inp = {}
    for k in op.input_names:
        v = values[k].to(dtype if k in ("x", "residual") else p_dtype)
        v = _place(v, case.layout, device) if k in ("x", "residual") else v.to(device)
        inp[k] = v.requires_grad_(True)
    outs = op.call(inp, case.dim)
    dys = []
    for y in outs:  # the same on every device
        dy = torch.cos(torch.arange(y.numel(), dtype=torch.float64)).reshape(y.shape)
        dys.append(dy.to(dtype).to(device))
    names = op.grad_inputs(inp)
    grads = torch.autograd.grad(outs, [inp[k] for k in names], dys)
    return [y.detach() for y in outs] + list(grads)


def compare(got: torch.Tensor, want: torch.Tensor, dim: int, tol: float) -> float:
    """The worst error over tolerance: NaN and ±inf must sit at the same elements (else inf);
    finite values are compared relative to the largest finite |want| of their row (along
    ``dim``; a parameter gradient: of the whole tensor)."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    for is_it in (torch.isnan, torch.isposinf, torch.isneginf):
        if not torch.equal(is_it(got), is_it(want)):
            return float("inf")
    finite = torch.isfinite(want)
    err = torch.where(finite, (got - want).abs(), 0.0)
    mag = torch.where(finite, want.abs(), 0.0)
    if got.dim() > 1:
        err, mag = err.movedim(dim, -1), mag.movedim(dim, -1)
        scale = mag.amax(-1, keepdim=True)
    else:
        scale = mag.amax()
    worst = (err / torch.where(scale > 0, scale, 1.0)).max().item() if err.numel() else 0.0
    return worst / tol


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="where the ops run (default cuda)")
    p.add_argument("--dtypes", default="fp32,fp16,bf16,fp64", help="comma-separated subset")
    p.add_argument(
        "--shard",
        default="0/1",
        help="K/N: every N-th case from the K-th (racecheck and initcheck need minutes for the "
        "whole workload: split it over calls)",
    )
    args = p.parse_args(argv)
    shard, shards = (int(v) for v in args.shard.split("/"))
    if not 0 <= shard < shards:
        p.error(f"--shard {args.shard}: need 0 <= K < N")
    wanted = set(args.dtypes.split(","))
    dtypes = [d for d in ALL_DTYPES if DTYPE_IDS[d] in wanted]
    worst, n_cases, n_calls, bad = 0.0, 0, 0, []
    index = -1
    for dtype in dtypes:
        for i, case in enumerate(cases(dtype)):
            index += 1
            if index % shards != shard:
                continue
            case_worst = 0.0
            for op in families().values():
                x_probe = torch.empty(case.shape)
                if not op.supports(x_probe, case.dim):
                    continue
                half_params = i % 3 == 2  # float32 parameters with 16-bit x, now and then
                got = results(op, case, dtype, args.device, half_params)
                want = results(op, case, dtype, "cpu", half_params)
                n_calls += 1
                for t_got, t_want in zip(got, want, strict=True):
                    err = compare(t_got, t_want, case.dim, TOL[dtype])
                    if not err <= 1:  # (NaN too)
                        bad.append(f"{op} {DTYPE_IDS[dtype]} {case.desc}: error/tol {err:.3g}")
                    case_worst = max(case_worst, err)
            n_cases += 1
            worst = max(worst, case_worst)
            print(f"{DTYPE_IDS[dtype]:<5} {case.desc:<28} {case.layout:<10} "
                  f"{'extreme values ' if case.special else ''}"
                  f"worst error / tolerance {case_worst:.2f}", flush=True)  # fmt: skip
    for line in bad[:20]:
        print("  WRONG", line)
    ok = not bad
    summary = f"{n_cases} cases, {n_calls} forward+backward calls, {len(bad)} wrong"
    print("sanitizer workload:", f"results OK ({summary})" if ok else f"RESULTS WRONG ({summary})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
