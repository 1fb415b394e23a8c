"""Benchmark of mean-abs normalize, ``rownorm.l1_normalize(x, dim, eps=0, mean=True)``, forward and
forward+backward.

    PYTHONPATH=python python benchmarks/bench_mean_abs.py [harness options]

Same as ``python -m rownorm.bench --ops mean_abs``: against the seed 003 expression ``x /
torch.mean(torch.abs(x), dim, keepdim=True)`` and its torch.compile, on the seed's 32768×65535 fp32
dim=1 workload and (named here) the grid. Options are the harness's (``--help``); the grid, the byte
formulas and the method are in ``benchmarks/README.md``.
"""

import shlex
import sys

from rownorm import bench

if __name__ == "__main__":
    command = shlex.join(["python", "benchmarks/bench_mean_abs.py", *sys.argv[1:]])
    sys.exit(bench.main(["--ops", "mean_abs", *sys.argv[1:]], command=command))
