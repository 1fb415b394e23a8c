"""Benchmark of rownorm.softmax, forward and forward+backward.

    PYTHONPATH=python python benchmarks/bench_softmax.py [harness options]

Same as ``python -m rownorm.bench --ops softmax``: against ``torch.softmax``, its torch.compile and
Liger-Kernel's ``liger_softmax``, plus the seed 004 workload 100000×32 fp32. Options are the
harness's (``--help``); the grid, the byte formulas and the method are in ``benchmarks/README.md``.
"""

import shlex
import sys

from rownorm import bench

if __name__ == "__main__":
    command = shlex.join(["python", "benchmarks/bench_softmax.py", *sys.argv[1:]])
    sys.exit(bench.main(["--ops", "softmax", *sys.argv[1:]], command=command))
