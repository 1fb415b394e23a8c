"""Timing: the median of many reps of one call, with the L2 cache flushed before each rep.

Why not ``triton.testing.do_bench``, whose method this is (warm-up sized from an estimate,
a buffer zeroed before every rep, CUDA events around the call alone, the median)?

- rownorm's only runtime dependency is torch, and triton is missing where torch is a CPU
  build (CI, where the tests run the whole harness on the CPU with this same code, wall time).
- The flush buffer is sized from the device (max(256 MiB, 2 × L2)), where do_bench's is a
  fixed 256 MiB, and the number of reps is bounded below (``min_reps``): do_bench runs a
  100 ms op once.

The per-call cost of small calls under a CUDA graph, where no flush is wanted, is
``triton.testing.do_bench_cudagraph``'s (:func:`measure_small_calls`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rownorm.bench.check import as_tuple
from rownorm.bench.impls import Fn, err_text

COPY_BYTES_CUDA = 1 << 31  # the copy-limit buffer: 2 GiB read + 2 GiB written
COPY_BYTES_CPU = 1 << 26  # a CPU run is a smoke run: its numbers mean nothing
FLUSH_BYTES_MIN = 256 << 20


class Timer:
    """Median time of ``fn`` in ms, L2 flushed before every rep (do_bench's method).

    On CUDA the time is taken with events around ``fn`` alone; on the CPU it is wall time
    (for smoke runs only).
    """

    def __init__(self, device: torch.device, flush_bytes: int | None = None) -> None:
        self.device = device
        if flush_bytes is None:
            if device.type == "cuda":
                l2 = torch.cuda.get_device_properties(device).L2_cache_size
                flush_bytes = max(FLUSH_BYTES_MIN, 2 * l2)
            else:
                flush_bytes = 64 << 20
        self.flush_bytes = flush_bytes
        self._flush = torch.empty(flush_bytes // 4, dtype=torch.int32, device=device)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(
        self,
        fn: Callable[[], Any],
        warmup_ms: float = 25.0,
        rep_ms: float = 100.0,
        min_reps: int = 10,
        max_reps: int = 1000,
    ) -> tuple[float, int]:
        fn()
        self._sync()
        # Estimate one rep (flush included) to size warm-up and rep counts.
        n_est = 3
        t0 = time.perf_counter()
        for _ in range(n_est):
            self._flush.zero_()
            fn()
        self._sync()
        est_ms = max((time.perf_counter() - t0) * 1e3 / n_est, 1e-3)
        n_warmup = max(1, min(int(warmup_ms / est_ms), 100))
        n_reps = max(min_reps, min(int(rep_ms / est_ms), max_reps))
        for _ in range(n_warmup):
            fn()
        if self.device.type == "cuda":
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_reps)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_reps)]
            for i in range(n_reps):
                self._flush.zero_()
                starts[i].record()
                fn()
                ends[i].record()
            self._sync()
            times = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
        else:
            times = []
            for _ in range(n_reps):
                self._flush.zero_()
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), n_reps


def measure_copy_time(timer: Timer, nbytes: int, quick: bool = False) -> tuple[float, int]:
    """Device-to-device copy of ``nbytes`` (``dst.copy_(src)``): (median ms, reps)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=timer.device)
    dst = torch.empty_like(src)
    src.fill_(1)
    return timer(lambda: dst.copy_(src), rep_ms=50.0 if quick else 200.0, min_reps=10)


def measure_copy_bandwidth(timer: Timer, nbytes: int, quick: bool = False) -> tuple[float, float]:
    """Device-to-device copy of ``nbytes``: returns (GB/s counting bytes read + written, ms)."""
    ms, _ = measure_copy_time(timer, nbytes, quick)
    return 2 * nbytes / (ms * 1e6), ms


