"""rownorm.explain, the tier table behind it (rownorm::plan_row_tier) and ROWNORM_LOG_PLAN.

The expected tiers are derived from the table itself, through properties the table documents
(src/kernels/common/plan.h): the configuration chosen for n holds the row; the plan changes
only at powers of two, where the smaller configuration is exactly full; the 16-bit table is the
fp32 one at twice the lengths (it is written in 16-byte packs). On a GPU, explain must then give
the table's plan at every such edge and one past it.
"""

from __future__ import annotations

import os

import pytest
import rownorm
import torch
from utils import HAS_CUDA, cuda_only, dram_gbps_per_sm, run_logged, slice_chunk_rows

EXPLAINED_OPS = (
    "l2_normalize",
    "l1_normalize",
    "rms_norm",
    "add_rms_norm",
    "layer_norm",
    "softmax",
    "log_softmax",
)
PARAM_OPS = ("rms_norm", "add_rms_norm", "layer_norm")
TIER_ORDER = ("group", "cta", "cluster", "streaming")
MAX_LOG2 = 21  # past the largest cached configuration of every element size


def table(
    n: int,
    elem_size: int,
    clusters: bool = True,
    wide: bool = True,
    packs: int = 8,
    wide_packs: int = 0,
) -> dict[str, str]:
    raw = torch.ops.rownorm.plan_row_tier(n, elem_size, clusters, wide, packs, wide_packs)
    words = dict(w.split("=", 1) for w in raw.split())
    del words["rows"], words["n"]
    return words


def capacity(plan: dict[str, str]) -> float:
    """Elements a configuration holds in registers (streaming: any number)."""
    if plan["tier"] == "streaming":
        return float("inf")
    per_row = int(plan.get("lanes_per_row", plan["threads"])) * int(plan.get("cluster", 1))
    return per_row * int(plan["packs"]) * int(plan["vec"])


def tier_edges(
    elem_size: int, clusters: bool, wide: bool, packs: int = 8, wide_packs: int = 0
) -> list[int]:
    """The lengths n where the table's plan for n + 1 differs from the plan for n."""
    return [
        1 << k
        for k in range(MAX_LOG2)
        if table(1 << k, elem_size, clusters, wide, packs, wide_packs)
        != table((1 << k) + 1, elem_size, clusters, wide, packs, wide_packs)
    ]


TABLES = [
    pytest.param(
        e,
        c,
        w,
        p,
        wp,
        id=f"{e}B-{'clusters' if c else 'noclusters'}-{'wide' if w else 'narrow'}-{p}packs"
        + (f"-wide{wp}" if wp else ""),
    )
    for e in (2, 4)
    for c in (True, False)
    for w in (True, False)
    for p, wp in ((8, 0), (4, 0), (4, 8))
]


# ---- the table (CPU: no GPU needed) ----


@pytest.mark.parametrize(("elem_size", "clusters", "wide", "packs", "wide_packs"), TABLES)
def test_table_edges_are_full_configurations(elem_size, clusters, wide, packs, wide_packs):
    def plan(n):
        return table(n, elem_size, clusters, wide, packs, wide_packs)

    edges = tier_edges(elem_size, clusters, wide, packs, wide_packs)
    assert edges, "the table never changes plan"
    for k in range(MAX_LOG2):
        lo, hi = (1 << k) + 1, 1 << (k + 1)
        # Between consecutive powers of two the plan is constant: every edge is a power of two.
        assert plan(lo) == plan(hi), (lo, hi)
    for m in edges:
        below, above = plan(m), plan(m + 1)
        assert capacity(below) == m, f"edge {m}: {below} is not exactly full"
        assert capacity(above) > m
        assert TIER_ORDER.index(below["tier"]) <= TIER_ORDER.index(above["tier"])
    assert plan(1 << MAX_LOG2)["tier"] == "streaming"
    # 4 packs a thread on twice the CTAs hold what 8 packs hold: the same edges
    assert edges == tier_edges(elem_size, clusters, wide)


