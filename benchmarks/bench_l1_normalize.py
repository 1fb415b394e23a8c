"""Benchmark of rownorm.l1_normalize (``x / max(Σ|x|, eps)``), forward and forward+backward.

    PYTHONPATH=python python benchmarks/bench_l1_normalize.py [harness options]

Same as ``python -m rownorm.bench --ops l1_normalize``: against ``F.normalize(x, p=1)`` and its
torch.compile (Liger-Kernel has no L1 op). Options are the harness's (``--help``); the grid, the
byte formulas and the method are in ``benchmarks/README.md``.
"""

import shlex
import sys

from rownorm import bench

if __name__ == "__main__":
    command = shlex.join(["python", "benchmarks/bench_l1_normalize.py", *sys.argv[1:]])
    sys.exit(bench.main(["--ops", "l1_normalize", *sys.argv[1:]], command=command))
