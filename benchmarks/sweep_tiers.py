"""Sweep of the cluster-tier configurations for long rows (evidence for the tier table).

Each configuration runs in its own process (the dispatcher reads ROWNORM_SWEEP_CLUSTER once):

    python benchmarks/sweep_tiers.py            # all configurations, prints a table
    python benchmarks/sweep_tiers.py --child    # one configuration (from the environment)

Configurations: the table's default choice ("table") and the extra instantiated ones of
src/kernels/common/dispatch.cuh. Times are medians of CUDA-event timings with L2 flushed;
"%" is the share of the device-to-device copy bandwidth measured in the same process.
"""

import argparse
import os
import subprocess
import sys

import torch

CONFIGS = ["table", "8:512:8", "8:256:16", "16:256:16", "4:512:8"]
SHAPES = [
    (torch.float32, 65535),
    (torch.float32, 131072),
    (torch.float32, 262144),
    (torch.bfloat16, 65536),
    (torch.bfloat16, 262144),
]


def _time(fn, reps=15):
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _copy_bandwidth() -> float:
    src = torch.empty(1 << 29, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _time(lambda: dst.copy_(src)) / 1e6


def child() -> None:
    import rownorm  # noqa: F401

    copy_gbs = _copy_bandwidth()
    for dtype, n in SHAPES:
        m = (1 << 28) // n
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        dy = torch.randn_like(x)
        nbytes = x.numel() * x.element_size()
        t_fwd = _time(lambda x=x: torch.ops.rownorm.l2_normalize(x, -1, 1e-12))
        t_bwd = _time(lambda x=x, dy=dy: torch.ops.rownorm.l2_normalize_backward(dy, x, -1, 1e-12))
        fwd_pct = 100 * 2 * nbytes / t_fwd / 1e6 / copy_gbs
        bwd_pct = 100 * 3 * nbytes / t_bwd / 1e6 / copy_gbs
        print(
            f"{os.environ.get('ROWNORM_SWEEP_CLUSTER', 'table'):>10} {str(dtype)[6:]:>9} "
            f"{n:>7} fwd {t_fwd:7.3f} ms {fwd_pct:5.1f}%  bwd {t_bwd:7.3f} ms {bwd_pct:5.1f}%",
            flush=True,
        )
        del x, dy
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        child()
        return
    for config in CONFIGS:
        env = dict(os.environ)
        env.pop("ROWNORM_SWEEP_CLUSTER", None)
        if config != "table":
            env["ROWNORM_SWEEP_CLUSTER"] = config
        subprocess.run([sys.executable, __file__, "--child"], env=env, check=True)


if __name__ == "__main__":
    main()
