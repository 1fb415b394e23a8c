"""Benchmark of rownorm.rms_norm with a weight in x's dtype, eps 1e-6 (the LLM case), forward and
forward+backward.

    PYTHONPATH=python python benchmarks/bench_rms_norm.py [harness options]

Same as ``python -m rownorm.bench --ops rms_norm``: against ``F.rms_norm``, its torch.compile and
Liger-Kernel's ``liger_rms_norm``, plus the seed 001 workload (dim=1 of 112×64×512×512 fp32, no
weight, eps 1e-5) against its expression ``x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) +
eps)``. Options are the harness's (``--help``); the grid, the byte formulas and the method are in
``benchmarks/README.md``.
"""

import shlex
import sys

from rownorm import bench

if __name__ == "__main__":
    command = shlex.join(["python", "benchmarks/bench_rms_norm.py", *sys.argv[1:]])
    sys.exit(bench.main(["--ops", "rms_norm", *sys.argv[1:]], command=command))
