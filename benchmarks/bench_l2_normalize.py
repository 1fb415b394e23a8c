"""Benchmark of rownorm.l2_normalize (forward and forward+backward) on the default grid.

    PYTHONPATH=python python benchmarks/bench_l2_normalize.py [harness options]

Same as ``python -m rownorm.bench --ops l2_normalize``: the 12 row lengths N of the grid
(256 … 262144), M·N ≥ 2^28, fp32 and bf16, against ``x / torch.norm(x, p=2, dim=-1,
keepdim=True)``, ``F.normalize`` and ``torch.compile(F.normalize)``, plus the seeds' workloads
(32768×65535 fp32 dim=1 forward; 16384×65535 fp32 forward+backward). Bytes: forward
2·M·N·b, forward+backward 5·M·N·b. Options are the harness's (``--help``).
"""

import shlex
import sys

from rownorm import bench

if __name__ == "__main__":
    command = shlex.join(["python", "benchmarks/bench_l2_normalize.py", *sys.argv[1:]])
    sys.exit(bench.main(["--ops", "l2_normalize", *sys.argv[1:]], command=command))