def time_impl(
    timer: Timer,
    fn: Fn,
    inputs: Sequence[torch.Tensor],
    mode: str,
    dys: Sequence[torch.Tensor] | None = None,
    **timer_kw: Any,
) -> float:
    """Median ms of ``fn(*inputs)`` (fwd, under no_grad) or of a training step (fwdbwd):
    ``fn`` then ``torch.autograd.grad(outputs, inputs, dys)``, the gradient of every floating
    input (x, residual, weight, bias). The gradients are returned, not accumulated into
    ``.grad``, so no accumulation kernel (nor the copy autograd makes when one gradient tensor
    feeds two leaves, as add_rms_norm's d(x) = d(residual)) is timed."""
    if mode == "fwd":
        with torch.no_grad():
            return timer(lambda: fn(*inputs), **timer_kw)[0]
    if dys is None:
        raise ValueError("time_impl: fwdbwd needs dys")
    leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
    grad_leaves = [t for t in leaves if t.requires_grad]
    grad_outputs = list(dys)

    def step() -> None:
        torch.autograd.grad(as_tuple(fn(*leaves)), grad_leaves, grad_outputs)

    return timer(step, **timer_kw)[0]


@dataclasses.dataclass
class SmallCall:
    """One implementation's cost on a tiny input, where the launch path is the whole cost."""

    label: str
    expr: str
    host_us: float  # per call in a loop synchronized once: the host's cost (or the GPU's)
    graph_us: float | None  # per call replayed from a CUDA graph: the GPU work alone
    graph_note: str = ""  # why graph_us is missing


SMALL_CALL_SHAPE = (1, 4096)


def _graph_us(fn: Callable[[], Any], device: torch.device) -> float:
    """µs per call of ``fn`` replayed from a CUDA graph: ``triton.testing.do_bench_cudagraph``
    (median). It captures on a side stream, as graph capture needs."""
    from triton.testing import do_bench_cudagraph

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        ms = do_bench_cudagraph(fn, rep=20, return_mode="median")
    torch.cuda.current_stream(device).wait_stream(stream)
    return ms * 1e3


def measure_small_calls(device: torch.device, calls: int = 2000) -> list[SmallCall]:
    """rms_norm on a 1×4096 bf16 tensor with a bf16 weight, eager and under a CUDA graph.

    host_us: mean wall time per call over ``calls`` back-to-back calls (one synchronize at the
    end), best of 5 loops; the GPU needs a few µs per call, so this is the host's cost wherever
    that is larger. graph_us: per call of a replayed CUDA graph of many calls (the GPU work
    alone), None with the reason in ``graph_note`` where that fails (no triton, say)."""
    import torch.nn.functional as F

    import rownorm

    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    x = torch.randn(SMALL_CALL_SHAPE, dtype=torch.bfloat16, device=device, generator=gen)
    w = torch.randn(SMALL_CALL_SHAPE[-1:], dtype=torch.bfloat16, device=device, generator=gen)
    eps = 1e-6
    impls = [
        (
            "torch.ops.rownorm.rms_norm",
            "torch.ops.rownorm.rms_norm(x, w, -1, eps)",
            lambda: torch.ops.rownorm.rms_norm(x, w, -1, eps),
        ),
        (
            "rownorm.rms_norm",
            "rownorm.rms_norm(x, w, eps=eps)",
            lambda: rownorm.rms_norm(x, w, eps=eps),
        ),
        (
            "F.rms_norm",
            "F.rms_norm(x, (4096,), w, eps)",
            lambda: F.rms_norm(x, SMALL_CALL_SHAPE[-1:], w, eps),
        ),
    ]
    out = []
    for label, expr, fn in impls:
        for _ in range(50):
            fn()
        torch.cuda.synchronize(device)
        best = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize(device)
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        graph_us, note = None, ""
        try:
            graph_us = _graph_us(fn, device)
        except Exception as exc:  # noqa: BLE001  (reported in the table)
            note = err_text(exc)
            print(f"small calls: {label} under a CUDA graph failed: {note}", flush=True)
        out.append(SmallCall(label, expr, best, graph_us, note))
    return out
