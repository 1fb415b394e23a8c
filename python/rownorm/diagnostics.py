"""Which kernel configuration a call gets: :func:`explain`, and the plan log.

Both come from the planning code the launchers run (``src/kernels/common/plan.h``, through
the ``rownorm::plan_info`` op), so they describe what launches rather than a copy of the
rules. ``ROWNORM_LOG_PLAN=1`` (read once per process) makes every launch write its plan to
stderr from C++, one line ``rownorm: <op>: rows=<rows> n=<n> <key=value words>``; C++ writes
it directly because a launch from a compiled graph has no Python frame to log through (a CUDA
graph replay runs no host code and logs nothing).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger("rownorm")

_INT_KEYS = (
    "rows",
    "n",
    "vec",
    "lanes_per_row",
    "threads",
    "cluster",
    "packs",
    "stages",
    "ctas_per_sm",
    "chunks",
    "chunk_rows",
    "warp_rows",
    "row_classes",
    "teams",
)


@dataclass(frozen=True)
class Plan:
    """The plan of one call (see :func:`explain`). Fields that do not apply are None.

    Attributes:
        op, device, dtype, backward: what was asked about.
        path: ``"rows"`` (the row tiers), ``"strided"`` (dim is not innermost in memory and
            the operands were made contiguous: the strided-dim kernels), ``"cpu"``, or
            ``"empty"`` (nothing launches).
        rows, n: the number of rows (or columns) and their length.
        tier: row tiers: ``"group"`` (several rows per CTA), ``"cta"`` (a CTA per row),
            ``"cluster"`` (a thread-block cluster per row, sm_90+) or ``"streaming"``.
        vec: elements per load (a 16-byte pack; 1 where the operands' alignment differs).
        lanes_per_row: group tier: threads per row.
        threads: threads per CTA.
        cluster: cluster tier: CTAs per row; fused sums on the CTA tier: the CTAs of a
            thread-block cluster, 16 rows each, whose column sums make one chunk partial.
        packs: 16-byte packs per thread of the row (held in registers, or with ``stages`` on
            the cluster tier, in shared memory); the row is read once.
        stages: rows (or strided tiles) kept in flight into shared memory ahead of the one
            being reduced (on the cluster tier: rows held in shared memory, put there by bulk
            copies; strided tiles of 4-byte elements only on GPUs of at least 30 GB/s of DRAM
            bandwidth per SM); None where loads go straight to registers.
        ctas_per_sm: the CTAs per SM a CTA-tier kernel is held to, where the device then
            holds more of them (one's loads in flight while another waits at its barriers):
            ``2`` for the 512-thread x 8-pack CTA of softmax / log_softmax and 16-bit
            layer_norm, ``3`` for the 512 x 4-pack CTA of layer_norm and rms_norm (forwards;
            not where the held kernel would spill registers), ``2`` for layer_norm's fused
            parameter gradients on 320 or 384 threads x 2 packs (16-bit rows, and fp32 ones
            where the plain kernel holds one CTA per SM); None elsewhere.
        params: ``"once"`` where each CTA of a persistent grid reads its columns' weight
            (and bias) once, not in every row: cluster-tier forwards on aligned rows, and
            add_rms_norm's on odd rows whose operands start alike (once per class of rows of
            one alignment), where that kernel holds about as many rows at once as the
            per-row one (on GPUs below 30 GB/s of DRAM bandwidth per SM, such as the H100,
            only where the register kernel holds too few rows to keep that bandwidth busy,
            on 16-CTA clusters, or where the parameters take more than twice the row's input
            bytes a column, as float32 ones on 16-bit layer_norm rows; at or above it, not
            on rows shorter than their cluster holds whose parameters take more than 4 bytes
            a column, nor where the register rows copy the parameters into shared memory with
            each row's loads, as rms_norm's and add_rms_norm's of the row's dtype:
            ``KeepsClusterParams`` in ``src/kernels/common/plan.h``), and the fused
            parameter gradients of rows past the CTA tier's 4 packs (column sums in shared
            memory). The CTA tier's forwards read them in every row.
        l2: ``"keep"`` where each row's input x is loaded with L2's evict_last priority and set
            back to evict_normal once the row is stored: on GPUs of at least 30 GB/s of DRAM
            bandwidth per SM (such as the H200), on the group tier and the CTAs of up to 256
            threads, for l1 / l2_normalize, rms_norm and add_rms_norm (forwards, and backwards
            without fused parameter gradients); on the strided path, where the packed kernel
            keeps its next tiles in flight (``stages``), each tile's inputs, set back once the
            tile is stored; ``ROWNORM_L2_KEEP`` overrides the device (``0`` off, any other
            value on); None where loads are plain.
        kernel: strided path: ``"packed"``, ``"cached"`` or ``"streamed"``.
        warp_rows: strided path, packed kernel: the lanes of a warp that share a column's
            d-rows (1, 2 or 4: columns of at most 8, 16, 32 elements), which reduce by
            shuffles; None where a CTA's 8 thread rows share them (longer columns).
        columns: strided path, packed kernel: ``"full"`` where every thread's 8 d-rows are in
            the column (64 elements, or 8, 16 and 32 with ``warp_rows`` 1, 2 and 4), whose
            kernels test no d-row against the column's length; None elsewhere.
        param_grads: backward with parameter gradients: ``"fused"`` (one pass writing
            per-chunk partials of the column sums) or ``"two-pass"`` (per-row statistics, then
            a second read of x and dy).
        chunks: fused: partials per column sum (on the strided path, the packed kernel's
            tiles: one partial each; the cached and streamed kernels are two-pass).
        chunk_rows: fused: rows per chunk (the rows one partial sums, in order; on the
            group tier a CTA's rows, which its groups take in turn). Sums in shared memory:
            32 16-bit / 16 fp32 rows, 2-8x as many where the rows fill the teams' waves.
        teams: fused sums in shared memory (params ``"once"``): the CTAs or clusters the
            device holds at once, each running chunks in turn (what the chunk length is
            planned for).
        prefetch: fused sums: ``"next_row"`` where each team brings its next row into L2
            while it reduces the current one (sm_90+). Sums in shared memory: the 16-CTA
            clusters of 512 threads, two sums on 16-CTA and 16-bit 4-pack clusters, two sums of
            16-bit rows that fill at most 3/4 of their team, or any such rows on GPUs of at
            least 30 GB/s of DRAM bandwidth per SM, such as the H200. The CTA tier's one sum on
            4-pack rows: 16-bit rows of 256 threads, fp32 rows of 512. The group tier: grids of
            at most two CTAs per SM. ``"next_row_loads"`` where each team issues its next
            row's loads before it reduces the current one (the sums in shared memory of one
            column sum on whole 16-bit rows of 512 threads x 4 packs, n >= 12288).
            ``"next_row_staged"`` where each team copies its next row into shared memory
            (bulk copies) while it reduces the current one (the cluster tier's whole 16-bit
            rows: one column sum, and two where the staged CTAs fit as many per SM). None
            elsewhere.
        sums: fused sums on a team that reads the parameters once (params ``"once"``):
            ``"registers"`` where each thread holds its columns' sums in registers (layer_norm's
            whole 16-bit rows of 512 threads x 4 packs, 8193-16384 elements); None where they
            are kept in shared memory.
        row_classes: fused sums on rows that do not start 16-byte aligned (odd n) but start
            alike in every operand: the pack width, the number of classes of rows with one
            alignment each (rows r and r + row_classes), whose chunks hold rows of one class;
            None on aligned rows.
        raw: the description as the C++ side wrote it (``key=value`` words).
    """

    op: str
    device: str
    dtype: torch.dtype
    backward: bool
    path: str
    rows: int
    n: int
    tier: str | None = None
    vec: int | None = None
    lanes_per_row: int | None = None
    threads: int | None = None
    cluster: int | None = None
    packs: int | None = None
    stages: int | None = None
    ctas_per_sm: int | None = None
    l2: str | None = None
    kernel: str | None = None
    warp_rows: int | None = None
    columns: str | None = None
    params: str | None = None
    param_grads: str | None = None
    chunks: int | None = None
    chunk_rows: int | None = None
    prefetch: str | None = None
    sums: str | None = None
    row_classes: int | None = None
    teams: int | None = None
    raw: str = ""

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        head = (
            f"{self.op} {'backward' if self.backward else 'forward'}, {dtype}, "
            f"{self.rows} rows of {self.n} on {self.device}: "
        )
        return head + _describe(self)


def _describe(p: Plan) -> str:
    packs = f"{p.packs} packs of {p.vec} elements per thread"
    if p.path == "cpu":
        text = "the CPU kernels (contiguous rows over torch's intra-op threads)"
    elif p.path == "empty":
        text = "nothing launches (empty input)"
    elif p.path == "strided":
        text = (
            f"the strided-dim path, {p.kernel} kernel: CTAs of 32 x 8 threads, "
            f"{p.vec} adjacent columns per thread"
        )
        if p.warp_rows:
            text += f", {p.warp_rows} lane{'s' if p.warp_rows > 1 else ''} of a warp per column"
        if p.columns == "full":
            text += ", 8 d-rows in every thread (no bounds)"
    elif p.tier == "group":
        text = f"group tier, {p.lanes_per_row} lanes per row ({p.threads}-thread CTAs), {packs}"
    elif p.tier == "cta":
        text = f"CTA tier, one CTA of {p.threads} threads per row, {packs}"
    elif p.tier == "cluster":
        text = f"cluster tier, {p.cluster} CTAs of {p.threads} threads per row, {packs}"
    else:
        text = (
            f"streaming, one CTA of {p.threads} threads per row, loads of {p.vec} elements "
            "(the row is read more than once)"
        )
    if p.stages:
        text += f"; the next {p.stages} {'tiles' if p.path == 'strided' else 'rows'} in flight"
    if p.ctas_per_sm:
        text += f"; {p.ctas_per_sm} CTAs per SM"
    if p.l2 == "keep":
        if p.path == "strided":
            text += "; each tile's inputs held in L2 until the tile is stored"
        else:
            text += "; each row's input held in L2 until the row is stored"
    if p.params == "once":
        text += "; parameters read once per CTA"
    if p.param_grads == "fused":
        rows = f" of {p.chunk_rows} rows" if p.chunk_rows else ""
        what = "tile partials" if p.path == "strided" else "chunk partials"
        teams = f" on {p.teams} teams" if p.teams else ""
        text += f"; parameter gradients fused ({p.chunks} {what}{rows} per column sum{teams})"
        if p.prefetch == "next_row":
            text += "; the next row prefetched into L2"
        elif p.prefetch == "next_row_loads":
            text += "; the next row's loads in flight"
        elif p.prefetch == "next_row_staged":
            text += "; the next row staged in shared memory"
        if p.sums == "registers":
            text += "; the column sums in registers"
        if p.row_classes:
            text += f"; rows in {p.row_classes} classes of one alignment each"
    elif p.param_grads == "two-pass":
        text += "; parameter gradients in a second pass (saved per-row statistics)"
    return text


def explain(
    x: torch.Tensor,
    op: str = "rms_norm",
    dim: int = -1,
    *,
    backward: bool = False,
    param_grads: bool = False,
) -> Plan:
    """The plan a call of ``op`` on ``x`` gets on x's device: path, tier, vector width, CTA and
    cluster shape. ``str(explain(...))`` reads as a sentence.

    Operands other than x (a gradient, a residual) are taken to be new contiguous tensors like
    x, as autograd passes them, and parameters to be given, in x's dtype (a cluster forward
    called without its parameters never keeps them per CTA: its ``params`` is then unset).
    Where the op would make x contiguous first, so does explain (it may copy x). add_rms_norm's
    backward is planned with a gradient for both outputs.

    Args:
        x: the input (float32, float16, bfloat16 or float64, any rank >= 1, CPU or CUDA).
        op: ``l2_normalize``, ``l1_normalize``, ``rms_norm``, ``add_rms_norm``, ``layer_norm``,
            ``softmax`` or ``log_softmax``.
        dim: the dimension reduced over (add_rms_norm: the last only).
        backward: plan the backward op instead of the forward.
        param_grads: with backward, for ops with parameters (rms_norm, add_rms_norm,
            layer_norm): plan the parameter gradients too (fused or two-pass).

    Returns:
        A :class:`Plan`.
    """
    raw = torch.ops.rownorm.plan_info(x, op, dim, backward, param_grads)
    words = dict(word.split("=", 1) for word in raw.split())
    fields = {k: int(v) if k in _INT_KEYS else v for k, v in words.items()}
    plan = Plan(op=op, device=str(x.device), dtype=x.dtype, backward=backward, raw=raw, **fields)
    logger.debug("explain: %s", plan)
    return plan
