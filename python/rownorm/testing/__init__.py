"""The rownorm op table and what checks an op against it (shipped, not imported by
``import rownorm``): ``from rownorm.testing import OPS``.

* :mod:`rownorm.testing.opinfo`: :class:`OpInfo` (arity, calls, float64 reference, torch
  equivalent, byte counts, sample inputs) and the tolerance table :data:`TOL`;
* :mod:`rownorm.testing.table`: :data:`OPS`, every op case;
* :mod:`rownorm.testing.checks`: comparisons with the reference (tests and self-check);
* :mod:`rownorm.testing.samples`: layouts and reduced dims of row problems;
* :mod:`rownorm.testing.tiers`: a mirror of the CUDA tier table, for test lengths.
"""

from rownorm.testing.opinfo import DTYPE_IDS, DTYPES, TOL, Arity, OpInfo, Sample, Tol
from rownorm.testing.table import OPS, families, op_names

__all__ = [
    "DTYPES",
    "DTYPE_IDS",
    "OPS",
    "TOL",
    "Arity",
    "OpInfo",
    "Sample",
    "Tol",
    "families",
    "op_names",
]
