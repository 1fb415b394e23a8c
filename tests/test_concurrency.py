"""Concurrency and resources: ops issued from several Python threads at once, and on several
CUDA streams at once, give the serial results bit for bit; many calls do not grow device or
host memory; an allocation failure raises a clear error and leaves the library working.

Specification: the ops keep no state between calls (no global buffers, no caches of inputs);
every launch goes to the current stream of the caller's thread; every allocation goes through
PyTorch's allocator, whose out-of-memory error reaches the caller and whose memory is returned
when a call fails half-way.

Why the grid is what it is: one op case per op (its every differentiable input), forward and
backward through autograd, on a few row lengths of different tiers; threads and streams are
where the state would be shared, not the op, so the lengths are few.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import rownorm
import torch
from utils import (
    OPS,
    assert_matches,
    autograd_grads,
    check_grads,
    cuda_only,
    families,
    randn,
    raw_case,
)

FAMILIES = families()
# (rows, n): the group tier, the CTA tier with fused parameter sums, an odd long row (CUDA);
# a short and a longer row (CPU: one row loop for every length)
SHAPES = {"cuda": ((37, 33), (19, 4096), (3, 20001)), "cpu": ((37, 33), (7, 1000))}


def _problems(device, dtype=torch.float32, shapes=None):
    """(op, inputs, output gradients) of every op family and shape, the same every call."""
    shapes = shapes or SHAPES[torch.device(device).type]
    gen = torch.Generator().manual_seed(7)
    out = []
    for op in FAMILIES.values():
        for shape in shapes:
            x = randn(shape, dtype, device, gen)
            res = randn(shape, dtype, device, gen) if op.residual else None
            inp = op.inputs(x, -1, residual=res, generator=gen)
            dys = tuple(randn(shape, dtype, device, gen) for _ in range(op.n_outputs))
            out.append((op, inp, dys))
    return out


def _run(problem):
    """Outputs and every input's gradient (autograd), in one flat list."""
    op, inp, dys = problem
    outs, _, grads = autograd_grads(op, inp, -1, dys)
    return [o.detach() for o in outs] + [grads[k] for k in sorted(grads)]


def _assert_identical(got, want, what: str) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"{what}: result {i} differs from the serial run"


# ---------------------------------------------------------------------------------------------
# Threads and streams


@pytest.mark.parametrize("streams", [False, True], ids=["current_stream", "stream_per_thread"])
def test_threads_match_serial(device, streams):
    """8 threads, each running every problem 3 times in its own order, at once: every result
    equals the serial one bit for bit. On CUDA, with the default stream shared, or with one
    stream per thread (inputs made on the default stream first; each thread waits for it)."""
    cuda = torch.device(device).type == "cuda"
    if streams and not cuda:
        pytest.skip("streams are CUDA's")
    problems = _problems(device)
    serial = [_run(p) for p in problems]
    if cuda:
        torch.cuda.synchronize()
    barrier = threading.Barrier(8)

    def worker(t: int):
        order = [(i + t) % len(problems) for i in range(len(problems))] * 3
        stream = torch.cuda.Stream() if streams else None
        barrier.wait()  # all threads start together
        results = []
        if stream is None:
            results = [(i, _run(problems[i])) for i in order]
        else:
            stream.wait_stream(torch.cuda.default_stream())
            with torch.cuda.stream(stream):
                results = [(i, _run(problems[i])) for i in order]
            stream.synchronize()
        return results

    with ThreadPoolExecutor(8) as pool:
        per_thread = list(pool.map(worker, range(8)))
    if cuda:
        torch.cuda.synchronize()
    for t, results in enumerate(per_thread):
        for i, got in results:
            op, inp, _ = problems[i]
            _assert_identical(got, serial[i], f"thread {t}: {op} {tuple(inp['x'].shape)}")


@cuda_only
@pytest.mark.streams
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_streams_match_serial(dtype):
    """Every problem on its own stream, all launched from one thread before any is waited for
    (4 streams, kernels free to overlap): the results equal the serial ones bit for bit.
    Synchronized as the CUDA stream sanitizer wants it (scripts/gpu_check.sh runs this test
    under TORCH_CUDA_SANITIZER=1): each stream waits for the inputs' stream, and the default
    stream for each before reading the results."""
    problems = _problems("cuda", dtype, ((64, 4096), (3, 65537), (255, 1024)))
    serial = [_run(p) for p in problems]
    default = torch.cuda.current_stream()
    streams = [torch.cuda.Stream() for _ in range(4)]
    for s in streams:
        s.wait_stream(default)
    got = []
    for i, problem in enumerate(problems):
        s = streams[i % len(streams)]
        with torch.cuda.stream(s):
            got.append(_run(problem))
        for t in (*problem[1].values(), *problem[2]):
            t.record_stream(s)  # (their memory is not reused before s is done with them)
    for s in streams:
        default.wait_stream(s)
    for i, (op, inp, _) in enumerate(problems):
        for t in got[i]:
            t.record_stream(default)
        _assert_identical(got[i], serial[i], f"{op} {tuple(inp['x'].shape)} on a side stream")
    torch.cuda.synchronize()


