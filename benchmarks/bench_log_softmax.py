"""Benchmark of rownorm.log_softmax, forward and forward+backward.

    PYTHONPATH=python python benchmarks/bench_log_softmax.py [harness options]

Same as ``python -m rownorm.bench --ops log_softmax``: against ``torch.log_softmax`` and its
torch.compile (Liger-Kernel has no log-softmax op). Options are the harness's (``--help``); the
grid, the byte formulas and the method are in ``benchmarks/README.md``.
"""

import shlex
import sys

from rownorm import bench

if __name__ == "__main__":
    command = shlex.join(["python", "benchmarks/bench_log_softmax.py", *sys.argv[1:]])
    sys.exit(bench.main(["--ops", "log_softmax", *sys.argv[1:]], command=command))
