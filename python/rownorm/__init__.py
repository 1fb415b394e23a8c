"""rownorm: fused row-normalization kernels for PyTorch.

Every op is a ``torch.ops.rownorm.*`` custom op (CUDA and CPU kernels, a fake for
torch.compile, autograd through registered backward ops); this package adds typed Python
functions (:mod:`rownorm.functional`) and modules (:mod:`rownorm.nn`).
"""

from rownorm._loader import build_info, load_library

_LIBRARY_PATH = load_library()

# Importing ops registers the fakes and autograd formulas of the ops just loaded.
from rownorm import nn, ops, reference  # noqa: E402,F401
from rownorm.functional import l2_normalize  # noqa: E402

__version__ = build_info().get("version", "unknown")

__all__ = ["build_info", "l2_normalize", "nn", "reference", "__version__"]