# (rows, n): the shapes above, and the fused parameter-sum kernels of 8-lane groups and of
# 512 threads x 2 packs (add_rms_norm, 16-bit)
TWO_DEVICE_SHAPES = (*SHAPES["cuda"], (300, 256), (40, 8192))


@cuda_only
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_two_devices_at_once(dtype):
    """The same problems on cuda:0 and cuda:1, forward and backward with every gradient.

    Each device's results with that device current are the baseline. With the other device
    current (tensors on a non-current device), and from two threads at once, one per device,
    both with device 0 current (a new thread's default), every result equals its baseline bit
    for bit and stays on its device: the kernels, their scratch and their streams follow the
    tensors, not the current device. Two GPUs of one model give the same bits (the plan
    depends on the device's properties, not on which device it is)."""
    devices = [torch.device("cuda", d) for d in range(2)]
    problems = [_problems(dev, dtype, TWO_DEVICE_SHAPES) for dev in devices]
    baseline = []
    for dev, probs in zip(devices, problems, strict=True):
        with torch.cuda.device(dev):
            baseline.append([_run(p) for p in probs])
    for d, dev in enumerate(devices):
        with torch.cuda.device(devices[1 - d]):
            for p, want in zip(problems[d], baseline[d], strict=True):
                op, inp, _ = p
                got = _run(p)
                assert all(t.device == dev for t in got), f"{op} on {dev}: result device"
                _assert_identical(got, want, f"{op} {tuple(inp['x'].shape)} on {dev}, not current")
    for dev in devices:
        torch.cuda.synchronize(dev)
    barrier = threading.Barrier(2)

    def worker(d: int):
        assert torch.cuda.current_device() == 0
        barrier.wait()
        got = [_run(p) for p in problems[d] * 3]
        torch.cuda.synchronize(devices[d])
        return got

    with ThreadPoolExecutor(2) as pool:
        per_device = list(pool.map(worker, range(2)))
    for d, got in enumerate(per_device):
        for i, g in enumerate(got):
            op, inp, _ = problems[d][i % len(problems[d])]
            want = baseline[d][i % len(problems[d])]
            _assert_identical(g, want, f"{op} {tuple(inp['x'].shape)} on cuda:{d}, two threads")
    if torch.cuda.get_device_name(0) == torch.cuda.get_device_name(1):
        for (op, inp, _), a, b in zip(problems[0], *baseline, strict=True):
            what = f"{op} {tuple(inp['x'].shape)}: cuda:1 vs cuda:0"
            _assert_identical([t.cpu() for t in b], [t.cpu() for t in a], what)


# ---------------------------------------------------------------------------------------------
# Memory


# The out-of-memory error as it reaches Python through the stable ABI: torch 2.14 keeps the
# allocator's message; torch 2.11 (the GPU machine's) replaces it with the shim's generic one
# (measured on the H100), so there the test can only check that the call failed cleanly.
OOM = r"out of memory|can't allocate memory" + (
    "" if torch.__version__ >= "2.14" else r"|aten::new_empty.*API call failed"
)


