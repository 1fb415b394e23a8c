"""Every op case at the edges of every kernel tier (CUDA).

Why the grid is what it is: the CUDA kernel configuration of a row is chosen from its length
and element size only (``PlanRowTier`` in src/kernels/common/plan.h). The lengths here
are DERIVED from that table, asked through ``torch.ops.rownorm.plan_row_tier``
(:func:`rownorm.testing.tiers.tier_edge_lengths`): at (whole packs) and one above (odd, the
next configuration with scalars) every boundary of the dtype's element size, so each
configuration runs aligned and odd, each dtype runs only its own edges, and a change of the
table moves the lengths with it. float64 always streams
(two lengths). One id per (op case, dtype), the lengths iterated inside, forward and backward
(autograd and the raw backward op, parameter gradients included) against the float64
reference, with rows spread over four decades of magnitude. The CPU runs one row loop for
every length (test_correctness covers it).
"""

from __future__ import annotations

import json

import pytest
import torch
from rownorm.testing.tiers import (
    pack_width,
    plan_row_tier,
    tier_boundaries,
    tier_edge_lengths,
)
from utils import (
    DTYPES,
    OPS,
    assert_matches,
    check_backward,
    check_forward,
    cuda_only,
    dram_gbps_per_sm,
    dtype_id,
    families,
    gpu_rows,
    raw_case,
    run_logged,
    scaled_rows,
)

pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")


def _aligned_cluster_lengths(dtype: torch.dtype) -> list[int]:
    """The cluster tier's edge lengths of whole packs for the dtype (aligned rows)."""
    elem = dtype.itemsize
    vec = pack_width(elem)
    lengths = [
        n
        for n in tier_edge_lengths(elem)
        if plan_row_tier(n, vec).tier == "cluster" and n % vec == 0
    ]
    assert lengths
    return lengths


FAMILIES = families()


