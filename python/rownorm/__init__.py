"""rownorm: fused row-normalization kernels for PyTorch.

Every op is a ``torch.ops.rownorm.*`` custom op (CUDA and CPU kernels, a fake for
torch.compile, autograd through registered backward ops); this package adds typed Python
functions (:mod:`rownorm.functional`) and modules (:mod:`rownorm.nn`).
"""

from rownorm._loader import build_info, load_library, package_version

_LIBRARY_PATH = load_library()

# Importing ops registers the fakes and autograd formulas of the ops just loaded; importing
# distributed, their DTensor sharding rules once torch.distributed.tensor is imported.
from rownorm import distributed, nn, ops, reference  # noqa: E402,F401
from rownorm.diagnostics import Plan, explain  # noqa: E402
from rownorm.functional import (  # noqa: E402
    add_rms_norm,
    l1_normalize,
    l2_normalize,
    layer_norm,
    log_softmax,
    rms_norm,
    softmax,
)

# The installed distribution's version (importlib.metadata), e.g. "0.2.0+cu13": the local label
# names the CUDA major version the library is built for. In-place builds report the version
# setup.py recorded in the build info.
__version__ = package_version()

__all__ = [
    "add_rms_norm",
    "Plan",
    "build_info",
    "explain",
    "l1_normalize",
    "l2_normalize",
    "layer_norm",
    "log_softmax",
    "nn",
    "patch_model",
    "patch_modeling",
    "reference",
    "rms_norm",
    "softmax",
    "__version__",
]

# Hugging Face transformers integration (rownorm.integrations.transformers), imported on first
# use: `import rownorm` imports neither it nor transformers.
_LAZY = {"patch_model", "patch_modeling"}


def __getattr__(name: str):
    if name in _LAZY:
        from rownorm.integrations import transformers as _hf

        return getattr(_hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