def _rss() -> int | None:
    """Resident memory of this process (bytes), where /proc tells it."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def test_no_memory_growth(device):
    """Many calls of every op, raw forward and backward ops and autograd: CUDA's allocated
    memory is back to where it was (to the byte: no tensor kept), and the host's resident
    memory does not grow by more than 32 MiB (a leak of 320 bytes a call over 100,000).
    CUDA: 100,000 calls; CPU: 10,000 (a leaked output is 8 KiB there)."""
    cuda = torch.device(device).type == "cuda"
    calls = 100_000 if cuda else 10_000
    problems = _problems(device, shapes=((8, 256),))
    ops = []
    for op, inp, dys in problems:
        case = raw_case(op, inp["x"])  # (eps resolved: the backward ops take a float)
        outs = case.raw(inp, -1)
        want = frozenset(case.params)
        ops.append(lambda case=case, inp=inp, dys=dys, outs=outs, want=want: (
            case.raw(inp, -1), case.raw_backward(dys, inp, -1, outs, want)))  # fmt: skip

    def work(n: int) -> int:
        done = 0
        for i in range(n):
            ops[i % len(ops)]()  # a forward and a backward op
            done += 2
            if i % 100 == 0:  # and now and then through autograd (the Python side)
                _run(problems[i % len(problems)])
                done += 2
        return done

    threads = torch.get_num_threads()
    if not cuda:  # (the CPU's parameter gradients wake the thread pool for 8 rows: slow)
        torch.set_num_threads(1)
    try:
        work(2_000)  # warm-up: allocator pools, lazy loading, autograd's caches
        gc.collect()
        if cuda:
            torch.cuda.synchronize()
        allocated, rss = (torch.cuda.memory_allocated() if cuda else 0), _rss()
        done = 0
        while done < calls:
            done += work(1_000)
    finally:
        torch.set_num_threads(threads)
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == allocated, (
            f"{done} calls: CUDA allocated memory {allocated} -> {torch.cuda.memory_allocated()}"
        )
    if rss is not None:
        grown = _rss() - rss
        assert grown < 32 * 2**20, f"{done} calls: resident memory grew by {grown / 2**20:.1f} MiB"


def test_allocation_failure_is_clean(device):
    """An output that cannot be allocated (a stride-0 input of 2^58 elements: its contiguous
    copy and its output need 2^60 bytes) raises PyTorch's out-of-memory error through the op,
    forward and backward; nothing is left allocated, and the next calls are right."""
    cuda = torch.device(device).type == "cuda"
    x = torch.zeros((1, 1), device=device).expand(2**29, 2**29)
    small = randn((5, 33), torch.float32, device)
    if cuda:
        torch.cuda.synchronize()
        allocated = torch.cuda.memory_allocated()
    for call in (
        lambda: rownorm.rms_norm(x),
        lambda: torch.ops.rownorm.softmax(x, -1),
        lambda: torch.ops.rownorm.l2_normalize_backward(x, x, -1, 1e-12),
        lambda: torch.ops.rownorm.layer_norm_with_stats(x, None, None, -1, 1e-5),
    ):
        with pytest.raises(RuntimeError, match=OOM):
            call()
        if cuda:
            torch.cuda.synchronize()
            assert torch.cuda.memory_allocated() == allocated
        # No name for the result: a live output would count against the next iteration's check.
        assert_matches(rownorm.rms_norm(small), rownorm.reference.rms_norm(small), dim=-1,
                       what="after the failure")  # fmt: skip


@cuda_only
@pytest.mark.skipif(
    os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1",
    reason="set_per_process_memory_fraction limits the caching allocator",
)
def test_scratch_allocation_failure_is_clean():
    """The fused parameter gradients' scratch (8 MiB of float32 partials here) cannot be
    allocated after dx (64 MiB) was: set_per_process_memory_fraction leaves room for dx and
    half the scratch. The backward raises CUDA's out-of-memory error; dx is freed with it;
    with the room back, the same call gives the right result.

    In a fresh process: the limit counts the allocator's reserved memory, so a free cached
    block that earlier tests of this worker left in a partly used segment can serve dx or the
    scratch without growing it, and nothing fails (seen in the whole suite, never alone)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    body = "import test_concurrency as t; t.scratch_allocation_failure()"
    run = subprocess.run(
        [sys.executable, "-c", body], cwd=tests, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def scratch_allocation_failure() -> None:
    """The body of test_scratch_allocation_failure_is_clean, run in its own process."""
    rows, n = 8192, 4096  # bf16 rows of 4096: the CTA tier, fused sums (plan.h)
    x = randn((rows, n), torch.bfloat16, "cuda")
    dy = randn((rows, n), torch.bfloat16, "cuda")
    op = OPS["rms_norm_weight"]
    w = op.inputs(x, -1)["weight"]
    plan = rownorm.explain(x, "rms_norm", backward=True, param_grads=True)
    assert plan.param_grads == "fused", plan
    scratch = plan.chunks * n * 4

    def backward():
        return torch.ops.rownorm.rms_norm_backward(dy, x, w, -1, op.eps, True)

    want_dx, want_dw = backward()
    del want_dx
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    allocated = torch.cuda.memory_allocated()
    total = torch.cuda.get_device_properties(x.device).total_memory
    room = torch.cuda.memory_reserved() + x.numel() * x.element_size() + scratch // 2
    torch.cuda.set_per_process_memory_fraction(room / total)
    try:
        with pytest.raises(RuntimeError, match=OOM):
            backward()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == allocated, "memory left allocated by the failure"
    dx, dw = backward()
    assert torch.equal(dw, want_dw)
    sub = {"x": x[:64], "weight": w}
    check_grads(op, sub, -1, (dy[:64],), {"x": dx[:64]}, what="dx after the failure")