@pytest.mark.parametrize(("elem_size", "clusters", "wide", "packs", "wide_packs"), TABLES)
def test_table_plan_holds_the_row(elem_size, clusters, wide, packs, wide_packs):
    vec = 16 // elem_size
    # the 4-pack rows' last shape: 16 CTAs of 512, or of 256 where the wide cluster keeps 8
    half_end = 16 * (256 if wide_packs == 8 else 512) * 4 * vec
    for k in range(MAX_LOG2):
        for n in {1 << k, (1 << k) + 1, 3 << k}:
            plan = table(n, elem_size, clusters, wide, packs, wide_packs)
            assert int(plan["vec"]) == vec
            assert capacity(plan) >= n, (n, plan)
            if plan["tier"] == "cluster":
                assert clusters, (n, plan)
                # 4 packs a thread on 8 and 16 CTAs of 256, then on 16 of 512 (not with
                # wide_packs = 8): rows past two CTAs of 256 x 8 packs that the last holds
                half = 2 * 256 * 8 * vec < n <= half_end
                assert plan["packs"] == str(4 if packs == 4 and half else 8), (n, plan)
                if plan["packs"] == "4":
                    assert plan["cluster"] in ("8", "16"), (n, plan)
                    on_512 = n > 16 * 256 * 4 * vec
                    assert plan["threads"] == ("512" if on_512 else "256"), (n, plan)
                    assert plan["cluster"] == "16" or not on_512, (n, plan)
            if plan["tier"] == "cta" and int(plan["threads"]) * int(plan["packs"]) >= 4096:
                assert wide, f"the wide CTA planned for an op without it: {n}, {plan}"
            if plan["tier"] == "streaming" and clusters:
                # every op runs the wide cluster: only rows past it stream
                assert n > 16 * 512 * 8 * vec, (n, plan)


@pytest.mark.parametrize("clusters", [True, False])
@pytest.mark.parametrize("wide", [True, False])
def test_table_is_written_in_packs(clusters, wide):
    fp32 = tier_edges(4, clusters, wide)
    half = tier_edges(2, clusters, wide)
    # The same edges in packs, but for the fp32 group of 4 lanes: a group is at least 4 lanes
    # and at least one pack (8 16-bit elements) wide, so 16-bit groups start at 8 lanes.
    assert half == [2 * m for m in fp32 if table(m, 4, clusters, wide).get("lanes_per_row") != "4"]


def test_table_float64_streams():
    for n in (1, 64, 4096, 1 << 20):
        plan = table(n, 8)
        assert plan["tier"] == "streaming" and plan["vec"] == "2"


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 4), "n must be >= 1, got 0"),
        ((16, 3), "elem_size must be 2, 4 or 8"),
        ((16, 2, True, True, 6), "cluster_packs must be 8 or 4, got 6"),
        ((16, 2, True, True, 8, 4), "wide_cluster_packs must be 0, 8 or cluster_packs"),
    ],
)
def test_table_bad_arguments(args, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.rownorm.plan_row_tier(*args)


# ---- explain on the CPU, and its arguments ----


@pytest.mark.parametrize("op", EXPLAINED_OPS)
def test_explain_cpu(op):
    x = torch.randn(3, 4, 5)
    dim = -1 if op == "add_rms_norm" else 1
    plan = rownorm.explain(x, op, dim)
    assert plan.path == "cpu" and plan.tier is None
    assert (plan.rows, plan.n) == ((12, 5) if op == "add_rms_norm" else (15, 4))
    assert (plan.op, plan.device, plan.dtype, plan.backward) == (op, "cpu", x.dtype, False)
    assert "CPU" in str(plan) and op in str(plan)
    if op in PARAM_OPS:
        bwd = rownorm.explain(x, op, dim, backward=True, param_grads=True)
        assert bwd.path == "cpu" and bwd.backward


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(op="rms"), "op must be one of l2_normalize, l1_normalize, rms_norm.*got 'rms'"),
        (dict(op="rms_norm", dim=2), r"dim must be in \[-2, 1\] for a 2-d x, got 2"),
        (dict(op="add_rms_norm", dim=0), "add_rms_norm normalizes the last dim only"),
        (dict(op="rms_norm", param_grads=True), "param_grads=True needs backward=True"),
        (dict(op="softmax", backward=True, param_grads=True), "an op with parameters"),
    ],
)
def test_explain_bad_arguments(kwargs, match):
    with pytest.raises(RuntimeError, match=match):
        rownorm.explain(torch.randn(2, 8), **kwargs)


