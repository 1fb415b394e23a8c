"""``python -m rownorm``: build info, runtime, a self-check of every op, a quick timing.

The self-check runs every case of the op table (:data:`rownorm.testing.OPS`: l2 / l1 /
mean-abs normalize, rms_norm, layer_norm, softmax, log_softmax, add_rms_norm, each with and
without its parameters) forward and forward+backward (through autograd, so the backward op
too, parameter gradients included) on every available device (the CPU and each CUDA device)
in float32, float16, bfloat16 and float64, on shapes with odd row lengths and reductions over
a non-last dim (last-dim-only ops skip those), with the tests' own comparisons against the
float64 reference (:mod:`rownorm.testing.checks`). Exits 1 if any check fails. Then, on CUDA,
a few sizes of a few ops are timed against the PyTorch expression they replace (CUDA events,
the L2 cache flushed; ``python -m rownorm.bench`` is the full benchmark).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable, Sequence

import torch

import rownorm
from rownorm.testing import DTYPE_IDS, DTYPES, OPS, OpInfo
from rownorm.testing.checks import check_backward, check_outputs

# Row lengths around the tiers' edges, odd lengths (rows not 16-byte aligned), a row on the
# cluster tier (65535, CUDA only: the CPU runs one loop for every length) and reductions over a
# non-last dim (the strided-dim path).
CASES: tuple[tuple[tuple[int, ...], int], ...] = (
    ((4, 1), -1),
    ((3, 33), -1),
    ((5, 1000), -1),
    ((2, 4097), -1),
    ((2, 65535), -1),
    ((37, 3, 5), 0),
    ((4, 6, 300), 1),
)
CPU_MAX_N = 1000
# The ops of the quick timing (every op is in the full benchmark), and (shape, dtype, mode).
TIMED_OPS = ("l2_normalize", "rms_norm_weight", "softmax")
TIMED: tuple[tuple[tuple[int, int], torch.dtype, str], ...] = (
    ((65536, 256), torch.bfloat16, "fwd"),
    ((16384, 1024), torch.bfloat16, "fwd"),
    ((4096, 4096), torch.float32, "fwd"),
    ((1024, 65535), torch.float32, "fwd"),
    ((16384, 1024), torch.bfloat16, "fwdbwd"),
    ((1024, 65535), torch.float32, "fwdbwd"),
)


_BUILD_KEYS = (
    "torch_built_against",
    "torch_cuda_built_against",
    "cuda",
    "arch_list",
    "min_torch",
    "revision",
    "debug",
)


def _header() -> None:
    info = rownorm.build_info()
    print(f"rownorm {info.get('version', 'unknown')}")
    print("build:")
    keys = [k for k in _BUILD_KEYS if k in info] + [
        k for k in info if k not in _BUILD_KEYS and k != "version"
    ]
    for key in keys:
        print(f"  {key:<26} {info[key]}")
    print("runtime:")
    print(f"  {'python':<26} {platform.python_version()}")
    print(f"  {'torch':<26} {torch.__version__} (CUDA {torch.version.cuda})")
    print(f"  {'library':<26} {getattr(rownorm, '_LIBRARY_PATH', '?')}")
    avail = torch.cuda.is_available()
    print(f"  {'cuda available':<26} {avail}")
    if avail:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(
                f"  cuda:{i:<21} {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
                f"{p.total_memory / 2**30:.0f} GiB"
            )
    sys.stdout.flush()


def _devices() -> list[torch.device]:
    devs = [torch.device("cpu")]
    if torch.cuda.is_available():
        devs += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return devs


def _check_case(op: OpInfo, device, dtype, shape, dim) -> tuple[bool, str]:
    """Forward+backward through autograd of one case (every input's gradient against the
    reference), then its outputs (reference and row property); returns (passed, error)."""
    inp = op.make_inputs(shape, dim, dtype, device)
    try:
        outs, _, _ = check_backward(op, inp, dim, raw=False)
        with torch.no_grad():
            check_outputs(op, inp, dim, tuple(o.detach() for o in outs), vs_torch=False)
    except Exception as exc:  # noqa: BLE001  (reported as a failure)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return False, f"{type(exc).__name__}: {first[:200]}"
    return True, ""


def self_check(devices: Sequence[torch.device]) -> tuple[int, int]:
    """Returns (checks run, checks failed)."""
    n_run = n_failed = 0
    torch.manual_seed(0)
    for op in OPS.values():
        print(f"\nself-check {op.id} (forward; forward+backward) vs the float64 reference:")
        for device in devices:
            for dtype in DTYPES:
                for shape, dim in CASES:
                    if not op.supports(torch.empty(shape, device="meta"), dim):
                        continue
                    if device.type == "cpu" and shape[-1] > CPU_MAX_N:
                        continue
                    ok, text = _check_case(op, device, dtype, shape, dim)
                    n_run += 1
                    n_failed += not ok
                    where = f"{str(device):<7} {DTYPE_IDS[dtype]} {str(shape):<13} dim={dim:<2}"
                    print(f"  {'PASS' if ok else 'FAIL'}  {where}  {text}", flush=True)
    return n_run, n_failed


def _median_ms(fn: Callable[[], object], device: torch.device, reps: int = 20) -> float:
    """Median time of ``fn`` in ms over ``reps`` calls after two warm-up calls, the L2 cache
    flushed before each (CUDA events around ``fn`` alone); wall time on the CPU."""
    for _ in range(2):
        fn()
    times = []
    if device.type == "cuda":
        flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
        for _ in range(reps):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def _runner(call, inp, mode: str, dys):
    """A closure running ``call(inputs, -1)`` (fwd) or forward + backward (fwdbwd)."""
    if mode == "fwd":
        return lambda: call(inp, -1)
    leaves = {k: v.detach().requires_grad_(True) for k, v in inp.items()}

    def run():
        outs = call(leaves, -1)
        torch.autograd.backward(outs, dys)
        for v in leaves.values():
            v.grad = None

    return run


def quick_timing(device: torch.device, scale: int = 1) -> None:
    """Times rownorm against the PyTorch expression it replaces on a few sizes (a sanity
    check of speed); ``scale`` divides the row counts (for a CPU run)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU wall time"
    print(
        f"\nquick timing on {device} ({name}), median ms with the cache flushed; "
        "python -m rownorm.bench for the full benchmark:"
    )
    for op in (OPS[op_id] for op_id in TIMED_OPS):
        for (rows, n), dtype, mode in TIMED:
            shape = (max(rows // scale, 1), n)
            inp = op.make_inputs(shape, -1, dtype, device)
            dys = tuple(torch.randn(shape, dtype=dtype, device=device) for _ in range(op.n_outputs))
            ours = _runner(op.call, inp, mode, dys)
            theirs = _runner(op.torch_equivalent, inp, mode, dys)
            try:
                t_ours, t_torch = _median_ms(ours, device), _median_ms(theirs, device)
            except RuntimeError as exc:
                print(f"  {op.id} {mode} {shape}: not timed ({exc})")
                continue
            m, n = shape
            elem = inp["x"].element_size()
            nbytes = (op.fwd_bytes if mode == "fwd" else op.fwdbwd_bytes)(m, n, elem)
            label = "fwd    " if mode == "fwd" else "fwd+bwd"
            print(
                f"  {op.id} {label} {DTYPE_IDS[dtype]} {f'{m}×{n}':<12} rownorm "
                f"{t_ours:.3f} ms ({nbytes / t_ours / 1e6:.0f} GB/s)   eager torch "
                f"{t_torch:.3f} ms   speed-up {t_torch / t_ours:.2f}×",
                flush=True,
            )
            del inp, dys, ours, theirs
            if device.type == "cuda":
                torch.cuda.empty_cache()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rownorm", description=__doc__.splitlines()[0])
    p.add_argument("--no-timing", action="store_true", help="skip the quick timing on CUDA")
    p.add_argument("--cpu-only", action="store_true", help="self-check the CPU only")
    p.add_argument(
        "--time-cpu", action="store_true", help="also run the quick timing on the CPU (small)"
    )
    args = p.parse_args(argv)
    t0 = time.monotonic()
    _header()
    devices = [torch.device("cpu")] if args.cpu_only else _devices()
    n_run, n_failed = self_check(devices)
    if not args.no_timing and not args.cpu_only and torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            try:
                with torch.cuda.device(i):  # events and streams on the device being timed
                    quick_timing(torch.device("cuda", i))
            except Exception as exc:  # noqa: BLE001  (timing is informative only)
                print(f"  quick timing failed: {type(exc).__name__}: {exc}")
    if args.time_cpu:
        quick_timing(torch.device("cpu"), scale=64)
    took = time.monotonic() - t0
    verdict = "PASS" if n_failed == 0 else "FAIL"
    devs = ", ".join(str(d) for d in devices)
    print(
        f"\n{verdict}: {n_run - n_failed} of {n_run} self-checks passed on {devs} ({took:.1f} s)",
        flush=True,
    )
    return 0 if n_failed == 0 and n_run > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
