"""Finds and loads rownorm's compiled library, with one clear error when it cannot."""

from __future__ import annotations

import glob
import os

import torch

MIN_TORCH = (2, 11)


def _torch_version() -> tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def build_info() -> dict:
    """What this copy of rownorm was built against: torch, CUDA, archs and source revision."""
    try:
        from rownorm._build_info import BUILD_INFO
    except ImportError:  # a source tree that was never built
        return {"version": "unknown", "revision": "unbuilt source tree"}
    return dict(BUILD_INFO)


def load_library() -> str:
    """Loads ``_C*.so`` beside this file into torch's dispatcher; returns its path."""
    if _torch_version() < MIN_TORCH:
        raise ImportError(
            f"rownorm needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (it is built against the "
            f"LibTorch stable ABI of torch {MIN_TORCH[0]}.{MIN_TORCH[1]}); found torch "
            f"{torch.__version__}. Upgrade torch."
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
        info = build_info()
        raise ImportError(
            f"rownorm: could not load {os.path.basename(path)}: {err}. This build expects torch "
            f">= {info.get('min_torch', '2.11')} with CUDA {info.get('torch_cuda_built_against')} "
            f"(built against torch {info.get('torch_built_against')}); found torch "
            f"{torch.__version__} with CUDA {torch.version.cuda}. Install a rownorm wheel built "
            "for this torch's CUDA major version, or rebuild from source."
        ) from err
    return path
