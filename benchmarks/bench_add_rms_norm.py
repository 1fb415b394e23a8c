"""Benchmark of rownorm.add_rms_norm (``r = x + residual``; ``(rms_norm(r, w), r)``), forward and
forward+backward.

    PYTHONPATH=python python benchmarks/bench_add_rms_norm.py [harness options]

Same as ``python -m rownorm.bench --ops add_rms_norm``: against ``x + residual`` then
``F.rms_norm``, its torch.compile and Liger-Kernel's ``liger_fused_add_rms_norm``. Bytes: forward
4·M·N·b, forward+backward 8·M·N·b. Options are the harness's (``--help``); the grid, the byte
formulas and the method are in ``benchmarks/README.md``.
"""

import shlex
import sys

from rownorm import bench

if __name__ == "__main__":
    command = shlex.join(["python", "benchmarks/bench_add_rms_norm.py", *sys.argv[1:]])
    sys.exit(bench.main(["--ops", "add_rms_norm", *sys.argv[1:]], command=command))
