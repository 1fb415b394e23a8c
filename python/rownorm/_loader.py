"""Finds and loads rownorm's compiled library, with one clear error when it cannot.

Before loading, two checks that the dynamic loader cannot make in a way a user understands:
the running torch is at least the stable-ABI target, and it is built for the CUDA major version
the library is compiled for (a CUDA 13 library in a CUDA 12 torch would resolve the wrong CUDA
runtime, or fail later with an unrelated-looking message).
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
from pathlib import Path

import torch

from rownorm._version import VERSION

MIN_TORCH = (2, 11)
_DISTRIBUTION = "rownorm"


def _torch_version() -> tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def build_info() -> dict[str, object]:
    """What this copy of rownorm was built against: torch, CUDA, archs and source revision.

    Written by ``setup.py`` at build time. A library built another way (CMake, or a copy of
    ``_C*.so`` without its build info) reports only the source version.
    """
    try:
        from rownorm._build_info import BUILD_INFO
    except ImportError:
        return {"version": VERSION, "revision": "no build info (not built by setup.py)"}
    return dict(BUILD_INFO)


def installed_distribution() -> importlib.metadata.Distribution | None:
    """The installed rownorm distribution if it holds these very files, else None.

    None for a source tree on ``PYTHONPATH`` (which may shadow an installed wheel of another
    version), including the ``rownorm.egg-info`` a build leaves beside it: only an installer
    writes a ``RECORD``, and an egg-info there may be older than the last in-place build.
    """
    try:
        dist = importlib.metadata.distribution(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.read_text("RECORD") is None:
        return None
    installed = Path(str(dist.locate_file("rownorm/__init__.py"))).resolve()
    return dist if installed == Path(__file__).resolve().parent / "__init__.py" else None


def package_version() -> str:
    """The version of the rownorm that is imported, e.g. ``0.2.0+cu13``; never "unknown".

    The installed distribution's (``importlib.metadata``), else the version the in-place
    build recorded, else the source version.
    """
    dist = installed_distribution()
    if dist is not None:
        return dist.version
    return str(build_info().get("version") or VERSION)


def _major(cuda_version: object) -> int | None:
    """13 for "13.0" or 13; None for None or anything that is not a version."""
    if cuda_version is None:
        return None
    try:
        return int(str(cuda_version).split(".")[0])
    except ValueError:
        return None


def check_cuda_major(
    built_for: int | str | None,
    torch_cuda: str | None,
    *,
    version: str = VERSION,
    torch_version: str = "",
) -> None:
    """Raises ImportError when the library's CUDA major differs from torch's.

    ``built_for``: the CUDA major (or version) the library was compiled for, None if unknown.
    ``torch_cuda``: ``torch.version.cuda``. Minor versions may differ (CUDA keeps binary
    compatibility within a major). When either side is None there is nothing to compare: a
    library without build info, or a torch built without CUDA (whether such a torch can load
    the library is the loader's question, answered with its own message).
    """
    built, running = _major(built_for), _major(torch_cuda)
    if built is None or running is None or built == running:
        return
    torch_name = f"torch {torch_version}" if torch_version else "torch"
    raise ImportError(
        f"rownorm {version} is built for CUDA {built}, but {torch_name} is built for CUDA "
        f"{torch_cuda}; a library of one CUDA major version cannot run in a torch of another. "
        f"Install a torch built for CUDA {built} (https://pytorch.org/get-started/locally/ "
        f"gives the command), or a rownorm wheel built for CUDA {running} (version suffix "
        f"+cu{running}), or build "
        f"rownorm from source against this torch with a CUDA {running} toolkit "
        "(`pip install --no-build-isolation .`)."
    )


def load_library() -> str:
    """Loads ``_C*.so`` beside this file into torch's dispatcher; returns its path."""
    if _torch_version() < MIN_TORCH:
        raise ImportError(
            f"rownorm needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (it is built against the "
            f"LibTorch stable ABI of torch {MIN_TORCH[0]}.{MIN_TORCH[1]}); found torch "
            f"{torch.__version__}. Upgrade torch."
        )
    info = build_info()
    check_cuda_major(
        info.get("cuda_major", info.get("cuda")),
        torch.version.cuda,
        version=package_version(),
        torch_version=torch.__version__,
    )
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = sorted(glob.glob(os.path.join(here, "_C*.so")))
    if not candidates:
        raise ImportError(
            f"rownorm: compiled library _C*.so not found in {here}. Install the wheel, or build "
            "in place with `pip install --no-build-isolation -e .`."
        )
    path = candidates[0]
    try:
        torch.ops.load_library(path)
    except OSError as err:
        raise ImportError(_load_error(os.path.basename(path), err, info)) from err
    return path


def _load_error(name: str, err: OSError, info: dict[str, object]) -> str:
    # torch.ops.load_library wraps the dynamic loader's error, which names the missing library.
    root: BaseException = err
    while root.__cause__ is not None:
        root = root.__cause__
    if root is not err:
        err = OSError(f"{err} ({root})")
    built = _major(info.get("cuda_major", info.get("cuda")))
    cuda = f"CUDA {built}" if built is not None else "CUDA"
    if torch.version.cuda is None:
        # The library links libtorch_cuda and the CUDA runtime, which a CPU-only (or ROCm)
        # build of torch does not have, so it cannot load even to run its CPU kernels.
        return (
            f"rownorm: could not load {name}: {err}. torch {torch.__version__} is built without "
            f"CUDA, and rownorm's library links torch's CUDA library and the {cuda} runtime. "
            f"Install a {cuda} build of torch: it also runs on machines without a GPU, where "
            "rownorm's CPU kernels serve CPU tensors."
        )
    return (
        f"rownorm: could not load {name}: {err}. This build expects torch "
        f">= {info.get('min_torch', '2.11')} built for {cuda} (built against torch "
        f"{info.get('torch_built_against')} with CUDA {info.get('torch_cuda_built_against')}); "
        f"found torch {torch.__version__} with CUDA {torch.version.cuda}. Install a rownorm "
        "wheel built for this torch's CUDA major version, or rebuild from source."
    )
