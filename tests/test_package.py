"""The installed package: build info, ``python -m rownorm``, the public API, the seed workload.

The seed expression (DESIGN §2: seeds 000/002) is ``x / torch.norm(x, p=2, dim=1,
keepdim=True)`` on a 32768 × 65535 float32 tensor; here it runs at 64 rows (the full size is
in test_large.py).

Why the grid is what it is: these are properties of the package, not of an op, so one id
each (the seed expression per device and eps).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import rownorm
import torch
from utils import TOL, assert_matches, randn, reference_forward


def test_build_info():
    info = rownorm.build_info()
    for key in ("torch_built_against", "cuda", "arch_list", "revision"):
        assert key in info, f"build_info() lacks {key!r}: {info}"
        assert isinstance(info[key], str) and info[key], f"{key} is empty"
    assert rownorm.__version__ == info.get("version", "unknown")

    # The stable ABI targets torch >= min_torch; the running torch must be at least that.
    def version(text: str) -> tuple[int, int]:
        major, minor = text.split("+")[0].split(".")[:2]
        return int(major), int(minor)

    assert version(info["torch_built_against"]) >= (2, 11), info
    assert version(torch.__version__) >= version(info.get("min_torch", "2.11")), info


def test_public_api():
    assert set(rownorm.__all__) >= {"build_info", "l2_normalize", "nn", "reference"}
    assert callable(rownorm.l2_normalize)
    assert issubclass(rownorm.nn.L2Norm, torch.nn.Module)
    assert hasattr(torch.ops.rownorm, "l2_normalize")
    assert hasattr(torch.ops.rownorm, "l2_normalize_backward")
    assert "torch.nn.functional.normalize" in (rownorm.l2_normalize.__doc__ or "")


def test_python_dash_m_rownorm():
    """``python -m rownorm`` passes its self-check; ``import rownorm`` loads neither the op
    table nor the benchmark, and the self-check loads no benchmark code (one interpreter for
    both: each costs a torch import)."""
    code = (
        "import runpy, sys, rownorm\n"
        "loaded = lambda p: sorted(m for m in sys.modules if m.startswith(p))\n"
        "assert not loaded('rownorm.testing'), loaded('rownorm.testing')\n"
        "assert not loaded('rownorm.bench'), loaded('rownorm.bench')\n"
        "sys.argv = ['rownorm', '--no-timing']\n"
        "try:\n"
        "    runpy.run_module('rownorm', run_name='__main__', alter_sys=True)\n"
        "finally:\n"
        "    print('benchmark modules loaded:', loaded('rownorm.bench'))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "torch_built_against" in out, out[-4000:]
    assert "PASS" in out and "FAIL " not in out, out[-4000:]
    assert "benchmark modules loaded: []" in out, out[-4000:]


@pytest.mark.parametrize("eps", [0.0, 1e-12])
def test_seed_expression_reduced(device, eps):
    """rownorm.l2_normalize(x, dim=1, eps=0) is the seed expression, at 64 × 65535 float32."""
    x = randn((64, 65535), torch.float32, device)
    seed = x / torch.norm(x, p=2, dim=1, keepdim=True)
    out = rownorm.l2_normalize(x, dim=1, eps=eps)
    assert out.shape == seed.shape and out.dtype == seed.dtype and out.is_contiguous()
    tol = TOL[torch.float32]
    torch.testing.assert_close(out, seed, rtol=tol.rtol, atol=tol.atol * seed.abs().max().item())
    assert_matches(out, reference_forward(x, 1, eps))
