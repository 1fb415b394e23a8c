"""Benchmark of rownorm.layer_norm with weight and bias, eps 1e-5, forward and forward+backward.

    PYTHONPATH=python python benchmarks/bench_layer_norm.py [harness options]

Same as ``python -m rownorm.bench --ops layer_norm``: against ``F.layer_norm``, its torch.compile
and Liger-Kernel's ``liger_layer_norm``, plus the seed 004 workload 10000×768 fp32. Options are the
harness's (``--help``); the grid, the byte formulas and the method are in ``benchmarks/README.md``.
"""

import shlex
import sys

from rownorm import bench

if __name__ == "__main__":
    command = shlex.join(["python", "benchmarks/bench_layer_norm.py", *sys.argv[1:]])
    sys.exit(bench.main(["--ops", "layer_norm", *sys.argv[1:]], command=command))
