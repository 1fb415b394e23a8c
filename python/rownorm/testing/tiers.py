"""A Python mirror of the CUDA tier table, for choosing test lengths.

:func:`plan_row_tier` mirrors ``PlanRowTier`` in ``src/kernels/common/dispatch.cuh`` (the one
place the tier table lives in C++): which kernel configuration a row of ``n`` elements gets,
from the row length and the element size only. The tests do not assert which tier the kernels
pick (that is the C++ table's business); they take their row lengths from the boundaries this
mirror names, so that every boundary of every element size is tested at and just above it.
When the C++ table changes, change this function with it (tests/test_tier_edges.py checks its
constants against the C++ source): the lengths follow.
"""

from __future__ import annotations

from typing import NamedTuple

WARP = 32
PACK_BYTES = 16  # the widest vector pack: 16 bytes
# The per-thread budgets of dispatch.cuh, in packs.
GROUP_VECS = 4
WIDE_GROUP_VECS = 8
CTA_VECS = 4
CTA_THREADS = (128, 256, 512)
WIDE_CTA_THREADS = 512
WIDE_CTA_VECS = 8
CLUSTER_VECS = 8
CLUSTER_THREADS = 256
CLUSTER_SIZES = (2, 4, 8, 16)
WIDE_CLUSTER_THREADS = 512


class RowPlan(NamedTuple):
    """A kernel configuration: ``tier`` (group / cta / cluster / streaming) and its shape."""

    tier: str
    width: int = 0  # group: threads per row
    threads: int = 0  # cta / cluster: threads per CTA
    cluster: int = 0  # cluster: CTAs per row
    packs: int = 0  # group / cta: packs per thread


def pack_width(elem_size: int) -> int:
    """The full pack width of a dtype in elements (4 for fp32, 8 for 16-bit, 2 for fp64)."""
    return PACK_BYTES // elem_size


def plan_row_tier(n: int, vec: int, clusters: bool = True, wide: bool = True) -> RowPlan:
    """``PlanRowTier(n, vec, clusters, wide)``: the tier of an ``n``-element row at pack width
    ``vec``. ``clusters``: sm_90+; ``wide``: the op allows the 512-thread x 8-pack shapes (the
    backward of layer_norm and add_rms_norm does not). float64 rows never reach this table:
    they always stream (see :func:`tier_edge_lengths`)."""
    if n <= WARP * GROUP_VECS * vec:
        width = max(4, vec)
        while width * GROUP_VECS * vec < n:
            width *= 2
        return RowPlan("group", width, 128, 0, GROUP_VECS)
    if n <= WARP * WIDE_GROUP_VECS * vec:
        return RowPlan("group", WARP, 128, 0, WIDE_GROUP_VECS)
    for threads in CTA_THREADS:
        if n <= threads * CTA_VECS * vec:
            return RowPlan("cta", 0, threads, 0, CTA_VECS)
    if wide and n <= WIDE_CTA_THREADS * WIDE_CTA_VECS * vec:
        return RowPlan("cta", 0, WIDE_CTA_THREADS, 0, WIDE_CTA_VECS)
    if clusters:
        for cluster in CLUSTER_SIZES:
            if n <= cluster * CLUSTER_THREADS * CLUSTER_VECS * vec:
                return RowPlan("cluster", 0, CLUSTER_THREADS, cluster)
        if wide and n <= 16 * WIDE_CLUSTER_THREADS * CLUSTER_VECS * vec:
            return RowPlan("cluster", 0, WIDE_CLUSTER_THREADS, 16)
    return RowPlan("streaming", 0, 512, 0)


def tier_boundaries(elem_size: int) -> list[int]:
    """The largest row length of every configuration of the table, ascending: the lengths at
    which :func:`plan_row_tier` changes its answer (with clusters, wide shapes allowed).

    Found by walking the table rather than listed, so they follow the mirror."""
    vec = pack_width(elem_size)
    # Every boundary is a multiple of vec below 16 x 512 x 8 packs; plans are monotone in n,
    # so a change of plan between two consecutive multiples of vec marks one.
    top = 16 * WIDE_CLUSTER_THREADS * CLUSTER_VECS * vec
    edges, prev = [], plan_row_tier(vec, vec)
    for n in range(2 * vec, top + 2 * vec, vec):
        plan = plan_row_tier(n, vec)
        if plan != prev:
            edges.append(n - vec)
            prev = plan
    return edges


def tier_edge_lengths(elem_size: int) -> list[int]:
    """Row lengths at every tier boundary of an element size: the edge itself (the largest
    row of a configuration, a whole number of packs) and one past it (the next configuration,
    odd: head or tail scalars). Each configuration is so tested aligned (at its upper edge)
    and odd (one past the edge below it). float64 (elem_size 8) always streams on CUDA, so it
    gets two lengths: an odd one and a whole number of packs."""
    if elem_size == 8:
        return [1023, 4096]
    lengths = set()
    for edge in tier_boundaries(elem_size):
        lengths.update((edge, edge + 1))
    return sorted(lengths)
