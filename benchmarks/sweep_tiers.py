"""Sweep of the cluster-tier configurations for long rows (evidence for the tier table).

Each configuration runs in its own process (the dispatcher reads ROWNORM_SWEEP_CLUSTER once):

    python benchmarks/sweep_tiers.py            # all configurations, prints a table
    python benchmarks/sweep_tiers.py --child    # one configuration (from the environment)

Configurations: the table's default choice ("table") and the extra instantiated ones of
src/kernels/common/dispatch.cuh. Timing and the copy limit come from the shared harness
(rownorm.bench.Timer, measure_copy_bandwidth): medians of CUDA-event timings with the L2
flushed; "%" is the share of the device-to-device copy bandwidth measured in the same process.
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


def child(device: torch.device, elems: int) -> None:
    import rownorm  # noqa: F401  (loads the ops)
    from rownorm.bench import COPY_BYTES_CPU, COPY_BYTES_CUDA, Timer, measure_copy_bandwidth

    timer = Timer(device)
    copy_bytes = COPY_BYTES_CUDA if device.type == "cuda" else COPY_BYTES_CPU
    copy_gbs, _ = measure_copy_bandwidth(timer, copy_bytes)
    for dtype, n in SHAPES:
        x = torch.randn(max(elems // n, 1), n, device=device, dtype=dtype)
        dy = torch.randn_like(x)
        nbytes = x.numel() * x.element_size()
        t_fwd, _ = timer(lambda x=x: torch.ops.rownorm.l2_normalize(x, -1, 1e-12))
        t_bwd, _ = timer(
            lambda x=x, dy=dy: torch.ops.rownorm.l2_normalize_backward(dy, x, -1, 1e-12)
        )
        fwd_pct = 100 * 2 * nbytes / t_fwd / 1e6 / copy_gbs
        bwd_pct = 100 * 3 * nbytes / t_bwd / 1e6 / copy_gbs
        print(
            f"{os.environ.get('ROWNORM_SWEEP_CLUSTER', 'table'):>10} {str(dtype)[6:]:>9} "
            f"{n:>7} fwd {t_fwd:7.3f} ms {fwd_pct:5.1f}%  bwd {t_bwd:7.3f} ms {bwd_pct:5.1f}%",
            flush=True,
        )
        del x, dy
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--device", default="cuda", help="cpu gives a wall-time smoke run only")
    parser.add_argument("--elems", type=int, default=1 << 28, help="M·N per shape")
    args = parser.parse_args()
    if args.child:
        child(torch.device(args.device), args.elems)
        return
    for config in CONFIGS:
        env = dict(os.environ)
        env.pop("ROWNORM_SWEEP_CLUSTER", None)
        if config != "table":
            env["ROWNORM_SWEEP_CLUSTER"] = config
        cmd = [sys.executable, __file__, "--child", "--device", args.device]
        subprocess.run([*cmd, "--elems", str(args.elems)], env=env, check=True)


if __name__ == "__main__":
    main()
