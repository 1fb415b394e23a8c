"""``python -m rownorm``: build info, runtime, a self-check of every op, a quick timing.

The self-check runs every op of the benchmark harness (l2 / l1 / mean-abs normalize, rms_norm,
layer_norm, softmax, log_softmax, add_rms_norm) forward and forward+backward (through autograd,
so the backward op too, parameter gradients included) on every available device (the CPU and
each CUDA device) in float32, float16, bfloat16 and float64, on shapes with odd row lengths and
reductions over a non-last dim (last-dim-only ops skip those), with and without weight / bias,
and compares with the float64 reference. Exits 1 if any check fails. Then, on CUDA, a few sizes
of a few ops are timed against PyTorch's own op (L2 flushed, CUDA events; ``python -m
rownorm.bench`` is the full benchmark).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Sequence

import torch

import rownorm
from rownorm.bench import OPS, SHORT_DTYPE, Timer, Unavailable, check_impl, time_impl

# Relative error ‖out − ref‖/‖ref‖ allowed for the rownorm kernels (fp32 accumulation, one
# rounding to the output dtype): a few units of the output's rounding error.
SELFCHECK_TOL = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1e-2,
}
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# Row lengths around the tiers' edges, a length whose rows are not 16-byte aligned (65535) and
# a reduction over a non-last dim (strided path).
CASES: tuple[tuple[tuple[int, ...], int], ...] = (
    ((4, 1), -1),
    ((3, 33), -1),
    ((5, 1000), -1),
    ((2, 4097), -1),
    ((2, 65535), -1),
    ((37, 3, 5), 0),
    ((4, 6, 300), 1),
)
TIMER_KW = {"warmup_ms": 5.0, "rep_ms": 30.0, "min_reps": 5}
# The ops of the quick timing (every op is in the full benchmark).
TIMED_OPS = ("l2_normalize", "rms_norm", "softmax")
# (shape, dtype, mode) timed on CUDA.
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


def _applies(spec, shape: tuple[int, ...], dim: int) -> bool:
    """Whether a case fits the op: last-dim-only ops (add_rms_norm) skip other dims."""
    return not spec.last_dim_only or dim % len(shape) == len(shape) - 1


def _param_variants(spec) -> tuple[tuple[str, ...] | None, ...]:
    """``None``: the op's own parameters (weight / bias, as the benchmark makes them); ``()``:
    none, a second variant for the ops that take any."""
    takes_params = any(name in ("weight", "bias") for name in spec.input_names)
    return (None, ()) if takes_params else (None,)


def _check_case(spec, device, dtype, shape, dim, seed, params=None) -> tuple[bool, str]:
    """Forward, then forward+backward, of one case; returns (passed, errors as text).

    ``params``: the parameters to pass (None: the op's own set, see ``OpSpec.make_inputs``)."""
    tol = SELFCHECK_TOL[dtype]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    parts, ok = [], True
    for mode, label in (("fwd", "fwd"), ("fwdbwd", "fwd+bwd")):
        try:
            inputs = spec.make_inputs(shape, dim, dtype, device, gen, params=params)
            dys = [
                torch.randn(shape, dtype=dtype, device=device, generator=gen)
                for _ in range(spec.n_outputs)
            ]
            fn = spec.ours().make(dim, dict(spec.kwargs))
            err, detail = check_impl(spec, fn, inputs, dim, spec.kwargs, mode, dys)
            passed = err <= tol  # False for NaN
            parts.append(f"{label} {err:.1e}" + ("" if passed else f" [{detail}]"))
        except Exception as exc:  # noqa: BLE001  (reported as a failure)
            passed = False
            first = str(exc).splitlines()[0] if str(exc) else ""
            parts.append(f"{label} {type(exc).__name__}: {first[:160]}")
        ok = ok and passed
    return ok, "  ".join(parts) + f"  (tol {tol:.0e})"


def self_check(devices: Sequence[torch.device]) -> tuple[int, int]:
    """Returns (checks run, checks failed)."""
    n_run = n_failed = 0
    for spec in OPS.values():
        print(
            f"\nself-check {spec.name} (forward; forward+backward = outputs and the gradients of "
            "every input) vs the float64 reference, rel. error ‖out − ref‖/‖ref‖:"
        )
        for device in devices:
            for dtype in DTYPES:
                for shape, dim in CASES:
                    if not _applies(spec, shape, dim):
                        continue
                    for params in _param_variants(spec):
                        ok, text = _check_case(spec, device, dtype, shape, dim, n_run, params)
                        n_run += 1
                        n_failed += not ok
                        where = (
                            f"{str(device):<7} {SHORT_DTYPE[dtype]} {str(shape):<13} dim={dim:<2}"
                        )
                        if params == ():
                            where += " no params"
                        print(f"  {'PASS' if ok else 'FAIL'}  {where}  {text}", flush=True)
    return n_run, n_failed


def quick_timing(device: torch.device, scale: int = 1) -> None:
    """Times rownorm against PyTorch's own op on a few sizes (a sanity check of speed).

    ``scale`` divides the row counts (for a CPU run)."""
    timer = Timer(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU wall time"
    print(
        f"\nquick timing on {device} ({name}), median ms with the cache flushed; "
        "python -m rownorm.bench for the full benchmark:"
    )
    for spec in (OPS[name] for name in TIMED_OPS):
        ours = spec.ours()
        base = spec.impl(spec.baseline)
        for (rows, n), dtype, mode in TIMED:
            shape = (max(rows // scale, 1), n)
            gen = torch.Generator(device=device)
            gen.manual_seed(0)
            try:
                inputs = spec.make_inputs(shape, -1, dtype, device, gen)
                dys = [
                    torch.randn(shape, dtype=dtype, device=device, generator=gen)
                    for _ in range(spec.n_outputs)
                ]
                times = []
                for impl in (ours, base):
                    fn = impl.make(-1, dict(spec.kwargs))
                    times.append(time_impl(timer, fn, inputs, mode, dys, **TIMER_KW))
            except (Unavailable, RuntimeError) as exc:
                print(f"  {spec.name} {mode} {shape}: not timed ({exc})")
                continue
            m, n = shape
            elem = inputs[0].element_size()
            nbytes = (spec.fwd_bytes if mode == "fwd" else spec.fwdbwd_bytes)(m, n, elem)
            label = "fwd    " if mode == "fwd" else "fwd+bwd"
            print(
                f"  {spec.name} {label} {SHORT_DTYPE[dtype]} {f'{m}×{n}':<12} rownorm "
                f"{times[0]:.3f} ms ({nbytes / times[0] / 1e6:.0f} GB/s)   {base.label} "
                f"{times[1]:.3f} ms   speed-up {times[1] / times[0]:.2f}×",
                flush=True,
            )
            del inputs, dys
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
