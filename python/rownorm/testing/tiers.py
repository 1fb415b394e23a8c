"""The CUDA tier table as the tests see it, for choosing test lengths.

:func:`plan_row_tier` asks the library's own planner (``PlanRowTier`` in
``src/kernels/common/plan.h``, exposed as ``torch.ops.rownorm.plan_row_tier``, host code that
runs without a GPU) which kernel configuration a row of ``n`` elements gets, from the row
length and the element size only. The tests do not assert which tier the kernels pick (that is
the table's business); they take their row lengths from the boundaries it has, so that every
boundary of every element size is tested at and just above it, and a change of the
table moves the lengths with it: there is no second copy of the table to keep in step.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

PACK_BYTES = 16  # the widest vector pack: 16 bytes


class RowPlan(NamedTuple):
    """A kernel configuration: ``tier`` (group / cta / cluster / streaming) and its shape."""

    tier: str
    width: int = 0  # group: threads per row
    threads: int = 0  # threads per CTA
    cluster: int = 0  # cluster: CTAs per row
    packs: int = 0  # packs per thread


def pack_width(elem_size: int) -> int:
    """The full pack width of a dtype in elements (4 for fp32, 8 for 16-bit, 2 for fp64)."""
    return PACK_BYTES // elem_size


@functools.cache
def plan_row_tier(
    n: int, vec: int, clusters: bool = True, wide: bool = True, cluster_packs: int = 8
) -> RowPlan:
    """The configuration of an ``n``-element row at the full pack width ``vec``. ``clusters``:
    sm_90+; ``wide``: the op runs the wide CTA, one CTA of 512 threads x 8 packs (the backward
    of layer_norm and add_rms_norm runs 2-CTA clusters there instead); ``cluster_packs``: packs
    a thread of the op's cluster rows (4 for layer_norm's 16-bit backward, on twice the CTAs).
    float64 rows never reach this table: they always stream (see :func:`tier_edge_lengths`)."""
    import rownorm  # noqa: F401  (loads the library that defines the op)

    words = torch.ops.rownorm.plan_row_tier(
        n, PACK_BYTES // vec, clusters, wide, cluster_packs
    ).split()
    fields = dict(w.split("=", 1) for w in words)
    return RowPlan(
        fields["tier"],
        int(fields.get("lanes_per_row", 0)),
        int(fields.get("threads", 0)),
        int(fields.get("cluster", 0)),
        int(fields.get("packs", 0)),
    )


def tier_boundaries(elem_size: int) -> list[int]:
    """The largest row length of every configuration of the table, ascending: the lengths at
    which :func:`plan_row_tier` changes its answer (with clusters, wide shapes allowed).

    Plans are monotone in ``n`` and change only between multiples of the pack width, so each
    boundary is found by doubling past it and bisecting back, up to the first streaming length.
    """
    vec = pack_width(elem_size)
    edges, lo = [], vec
    while plan_row_tier(lo, vec).tier != "streaming":
        here, step = plan_row_tier(lo, vec), vec
        while plan_row_tier(lo + step, vec) == here:  # past the boundary
            step *= 2
        hi = lo + step  # plan(lo) == here != plan(hi)
        while hi - lo > vec:
            mid = lo + (hi - lo) // (2 * vec) * vec
            lo, hi = (mid, hi) if plan_row_tier(mid, vec) == here else (lo, mid)
        edges.append(lo)
        lo = hi
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