def test_explain_bad_input():
    with pytest.raises(RuntimeError, match="x must be float32, float16, bfloat16 or float64"):
        rownorm.explain(torch.ones(2, 8, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="at least one dimension"):
        rownorm.explain(torch.tensor(1.0))


def _logged(code: str) -> list[str]:
    return [line for line in run_logged(code).stderr.splitlines() if line.startswith("rownorm: ")]


def test_log_plan_cpu():
    lines = _logged("rownorm.rms_norm(torch.randn(3, 8), dim=-1)")
    assert lines == ["rownorm: rms_norm: rows=3 n=8 path=cpu"]


# ---- explain on a GPU: the table's plan at every edge ----


def _gpu_table_args(op: str, backward: bool, elem: int) -> tuple[bool, bool, int, int]:
    """(clusters, wide, packs, wide_packs) the launcher plans with: clusters on sm_90+ unless
    ROWNORM_DISABLE_CLUSTERS; the wide CTA unless the op sets kWideCta = false (the LayerNorm
    backward and the three-input RMSNorm backward of add_rms_norm: layer_norm.cuh,
    rms_norm.cuh); 4 packs a thread on the cluster tier for the 16-bit LayerNorm and RMSNorm
    backward and add_rms_norm's 16-bit forward (kClusterPacks), whose wide cluster keeps 8
    (kWideClusterPacks)."""
    clusters = torch.cuda.get_device_capability()[0] >= 9 and os.environ.get(
        "ROWNORM_DISABLE_CLUSTERS", "0"
    ) in ("", "0")
    wide = not (backward and op in ("layer_norm", "add_rms_norm"))
    half = op in ("layer_norm", "rms_norm") if backward else op == "add_rms_norm"
    packs = 4 if half and elem == 2 else 8
    wide_packs = 8 if packs == 4 and not backward else 0
    return clusters, wide, packs, wide_packs


def _row_words(plan: rownorm.Plan) -> dict[str, str]:
    words = dict(w.split("=", 1) for w in plan.raw.split())
    # stages, params, ctas_per_sm, l2: set per op by the launcher, not by the table
    for key in ("rows", "n", "param_grads", "chunks", "stages", "params", "ctas_per_sm", "l2"):
        words.pop(key, None)
    return words


@cuda_only
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("op", EXPLAINED_OPS)
def test_explain_follows_the_table(op, dtype, backward):
    elem = torch.empty((), dtype=dtype).element_size()
    clusters, wide, packs, wide_packs = _gpu_table_args(op, backward, elem)
    edges = tier_edges(elem, clusters, wide, packs, wide_packs)
    for m in edges:
        for n in (m, m + 1):
            plan = rownorm.explain(
                torch.randn(2, n, dtype=dtype, device="cuda"), op, -1, backward=backward
            )
            assert plan.path == "rows" and (plan.rows, plan.n) == (2, n)
            expected = table(n, elem, clusters, wide, packs, wide_packs)
            assert _row_words(plan) == expected, (op, n, plan.raw)
    # ... so the tier changes exactly at the edges.
    tiers = [
        rownorm.explain(torch.randn(1, m + d, dtype=dtype, device="cuda"), op, backward=backward)
        for m in edges
        for d in (0, 1)
    ]
    for below, above in zip(tiers[::2], tiers[1::2], strict=True):
        assert _row_words(below) != _row_words(above)


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("op", PARAM_OPS)
def test_explain_param_grads(op, dtype):
    elem = torch.empty((), dtype=dtype).element_size()
    clusters, wide, cluster_packs, _ = _gpu_table_args(op, True, elem)
    sums = 2 if op == "layer_norm" else 1
    for m in tier_edges(elem, clusters, wide, cluster_packs):
        plan = rownorm.explain(
            torch.randn(40, m, dtype=dtype, device="cuda"), op, backward=True, param_grads=True
        )
        row = table(m, elem, clusters, wide, cluster_packs)
        # The fused path (plan.h, PlanFusedSums): rows the table gives a 4-pack CTA or a warp
        # x 8 packs run as a 2-pack CTA: two sums (layer_norm) up to 512 threads x 2 packs,
        # staged, on 64-row chunks; one sum up to 384 threads x 2 packs, and up to 512 with
        # three row inputs (add_rms_norm); longer 4-pack CTA rows with one sum as they are;
        # 4-pack groups on the table's lanes.
        vec = 16 // elem
        cta4 = row["tier"] == "cta" and row.get("packs") == "4"
        warp8 = row["tier"] == "group" and row.get("packs") == "8"
        # 16-bit rows of 512 threads x 4 packs, and two sums of 256 x 4 past 384 x 2 packs
        # (plan.h, SliceSums256x4): slice sums (as the wide CTA), which 40 rows, too few
        # chunks to keep the GPU busy, leave to the two-pass path.
        slice_cta4 = cta4 and elem < 4 and (m > 256 * 4 * vec or (sums == 2 and m > 384 * 2 * vec))
        limit = 512 if sums == 2 or op == "add_rms_norm" else 384
        two_pack = (cta4 or warp8) and m <= limit * 2 * vec and not slice_cta4
        group4 = row["tier"] == "group" and row.get("packs") == "4"
        # fp32 layer_norm rows of 512 threads x 4 packs: staged as well.
        wide_two = cta4 and sums == 2 and elem == 4 and not two_pack and m <= 512 * 4 * vec
        fused = two_pack or (cta4 and sums == 1 and not slice_cta4) or group4 or wide_two
        assert plan.param_grads == ("fused" if fused else "two-pass"), (m, plan.raw)
        if group4:
            lanes = int(row["lanes_per_row"])
            assert f"tier=group vec={vec} lanes_per_row={lanes} " in plan.raw, (m, plan.raw)
            # one partial per CTA: its 128 / lanes groups' 16 rows each (kFusedGroupRows)
            assert plan.chunk_rows == 128 // lanes * 16 and plan.chunks == 1, (m, plan.raw)
            # one CTA: each group brings its next row into L2 (GroupSumsPrefetchNextRow)
            assert plan.prefetch == ("next_row" if clusters else None), (m, plan.raw)
        if two_pack:
            # 320 and 384 threads where they hold the row, but for add_rms_norm's 16-bit rows
            filled = [128, 256] + ([320, 384] if op != "add_rms_norm" or elem == 4 else [])
            threads = next((t for t in filled if m <= t * 2 * vec), 512)
            assert f"tier=cta vec={vec} threads={threads} packs=2 " in plan.raw, (m, plan.raw)
            assert plan.stages == (2 if sums == 2 else None), (m, plan.raw)
        if wide_two:
            assert f"tier=cta vec={vec} threads=512 packs=4 stages=2 " in plan.raw, (m, plan.raw)
        if (two_pack or cta4) and fused:
            # One sum: 16-row CTAs in clusters of 4 (sm_90+) that add their sums into one
            # 64-row partial, where the exchange (threads x packs x vec fp32) fits 32 KB, on
            # 2-pack rows and 16-bit 4-pack rows.
            threads, packs = (int(plan.threads), int(plan.packs))
            clustered = (
                sums == 1
                and clusters
                and threads * packs * vec * 4 <= 32 * 1024
                and (packs == 2 or elem < 4)
            )
            rows = 64 if sums == 2 or clustered else 16
            assert plan.chunk_rows == rows, (m, plan.raw)
            assert plan.cluster == (4 if clustered else None), (m, plan.raw)
            assert plan.chunks == -(-40 // rows), (m, plan.raw)
            # One sum on 4-pack rows (a row at a time): each row's next row brought into L2 on
            # 16-bit rows of 256 threads and fp32 rows of 512 (plan.h, CtaSumsPrefetchNextRow).
            ahead = sums == 1 and packs == 4 and clusters and threads == (512 if elem == 4 else 256)
            assert plan.prefetch == ("next_row" if ahead else None), (m, plan.raw)
        if fused:
            assert plan.chunks >= 1
        else:
            assert _row_words(plan) == row


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_explain_group_sums_prefetch_under_two_ctas_per_sm(dtype):
    """The group sums bring each group's next row into L2 where their grid, a CTA per chunk,
    puts at most two CTAs on each SM (plan.h, GroupSumsPrefetchNextRow; sm_90+): on at most
    2 x SMs chunks, not one more."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    clusters, *_ = _gpu_table_args("rms_norm", True, dtype.itemsize)
    for n in (64, 256 // dtype.itemsize * 4):
        probe = rownorm.explain(torch.empty(1, n, dtype=dtype, device="cuda"), "rms_norm")
        lanes = int(probe.lanes_per_row)
        chunk_rows = 128 // lanes * 16
        for chunks in (2 * sms, 2 * sms + 1):
            x = torch.empty(chunks * chunk_rows, n, dtype=dtype, device="cuda")
            plan = rownorm.explain(x, "rms_norm", backward=True, param_grads=True)
            assert (plan.tier, plan.chunks) == ("group", chunks), (n, plan.raw)
            ahead = clusters and chunks <= 2 * sms
            assert plan.prefetch == ("next_row" if ahead else None), (n, chunks, plan.raw)


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_explain_layer_norm_slice_sums_of_256x4_rows(dtype):
    """layer_norm's 16-bit rows of 256 threads x 4 packs (4097-8192) sum their columns in
    shared memory (params=once) where rows are in phase or past 384 x 2 packs (plan.h,
    SliceSums256x4) and the chunks keep the GPU busy; aligned rows of up to 384 x 2 packs
    stay staged, and so does rms_norm's one sum (the CTA sums)."""
    rows = 1 << 14
    for n, slices in ((4097, True), (6143, True), (6144, False), (6152, True), (8192, True)):
        x = torch.empty(rows, n, dtype=dtype, device="cuda")
        plan = rownorm.explain(x, "layer_norm", backward=True, param_grads=True)
        assert (plan.tier, plan.param_grads) == ("cta", "fused"), (n, plan.raw)
        if slices:
            assert (plan.threads, plan.packs, plan.params) == (256, 4, "once"), (n, plan.raw)
            # 32-row chunks; on aligned rows 2-8x as long where they fill the teams' waves
            chunk = 32 if n % 8 else slice_chunk_rows(rows, 32, plan.teams)
            assert plan.stages is None and plan.chunk_rows == chunk, (n, plan.raw)
            assert plan.row_classes == (None if n % 8 == 0 else 8), (n, plan.raw)
        else:
            assert (plan.threads, plan.packs, plan.stages) == (384, 2, 2), (n, plan.raw)
        rms = rownorm.explain(x, "rms_norm", backward=True, param_grads=True)
        assert rms.params is None, (n, rms.raw)
    # too few chunks for the slice sums' CTAs: the two-pass path, as for the other slice rows
    plan = rownorm.explain(
        torch.empty(40, 8192, dtype=dtype, device="cuda"),
        "layer_norm",
        backward=True,
        param_grads=True,
    )
    assert plan.param_grads == "two-pass", plan.raw


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_explain_one_sum_slices_pipelined(dtype):
    """One column sum (rms_norm, add_rms_norm) of whole 16-bit rows of 512 threads x 4 packs
    where every thread owns at least three packs (n >= 12288) runs the slice sums with the next
    row's loads in flight (plan.h, SliceSumsPipelined: prefetch=next_row_loads); shorter rows,
    rows in phase, layer_norm's two sums and the float32 rows of that length do not."""
    rows = 1 << 14
    cases = ((12288, True), (16384, True), (12280, False), (10240, False), (16383, False))
    for op in ("rms_norm", "add_rms_norm"):
        for n, piped in cases:
            x = torch.empty(rows, n, dtype=dtype, device="cuda")
            plan = rownorm.explain(x, op, backward=True, param_grads=True)
            assert (plan.tier, plan.threads, plan.packs) == ("cta", 512, 4), (op, n, plan.raw)
            assert (plan.param_grads, plan.params) == ("fused", "once"), (op, n, plan.raw)
            assert (plan.prefetch == "next_row_loads") == piped, (op, n, plan.raw)
            if piped:
                assert "the next row's loads in flight" in str(plan), str(plan)
    for op, dt in (("layer_norm", dtype), ("rms_norm", torch.float32)):
        plan = rownorm.explain(
            torch.empty(rows, 16384, dtype=dt, device="cuda"), op, backward=True, param_grads=True
        )
        assert plan.param_grads == "fused" and plan.prefetch != "next_row_loads", (op, plan.raw)


@cuda_only
def test_explain_misaligned_and_strided():
    x = torch.randn(4, 257, device="cuda", dtype=torch.bfloat16)[:, 1:]  # rows of 256, offset 1
    plan = rownorm.explain(x, "rms_norm")
    assert (plan.tier, plan.vec) == ("streaming", 1)
    x = torch.randn(4, 64, 256, device="cuda", dtype=torch.bfloat16)
    assert (rownorm.explain(x, "rms_norm", 1).path, rownorm.explain(x, "rms_norm", 1).kernel) == (
        "strided",
        "packed",
    )
    assert (
        rownorm.explain(torch.randn(4, 65, 256, device="cuda"), "rms_norm", 1).kernel == "streamed"
    )
    assert rownorm.explain(torch.empty(0, 8, device="cuda"), "softmax").path == "empty"


@cuda_only
def test_explain_two_per_sm_and_prefetch_stages():
    # The wide CTA (512 threads x 8 packs: bf16 rows of 16385..32768, fp32 8193..16384) two per
    # SM: softmax / log_softmax forwards and 16-bit layer_norm's, not float32 layer_norm's, not
    # rms_norm, not a backward, not 512 x 4 packs; where kept parameters are planned (the wide
    # CTA's forwards with parameters on GPUs of >= 30 GB/s of DRAM bandwidth per SM), only if
    # the device holds as many of those CTAs.
    for dtype, n in ((torch.bfloat16, 32768), (torch.float32, 16384)):
        rows = torch.randn(2, n, device="cuda", dtype=dtype)
        for op in ("softmax", "log_softmax", "layer_norm"):
            plan = rownorm.explain(rows, op)
            assert (plan.tier, plan.threads, plan.packs) == ("cta", 512, 8), plan.raw
            two = op != "layer_norm" or dtype == torch.bfloat16
            assert plan.ctas_per_sm == (2 if two else None), plan.raw
            assert plan.stages is None and (plan.params is None or not two), plan.raw
            assert ("2 CTAs per SM" in str(plan)) == two
            assert rownorm.explain(rows, op, backward=True).ctas_per_sm is None
        assert rownorm.explain(rows, "rms_norm").ctas_per_sm is None
        assert rownorm.explain(rows[:, : n // 2], "softmax").ctas_per_sm is None  # 512 x 4 packs
    # Packed strided tiles of one-input ops (forwards) kept in flight into shared memory.
    x = torch.randn(4, 64, 256, device="cuda", dtype=torch.bfloat16)
    plan = rownorm.explain(x, "rms_norm", 1)
    assert (plan.kernel, plan.stages) == ("packed", 2) and "next 2 tiles" in str(plan)
    assert rownorm.explain(x, "rms_norm", 1, backward=True).stages is None
    # 4-byte tiles only on GPUs of at least 30 GB/s of DRAM bandwidth per SM (the H200, not
    # the H100)
    x = torch.randn(4, 64, 256, device="cuda")
    plan = rownorm.explain(x, "rms_norm", 1)
    assert plan.kernel == "packed", plan.raw
    assert plan.stages == (2 if dram_gbps_per_sm() >= 30 else None), (dram_gbps_per_sm(), plan.raw)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.cuda
def test_log_plan_matches_explain():
    code = (
        "x = torch.randn(6, 4096, device='cuda', dtype=torch.bfloat16)\n"
        "rownorm.rms_norm(x)\n"
        "print(rownorm.explain(x, 'rms_norm').raw)\n"
    )
    run = run_logged(code)
    logged = [line for line in run.stderr.splitlines() if line.startswith("rownorm: rms_norm:")]
    assert len(logged) == 1
    words = dict(w.split("=", 1) for w in logged[0].split(": ", 2)[2].split())
    assert words == dict(w.split("=", 1) for w in run.stdout.split())