@cuda_only
@pytest.mark.parametrize("op_id", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_tier_edges(op_id, dtype):
    """Every edge for the op case with every input of each op; every third edge for the
    others (the same kernels with fewer operands) and for float16 (planned as bfloat16)."""
    op = OPS[op_id]
    elem = torch.empty((), dtype=dtype).element_size()
    lengths = tier_edge_lengths(elem)
    if op_id not in FAMILIES or dtype == torch.float16:
        lengths = lengths[::3]
    for n in lengths:
        x = scaled_rows(gpu_rows(n), n, dtype, "cuda")
        inp = op.inputs(x, -1)
        what = f"N={n} ({plan_row_tier(n, pack_width(elem)).tier})"
        check_forward(op, inp, -1, what=what)
        check_backward(raw_case(op, x), inp, -1, what=what)


def test_tier_edge_lengths_cover_each_configuration():
    """Each element size's lengths reach every configuration of the table, on both sides of
    each boundary (below / at the edge: one configuration; above: the next)."""
    for elem in (2, 4):
        vec = pack_width(elem)
        edges = tier_boundaries(elem)
        assert edges == sorted(edges) and len(edges) >= 10, edges
        lengths = tier_edge_lengths(elem)
        plans = {plan_row_tier(n, vec) for n in lengths}
        every = {plan_row_tier(n, vec) for n in range(1, edges[-1] + 2 * vec, vec)}
        assert every <= plans, every - plans
        for edge in edges:
            assert plan_row_tier(edge, vec) != plan_row_tier(edge + 1, vec)
            assert plan_row_tier(edge - vec, vec) == plan_row_tier(edge, vec)


def _planned(n: int, elem: int) -> str:
    """The table's configuration now (not cached: ROWNORM_PLAN_AS_N is read at every plan),
    without the row length the description also names."""
    import rownorm  # noqa: F401  (loads the library that defines the op)

    words = torch.ops.rownorm.plan_row_tier(n, elem, True, True).split()
    return " ".join(w for w in words if not w.startswith("n="))


def test_plan_as_n_runs_a_longer_rows_configuration(monkeypatch):
    """ROWNORM_PLAN_AS_N=m (benchmarks/tier_sweep.py) plans rows shorter than m as rows of m,
    and leaves longer rows and the unset table alone."""
    for elem in (2, 4):
        edges = tier_boundaries(elem)
        own = {n: _planned(n, elem) for n in (256, edges[3], edges[-1] + 1)}
        monkeypatch.setenv("ROWNORM_PLAN_AS_N", str(edges[3]))
        assert _planned(256, elem) == own[edges[3]] != own[256]
        assert _planned(edges[-1] + 1, elem) == own[edges[-1] + 1]
        monkeypatch.setenv("ROWNORM_PLAN_AS_N", "0")
        assert _planned(256, elem) == own[256]
        monkeypatch.delenv("ROWNORM_PLAN_AS_N")
        assert _planned(256, elem) == own[256]


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_next_configuration_at_each_edge(dtype, monkeypatch):
    """What the tier sweep times: each family at every edge of the table, run by the next
    configuration up (ROWNORM_PLAN_AS_N), forward and backward against the float64 reference."""
    elem = torch.empty((), dtype=dtype).element_size()
    edges = tier_boundaries(elem)
    for op_id in FAMILIES:
        op = OPS[op_id]
        for edge in edges:
            monkeypatch.setenv("ROWNORM_PLAN_AS_N", str(edge + 1))
            x = scaled_rows(gpu_rows(edge), edge, dtype, "cuda")
            inp = op.inputs(x, -1)
            what = f"N={edge} as {_planned(edge, elem)}"
            check_forward(op, inp, -1, what=what)
            check_backward(raw_case(op, x), inp, -1, what=what)


def _cluster_case(op: str, x: torch.Tensor, dy: torch.Tensor) -> list[torch.Tensor]:
    """The op's output and the gradients of its inputs and parameters on rows x."""
    import rownorm

    n = x.shape[-1]
    g = torch.Generator(device="cuda").manual_seed(n)
    w = torch.randn(n, device="cuda", dtype=x.dtype, generator=g).requires_grad_()
    b = torch.randn(n, device="cuda", dtype=x.dtype, generator=g).requires_grad_()
    r = torch.randn(x.shape, device="cuda", dtype=x.dtype, generator=g).requires_grad_()
    x = x.detach().requires_grad_()
    if op == "rms_norm":
        y, leaves = rownorm.rms_norm(x, w), [x, w]
    elif op == "layer_norm":
        y, leaves = rownorm.layer_norm(x, w, b), [x, w, b]
    elif op == "add_rms_norm":
        y, leaves = rownorm.add_rms_norm(x, r, w)[0], [x, r, w]
    else:
        y, leaves = getattr(rownorm, op)(x), [x]
    return [y.detach(), *torch.autograd.grad(y, leaves, dy)]


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_cluster_kernels_agree(dtype, monkeypatch):
    """The cluster tier has three kernels (dispatch.cuh): rows in registers, a cluster per row;
    rows in shared memory by bulk copies (``stages=2``); rows in registers with the parameters
    read once per CTA (``params=once``: forwards with a weight; on odd rows, whose operands
    start alike, once per class of rows of one alignment). PlanRowOp picks the one the device
    holds most of (or, for those forwards, plan.h's ClusterParamsPerRow); ROWNORM_CLUSTER_ROWS
    forces one where it exists. All visit a thread's packs and reduce in the same order: every
    output and gradient is bitwise the same, on rows aligned and odd (head and tail scalars)."""
    import rownorm

    elem = dtype.itemsize
    vec = pack_width(elem)
    lengths = [n for n in tier_edge_lengths(elem) if plan_row_tier(n, vec).tier == "cluster"]
    assert lengths
    ops = ("rms_norm", "layer_norm", "add_rms_norm", "softmax", "log_softmax", "l2_normalize")
    hopper = torch.cuda.get_device_capability()[0] == 9
    shared_plans = 0
    for n in lengths:
        x = scaled_rows(3, n, dtype, "cuda")
        dy = torch.randn_like(x)
        for op in ops:
            runs, plans = {}, {}
            for kind in ("registers", "shared", "params", ""):
                monkeypatch.setenv("ROWNORM_CLUSTER_ROWS", kind)
                runs[kind] = _cluster_case(op, x, dy)
                plans[kind] = (rownorm.explain(x, op), rownorm.explain(x, op, backward=True))
            assert all(p.stages is None and p.params is None for p in plans["registers"])
            assert all(p.params is None for p in plans["shared"])
            assert all(p.stages is None for p in plans["params"])
            shared_plans += sum(p.stages == 2 for p in plans["shared"])
            params = plans["params"][0].params
            # the kept parameters' kernel: forwards with a weight, rows of 8 packs a thread
            # (not add_rms_norm's 16-bit rows of 4)
            kept = op in ("rms_norm", "layer_norm", "add_rms_norm")
            kept = kept and plans["params"][0].packs == 8
            if hopper and kept:
                assert params == "once", (op, n, plans["params"])
            elif not kept:
                assert params is None, (op, n, plans["params"])
            if n % vec and op in ("rms_norm", "layer_norm"):
                # odd rows keep parameters only for two row inputs unless forced (dispatch.cuh)
                assert plans[""][0].params is None, (op, n, plans[""])
            for kind in ("shared", "params", ""):
                for i, (a, b) in enumerate(zip(runs["registers"], runs[kind], strict=True)):
                    assert torch.equal(a, b), (op, n, kind, i, plans[kind])
    if hopper:
        assert shared_plans > 0


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_cluster_layer_norm_moments_per_slice(dtype, monkeypatch):
    """layer_norm's cluster rows make each CTA's (count, Σ(x − x₀), M2) in the CTA and merge
    the slices' in one exchange (layer_norm.cuh's SliceMoments). Rows whose slices have their
    own means (an offset that changes every sixteenth of the row: slices of 4-16 CTAs differ),
    a common offset of 1e3 (the slices' means differ by far less than they are), and constant
    rows (var = 0 exactly: y is the bias), for each cluster size aligned and odd, under every
    cluster kernel and with float32 parameters on 16-bit rows (whose plans differ), against
    the float64 reference."""
    elem = dtype.itemsize
    vec = pack_width(elem)
    lengths = [n for n in tier_edge_lengths(elem) if plan_row_tier(n, vec).tier == "cluster"]
    clusters = {plan_row_tier(n, vec).cluster for n in lengths}
    assert {4, 8, 16} <= clusters, clusters
    steps = torch.tensor([3.0, -250.0, 40.0, 5.0, 700.0, -9.0, 0.5, 60.0] * 2, dtype=torch.float64)
    affine = OPS["layer_norm_affine"]
    gen = torch.Generator().manual_seed(0)
    param_dtypes = (dtype, torch.float32) if dtype != torch.float32 else (dtype,)
    for n in lengths:
        noise = torch.randn(2, n, dtype=torch.float64, generator=gen)
        rows = {
            "slice means": noise + steps[torch.arange(n) * 16 // n],
            "offset 1e3": noise + 1e3,
            "constant": torch.full((2, n), 7.25, dtype=torch.float64),
        }
        for name, x64 in rows.items():
            x = x64.to(dtype).cuda()
            for kind in ("registers", "shared", "params", ""):
                monkeypatch.setenv("ROWNORM_CLUSTER_ROWS", kind)
                for pdt in param_dtypes:
                    inp = affine.inputs(x, -1)
                    inp = {k: (v if k == "x" else v.to(pdt)) for k, v in inp.items()}
                    what = f"{name} n={n} kind={kind or 'plan'} params {dtype_id(pdt)}"
                    check_forward(affine, inp, -1, what=what, vs_torch=pdt == dtype)
                    if name == "constant":
                        y = affine.call(inp, -1)[0]
                        assert torch.equal(y, inp["bias"].to(y.dtype).expand_as(y)), what


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_cluster_parameters_kept_per_cta_may_be_misaligned(dtype, monkeypatch):
    """The kernel that keeps the forward's parameters per CTA (``params=once``, forced: the
    plan may pick the register kernel on this GPU) copies them an element at a time: a weight
    and a bias that start mid-pack (views one element into a buffer) give the register
    kernel's bits."""
    import rownorm

    elem = dtype.itemsize
    vec = pack_width(elem)
    lengths = tier_edge_lengths(elem)
    n = next(m for m in lengths if plan_row_tier(m, vec).tier == "cluster" and m % vec == 0)
    x = scaled_rows(3, n, dtype, "cuda")
    w = torch.randn(n + 1, device="cuda", dtype=dtype)[1:]
    b = torch.randn(n + 1, device="cuda", dtype=dtype)[1:]
    r = torch.randn_like(x)
    runs, plans = {}, {}
    for kind in ("registers", "params"):
        monkeypatch.setenv("ROWNORM_CLUSTER_ROWS", kind)
        plans[kind] = rownorm.explain(x, "rms_norm")
        runs[kind] = [
            rownorm.rms_norm(x, w),
            rownorm.layer_norm(x, w, b),
            *rownorm.add_rms_norm(x, r, w),
        ]
    if torch.cuda.get_device_capability()[0] == 9:
        assert plans["params"].params == "once", plans["params"]
    for a, c in zip(runs["registers"], runs["params"], strict=True):
        assert torch.equal(a, c)


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_cluster_kept_rows_many_per_cluster(dtype, monkeypatch):
    """The kept-parameter cluster kernel is a persistent grid; on 256-thread CTAs of one-input
    forwards it loads a cluster's next row while it runs the current one (dispatch.cuh's
    KeptRowsPipelined). With more rows than the GPU holds clusters (each cluster runs several,
    the last one's "next" row past the end) and a row count no grid divides evenly, every
    cluster length gives the bits of the register kernel, which runs one row per cluster."""
    import rownorm

    lengths = _aligned_cluster_lengths(dtype)
    for n in lengths:
        rows = (1 << 24) // n + 7
        x = scaled_rows(rows, n, dtype, "cuda")
        g = torch.Generator(device="cuda").manual_seed(n)
        w = torch.randn(n, device="cuda", dtype=dtype, generator=g)
        b = torch.randn(n, device="cuda", dtype=dtype, generator=g)
        runs, plans = {}, {}
        for kind in ("registers", "params"):
            monkeypatch.setenv("ROWNORM_CLUSTER_ROWS", kind)
            plans[kind] = rownorm.explain(x, "layer_norm")
            with torch.no_grad():
                runs[kind] = [rownorm.rms_norm(x, w), rownorm.layer_norm(x, w, b)]
        if torch.cuda.get_device_capability()[0] == 9:
            assert plans["params"].params == "once", plans["params"]
        for a, c in zip(runs["registers"], runs["params"], strict=True):
            assert torch.equal(a, c), (n, rows, plans["params"])


@cuda_only
def test_cluster_parameters_read_per_row_on_fast_gpus(monkeypatch):
    """plan.h's KeepsClusterParams: on GPUs of at least 30 GB/s of DRAM bandwidth per SM (the
    H200), cluster forwards read their parameters in every row, where the kept copy measured
    slower, (1) on rows shorter than their cluster holds whose parameters take more than 4
    bytes a column (layer_norm's float32 weight and bias: 1.12-1.23x the time kept), and (2)
    wherever the register rows stage their parameters per row (rms_norm, add_rms_norm: the
    kept copy took 1.02-1.10x the time), 16-CTA clusters and partial rows included; layer_norm
    given a weight alone keeps it (its kept copy took 0.91-0.95x the time of 16-bit full rows
    read per row). The kernel differs, the bits do not. On slower GPUs the rule does not apply
    (skipped)."""
    import rownorm

    if torch.cuda.get_device_capability()[0] < 9 or dram_gbps_per_sm() < 30:
        pytest.skip("the rule applies on sm_90+ GPUs of >= 30 GB/s of DRAM bandwidth per SM")
    monkeypatch.delenv("ROWNORM_CLUSTER_ROWS", raising=False)
    cases = [("layer_norm", torch.float32, n) for n in (24576, 40960, 49152)]
    cases += [("rms_norm", torch.float32, n) for n in (32768, 65536, 131072)]
    cases += [("rms_norm", torch.bfloat16, n) for n in (65536, 98304, 131072, 262144)]
    cases += [("add_rms_norm", torch.bfloat16, 262144), ("add_rms_norm", torch.float32, 65536)]
    for op, dtype, n in cases:
        x = scaled_rows(1000, n, dtype, "cuda")
        plan = rownorm.explain(x, op)
        assert plan.tier == "cluster" and plan.params is None, (op, n, plan)
        g = torch.Generator(device="cuda").manual_seed(n)
        w = torch.randn(n, device="cuda", dtype=dtype, generator=g)
        b = torch.randn(n, device="cuda", dtype=dtype, generator=g)
        r = torch.randn(x.shape, device="cuda", dtype=dtype, generator=g)
        run = {
            "rms_norm": lambda x=x, w=w: rownorm.rms_norm(x, w),
            "layer_norm": lambda x=x, w=w, b=b: rownorm.layer_norm(x, w, b),
            "add_rms_norm": lambda x=x, r=r, w=w: rownorm.add_rms_norm(x, r, w),
        }[op]
        with torch.no_grad():
            y = run()
            monkeypatch.setenv("ROWNORM_CLUSTER_ROWS", "params")
            assert rownorm.explain(x, op).params == "once", (op, n)
            kept = run()
            monkeypatch.delenv("ROWNORM_CLUSTER_ROWS")
        for a, c in zip(
            y if isinstance(y, tuple) else (y,),
            kept if isinstance(kept, tuple) else (kept,),
            strict=True,
        ):
            assert torch.equal(a, c), (op, n)


# Each case without its parameters, then with parameters that change nothing; explain's plan,
# which takes the parameters as given; whether the two calls gave the same bits.
_NO_PARAMS_CODE = """
import sys
for op, dtype, n in [(op, getattr(torch, dt), int(n)) for op, dt, n in
                     (case.split(":") for case in sys.argv[1:])]:
    x = torch.randn(300, n, device="cuda", dtype=dtype)
    ones = torch.ones(n, device="cuda", dtype=dtype)
    zeros = torch.zeros(n, device="cuda", dtype=dtype)
    with torch.no_grad():
        if op == "rms_norm":
            same = torch.equal(rownorm.rms_norm(x), rownorm.rms_norm(x, ones))
        else:
            same = torch.equal(rownorm.layer_norm(x), rownorm.layer_norm(x, ones, zeros))
    print(op, n, same, rownorm.explain(x, op).raw, flush=True)
"""


@cuda_only
def test_cluster_forwards_given_no_parameters_keep_none():
    """A cluster forward called without its parameters (rms_norm without a weight, layer_norm
    without weight and bias) plans as an op without parameters (op_traits.h's
    GivenParamBytes): never the kernel that keeps them per CTA (`params=once`), which with
    nothing to keep held two CTAs per SM where the register rows hold four. Each call's logged
    plan (ROWNORM_LOG_PLAN) against explain's, which takes the parameters as given, and the
    bits against the same op given parameters that change nothing (ones, zeros)."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the kept-parameter kernels are cluster kernels (sm_90+)")
    cases = ["rms_norm:bfloat16:262144", "rms_norm:float32:131072", "rms_norm:bfloat16:98304"]
    cases += ["layer_norm:bfloat16:262144"]
    run = run_logged(_NO_PARAMS_CODE, *cases, unset=("ROWNORM_CLUSTER_ROWS",))
    logged = [line for line in run.stderr.splitlines() if line.startswith("rownorm: ")]
    printed = [line.split(" ", 3) for line in run.stdout.splitlines()]
    assert len(printed) == len(cases), run.stdout
    kept = 0
    for op, n, same, explained in printed:
        calls = [line for line in logged if line.startswith(f"rownorm: {op}: rows=300 n={n} ")]
        assert len(calls) == 2, (op, n, logged)  # without, then with the parameters
        assert "tier=cluster" in calls[0] and "params=" not in calls[0], (op, n, calls[0])
        assert ("params=once" in explained) == ("params=once" in calls[1]), (op, n, calls[1])
        kept += "params=once" in explained
        assert same == "True", (op, n)
    assert kept > 0, printed  # some of the cases keep their parameters when given them


# layer_norm given a weight alone (no bias), each case's largest error against float64, relative
# to the reference where that exceeds 1.
_WEIGHT_ALONE_CODE = """
import sys
for dt, n in [(getattr(torch, d), int(n)) for d, n in (c.split(":") for c in sys.argv[1:])]:
    g = torch.Generator(device="cuda").manual_seed(n)
    x = torch.randn(200, n, device="cuda", dtype=dt, generator=g)
    w = torch.randn(n, device="cuda", dtype=dt, generator=g)
    with torch.no_grad():
        y = rownorm.layer_norm(x, w)
    ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double())
    print(n, float(((y.double() - ref).abs() / ref.abs().clamp_min(1)).max()), flush=True)
"""


@cuda_only
def test_cluster_layer_norm_given_a_weight_alone_keeps_it_on_fast_gpus():
    """layer_norm given a weight and no bias, on full rows of the cluster tier: on GPUs of at
    least 30 GB/s of DRAM bandwidth per SM the forward keeps the weight per CTA (plan.h's
    KeepsClusterParams: the kept copy took 0.91-0.95x the time of the rows that read it per
    row, bf16 65536 / 131072). Each call's logged plan (ROWNORM_LOG_PLAN) and its largest
    error against float64 (relative where the reference exceeds 1)."""
    if torch.cuda.get_device_capability()[0] < 9 or dram_gbps_per_sm() < 30:
        pytest.skip("the rule applies on sm_90+ GPUs of >= 30 GB/s of DRAM bandwidth per SM")
    cases = ["bfloat16:65536", "bfloat16:131072", "float32:32768", "float32:65536"]
    run = run_logged(_WEIGHT_ALONE_CODE, *cases, unset=("ROWNORM_CLUSTER_ROWS",))
    logged = [line for line in run.stderr.splitlines() if line.startswith("rownorm: layer_norm:")]
    assert len(logged) == len(cases), run.stderr
    for case, line, printed in zip(cases, logged, run.stdout.splitlines(), strict=True):
        assert "tier=cluster" in line and "params=once" in line, (case, line)
        n, err = printed.split()
        assert n == case.split(":")[1], (case, printed)
        tol = 2**-7 if case.startswith("bfloat16") else 1e-5  # twice an element's rounding
        assert float(err) < tol, (case, err)


@cuda_only
def test_cluster_layer_norm_first_element_far_from_the_mean():
    """layer_norm's cluster rows take each slice's M2 about the slice's own mean in a second
    pass (layer_norm.cuh's SliceMoments), not as Σd² − (Σd)²/n of d = x − x₀ in one pass, which
    cancels where the row's first element x₀ is far from its mean. Rows whose first element is
    30 over a spread of 0.01, or 1000 over a spread of 1: the share of outputs that are not the
    correctly rounded float64 result. H200, two passes: bf16 65536 / 262144 0.45-1.09%, fp16
    131072 3.5-4.1%; one pass: 4.4-16.4% and 26.6-45.1% (benchmarks/results/h200/NOTES.md
    §37)."""
    import rownorm

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the cluster tier runs on sm_90+")
    rows = 64
    for dtype, n, most in [
        (torch.bfloat16, 65536, 0.02),
        (torch.bfloat16, 262144, 0.02),
        (torch.float16, 131072, 0.08),
    ]:
        g = torch.Generator(device="cuda").manual_seed(n)
        base = torch.randn(rows, n, device="cuda", generator=g)
        w = torch.randn(n, device="cuda", generator=g).to(dtype)
        b = torch.randn(n, device="cuda", generator=g).to(dtype)
        for first, spread in ((30.0, 0.01), (1000.0, 1.0)):
            x = base * spread
            x[:, 0] = first
            x = x.to(dtype)
            assert rownorm.explain(x, "layer_norm").tier == "cluster", (dtype, n)
            with torch.no_grad():
                y = rownorm.layer_norm(x, w, b)
            ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
            wrong = float((y != ref.to(dtype)).double().mean())
            assert wrong < most, (dtype, n, first, spread, wrong)


def _forwards_with_params(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor | None = None
) -> list:
    """The forwards that read per-column parameters, every output (no autograd)."""
    import rownorm

    r = torch.randn_like(x) if r is None else r
    with torch.no_grad():
        return [
            rownorm.rms_norm(x, w),
            rownorm.layer_norm(x, w, b),
            *rownorm.add_rms_norm(x, r, w),
        ]


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_parameters_at_any_offset_from_the_row(dtype):
    """Rows that do not start 16-byte aligned (odd n: each row's first pack starts at another
    column) read the parameters at their packs' columns a word at a time where those are not
    aligned (pack.cuh's LoadPackUnaligned; the alignment is the row's). A weight
    and a bias at every element offset into a buffer, in the row's dtype and in float32, give
    the bits of the same values at offset 0, on every tier's odd edge length, with rows of
    every head."""
    import rownorm

    elem = dtype.itemsize
    vec = pack_width(elem)
    lengths = [
        n
        for n in tier_edge_lengths(elem)
        if n % vec != 0 and plan_row_tier(n, vec).tier != "streaming"
    ]
    assert lengths
    for n in lengths:
        x = scaled_rows(2 * vec + 1, n, dtype, "cuda")
        r = torch.randn_like(x)
        for wdt in dict.fromkeys((dtype, torch.float32)):
            w = torch.randn(n, device="cuda", dtype=wdt)
            b = torch.randn(n, device="cuda", dtype=wdt)
            runs = {}
            for k in range(16 // wdt.itemsize):  # every offset in a 16-byte block
                wk = torch.zeros(n + 16, device="cuda", dtype=wdt)[k : k + n].copy_(w)
                bk = torch.zeros(n + 16, device="cuda", dtype=wdt)[k : k + n].copy_(b)
                with torch.no_grad():
                    runs[k] = [
                        rownorm.rms_norm(x, wk),
                        rownorm.layer_norm(x, wk, bk),
                        *rownorm.add_rms_norm(x, r, wk),
                    ]
            for k, outs in runs.items():
                for i, (a, c) in enumerate(zip(runs[0], outs, strict=True)):
                    assert torch.equal(a, c), (n, wdt, k, i)


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_cluster_register_rows_stage_parameters_at_any_offset(dtype, monkeypatch):
    """The cluster tier's register rows of aligned problems stage their parameters per row in
    shared memory (row_views.cuh's StagedParamSlices): 16-byte asynchronous copies where every
    given parameter is 16-byte aligned, element loads where one is not. With the register
    kernel forced (ROWNORM_CLUSTER_ROWS=registers), at every cluster edge of whole packs, a
    weight and a bias at every element offset into a buffer, in the row's dtype and in float32,
    give the bits of offset 0, which are those of the plan's kernel; each forward also against
    the float64 reference."""

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the cluster tier runs on sm_90+")
    vec = pack_width(dtype.itemsize)
    lengths = _aligned_cluster_lengths(dtype)
    for n in lengths:
        x = scaled_rows(2 * vec + 3, n, dtype, "cuda")
        r = torch.randn_like(x)
        for wdt in dict.fromkeys((dtype, torch.float32)):
            g = torch.Generator(device="cuda").manual_seed(n)
            w = torch.randn(n, device="cuda", dtype=wdt, generator=g)
            b = torch.randn(n, device="cuda", dtype=wdt, generator=g)
            runs = {}
            for k in range(16 // wdt.itemsize):  # every offset in a 16-byte block
                wk = torch.zeros(n + 16, device="cuda", dtype=wdt)[k : k + n].copy_(w)
                bk = torch.zeros(n + 16, device="cuda", dtype=wdt)[k : k + n].copy_(b)
                monkeypatch.setenv("ROWNORM_CLUSTER_ROWS", "registers")
                with torch.no_grad():
                    runs[k] = _forwards_with_params(x, wk, bk, r)
            monkeypatch.delenv("ROWNORM_CLUSTER_ROWS")
            with torch.no_grad():
                planned = _forwards_with_params(x, w, b, r)
            for k, outs in runs.items():
                for i, (a, c) in enumerate(zip(planned, outs, strict=True)):
                    assert torch.equal(a, c), (n, wdt, k, i)
            eps = torch.finfo(torch.float32).eps  # rms_norm's default, F.rms_norm's
            xd, wd, bd, hd = x.double(), w.double(), b.double(), (x + r).double()
            want = [
                xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * wd,
                torch.nn.functional.layer_norm(xd, (n,), wd, bd, 1e-5),
                hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + eps) * wd,
            ]
            for i, (got, ref) in enumerate(zip(planned, want, strict=False)):
                assert_matches(got, ref.to(got.dtype), dim=-1, what=f"n={n} w={wdt} output {i}")


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_cta_parameters_read_per_row(dtype, monkeypatch):
    """The CTA tier's forwards read their per-column parameters in every row on every GPU,
    whatever ROWNORM_CLUSTER_ROWS asks (dispatch.cuh's PlanCtaKernel: a copy kept per CTA
    measured slower on the H100 and the H200): no ``params=once`` plan at any CTA-tier edge,
    aligned or odd, for rms_norm, layer_norm and add_rms_norm, and with the knob set to
    ``params`` the bits of the unset plan, with more rows than the device holds CTAs and a
    weight and a bias that start mid-pack."""
    import rownorm

    elem = dtype.itemsize
    vec = pack_width(elem)
    lengths = [n for n in tier_edge_lengths(elem) if plan_row_tier(n, vec).tier == "cta"]
    assert lengths
    for n in lengths:
        rows = max(3, (1 << 23) // n)
        x = scaled_rows(rows, n, dtype, "cuda")
        g = torch.Generator(device="cuda").manual_seed(n)
        w = torch.randn(n + 1, device="cuda", dtype=dtype, generator=g)[1:]
        b = torch.randn(n + 1, device="cuda", dtype=dtype, generator=g)[1:]
        runs = {}
        for kind in ("params", ""):
            monkeypatch.setenv("ROWNORM_CLUSTER_ROWS", kind)
            plans = {
                op: rownorm.explain(x, op) for op in ("rms_norm", "layer_norm", "add_rms_norm")
            }
            assert all(p.params is None for p in plans.values()), (n, plans)
            torch.manual_seed(n)  # add_rms_norm's residual: the same in both runs
            runs[kind] = _forwards_with_params(x, w, b)
        for i, (a, c) in enumerate(zip(runs[""], runs["params"], strict=True)):
            assert torch.equal(a, c), (n, i)


@cuda_only
@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_cta_held_three_per_sm(param_dtype):
    """The 512-thread x 4-pack CTA of the layer_norm and rms_norm forwards (16-bit rows of
    8193-16384) held to three CTAs per SM (CtaRowKernelBounded) where the device then holds
    more of them than of the plain kernel and the held kernel does not spill past
    kMaxHeldLocalBytes: layer_norm's aligned rows (ctas_per_sm=3), not its odd ones (their held
    kernel spills), not its backward. Against the float64 reference, with parameters of x's
    dtype and float32 ones, more rows than the device holds CTAs."""
    import rownorm

    rows = 3 * 3 * torch.cuda.get_device_properties(0).multi_processor_count + 5
    for n in (8704, 12288, 12289, 16384):
        x = scaled_rows(rows, n, torch.bfloat16, "cuda")
        g = torch.Generator(device="cuda").manual_seed(n)
        w = torch.randn(n, device="cuda", dtype=param_dtype, generator=g)
        b = torch.randn(n, device="cuda", dtype=param_dtype, generator=g)
        plan = rownorm.explain(x, "layer_norm")
        assert (plan.tier, plan.threads, plan.packs) == ("cta", 512, 4), plan.raw
        if torch.cuda.get_device_capability()[0] == 9:  # the registers ptxas gave sm_90
            assert plan.ctas_per_sm == (3 if n % 8 == 0 else None), plan.raw
            assert ("3 CTAs per SM" in str(plan)) == (n % 8 == 0)
        assert rownorm.explain(x, "layer_norm", backward=True).ctas_per_sm is None
        with torch.no_grad():
            outs = {
                "layer_norm": (
                    rownorm.layer_norm(x, w, b, eps=1e-5),
                    rownorm.reference.layer_norm(x, w, b, eps=1e-5),
                ),
                "rms_norm": (
                    rownorm.rms_norm(x, w, eps=1e-6),
                    rownorm.reference.rms_norm(x, w, eps=1e-6),
                ),
            }
        for op, (got, want) in outs.items():
            assert_matches(got, want, dim=-1, what=f"{op} N={n} params {param_dtype}")


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_flat_pack_rows_absent_params(dtype):
    """The rows that run their packs flat (row_views.cuh's CachedRow kFlatPacks: no branch per
    pack, an absent weight or bias read as a pack preset to its value): the held CTA kernels'
    aligned rows (512 x 4 held to three, the wide 512 x 8 to two, more rows than the device
    holds CTAs) and the group tier's. layer_norm with a weight alone, a bias alone and neither,
    rms_norm without a weight, against the float64 reference."""
    import rownorm

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = {  # n: (tier, packs, CTAs per SM held to, rows)
        16384: ("cta", 4, 3, 6 * sms + 7),
        12288: ("cta", 4, 3, 6 * sms + 7),
        32768: ("cta", 8, 2, 4 * sms + 7),
        256: ("group", None, None, 4100),
        1024: ("group", None, None, 4100),
    }
    for n, (tier, packs, held, rows) in shapes.items():
        x = scaled_rows(rows, n, dtype, "cuda")
        g = torch.Generator(device="cuda").manual_seed(n)
        w = torch.randn(n, device="cuda", dtype=dtype, generator=g)
        b = torch.randn(n, device="cuda", dtype=dtype, generator=g)
        plan = rownorm.explain(x, "layer_norm")
        assert plan.tier == tier, plan.raw
        if tier == "cta":
            assert (plan.threads, plan.packs) == (512, packs), plan.raw
            if torch.cuda.get_device_capability()[0] == 9:  # the registers ptxas gave sm_90
                assert plan.ctas_per_sm == held, plan.raw
        with torch.no_grad():
            for pw, pb in ((w, None), (None, b), (None, None)):
                got = rownorm.layer_norm(x, pw, pb, eps=1e-5)
                want = rownorm.reference.layer_norm(x, pw, pb, eps=1e-5)
                what = f"layer_norm N={n} weight {pw is not None} bias {pb is not None}"
                assert_matches(got, want, dim=-1, what=what)
            got = rownorm.rms_norm(x, None, eps=1e-6)
            want = rownorm.reference.rms_norm(x, None, eps=1e-6)
            assert_matches(got, want, dim=-1, what=f"rms_norm N={n} no weight")
        del x


@cuda_only
def test_cluster_rows_unknown_value_ignored(monkeypatch, capfd):
    """ROWNORM_CLUSTER_ROWS other than registers / shared / params is ignored (the plan and the
    bits of the unset choice), said once on stderr."""
    import rownorm

    vec = pack_width(2)
    n = next(m for m in tier_edge_lengths(2) if plan_row_tier(m, vec).tier == "cluster")
    x = scaled_rows(3, n, torch.bfloat16, "cuda")
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    runs, plans = {}, {}
    for kind in ("", "bogus"):
        monkeypatch.setenv("ROWNORM_CLUSTER_ROWS", kind)
        plans[kind] = rownorm.explain(x, "rms_norm").raw
        runs[kind] = rownorm.rms_norm(x, w)
    assert plans["bogus"] == plans[""]
    assert torch.equal(runs["bogus"], runs[""])
    assert "ROWNORM_CLUSTER_ROWS=bogus is not one of" in capfd.readouterr().err


# Every case's outputs (forwards, and the gradients of rms_norm, layer_norm, add_rms_norm and
# l2_normalize) saved to argv[1]; the rows: the group tier (256, 1000, 1024), the CTA tier (4096,
# 8191, 8192), rows that start two elements past a 16-byte boundary (head scalars: a line
# shared by two rows), and contiguous rows, whose parameter gradients run the fused sums.
_L2_KEEP_CODE = """
import sys
outs = {}
for dt in (torch.bfloat16, torch.float32):
    for n in (256, 1000, 1024, 4096, 8191, 8192):
        g = torch.Generator(device="cuda").manual_seed(n)
        base = torch.randn(301, n + 2, device="cuda", dtype=dt, generator=g)
        w = torch.randn(n, device="cuda", dtype=dt, generator=g)
        b = torch.randn(n, device="cuda", dtype=dt, generator=g)
        dy = torch.randn(301, n, device="cuda", dtype=dt, generator=g)
        for rows in ("shift0", "shift2", "contiguous"):
            x = base[:, 2:].contiguous() if rows == "contiguous" else base[:, int(rows[-1]):][:, :n]
            key = f"{dt} {n} {rows}"
            with torch.no_grad():
                outs[key + " softmax"] = rownorm.softmax(x, -1)
            xg, rg, wg, bg = (t.clone().requires_grad_() for t in (x, dy.flip(0), w, b))
            y = rownorm.l2_normalize(xg, -1)
            outs[key + " l2"] = (y.detach(), *torch.autograd.grad(y, (xg,), dy))
            y = rownorm.rms_norm(xg, wg)
            outs[key + " rms"] = (y.detach(), *torch.autograd.grad(y, (xg, wg), dy))
            y, h = rownorm.add_rms_norm(xg, rg, wg)
            grads = torch.autograd.grad((y, h), (xg, rg, wg), (dy, dy.roll(1, 0)))
            outs[key + " add_rms"] = (y.detach(), h.detach(), *grads)
            y = rownorm.layer_norm(xg, wg, bg)
            outs[key + " ln"] = (y.detach(), *torch.autograd.grad(y, (xg, wg, bg), dy))
torch.save(outs, sys.argv[1])
"""


@cuda_only
def test_rows_kept_in_l2_give_the_same_bits(tmp_path):
    """The group and CTA tiers load a row's input 0 with L2's evict_last priority on fast GPUs
    and release its lines once the row is stored (plan.h's KeepsRowInputInL2; forced on and
    off by ROWNORM_L2_KEEP): a cache hint, so every output and gradient has the same bits
    either way, on aligned rows, rows that share a line with the next, and the fused parameter
    gradients' rows."""
    got = {}
    for keep in ("0", "1"):
        path = tmp_path / f"keep{keep}.pt"
        run_logged(_L2_KEEP_CODE, str(path), env={"ROWNORM_L2_KEEP": keep})
        got[keep] = torch.load(path)
    assert got["0"].keys() == got["1"].keys()
    for key, off in got["0"].items():
        on = got["1"][key]
        for a, b in zip(
            off if isinstance(off, tuple) else (off,),
            on if isinstance(on, tuple) else (on,),
            strict=True,
        ):
            assert torch.equal(a, b), key


# (op, n, backward, param_grads) of a bf16 problem of 4096 rows, and whether its plan keeps input
# 0 in L2 with ROWNORM_L2_KEEP=1: the ops that opt in (OpTraits::kKeepsInputInL2) on the group
# tier and the CTAs of up to 256 threads do; the CTAs of 512, the fused parameter gradients'
# kernels (measured slower) and the other ops do not.
_L2_PLAN_CASES = [
    (("rms_norm", 1024, False, False), True),
    (("rms_norm", 8192, False, False), True),
    (("rms_norm", 16384, False, False), False),
    (("add_rms_norm", 4096, False, False), True),
    (("rms_norm", 4096, True, True), False),
    (("rms_norm", 8192, True, True), False),
    (("rms_norm", 1024, True, True), False),
    (("rms_norm", 4096, True, False), True),
    (("add_rms_norm", 2048, True, True), False),
    (("add_rms_norm", 2048, True, False), True),
    (("layer_norm", 1024, False, False), False),
    (("layer_norm", 4096, True, True), False),
    (("softmax", 1024, False, False), False),
]
# The plans (explain's l2) of the cases in argv[1] (JSON), printed in order as "l2 said" (said: 1
# where str(plan) tells it).
_L2_PLAN_CODE = """
import json, sys
for op, n, backward, grads in json.loads(sys.argv[1]):
    x = torch.empty(4096, n, device="cuda", dtype=torch.bfloat16)
    plan = rownorm.explain(x, op, backward=backward, param_grads=grads)
    print(plan.l2, int("held in L2" in str(plan)))
"""


@cuda_only
def test_l2_keep_follows_the_plan():
    """The plans keep input 0 in L2 where _L2_PLAN_CASES says, with ROWNORM_L2_KEEP=1 (and say
    so in str(plan)); none does with 0."""
    cases = json.dumps([case for case, _ in _L2_PLAN_CASES])
    for keep in ("0", "1"):
        out = run_logged(_L2_PLAN_CODE, cases, env={"ROWNORM_L2_KEEP": keep}).stdout.split()
        assert len(out) == 2 * len(_L2_PLAN_CASES), out
        got = zip(out[::2], out[1::2], strict=True)
        for (case, kept), (value, said) in zip(_L2_PLAN_CASES, got, strict=True):
            want = kept and keep == "1"
            assert (value, said) == ("keep" if want else "None", str(int(want))), (keep, case)
