"""The installed package: version, build info, the CUDA-major check, ``py.typed``,
``python -m rownorm``, the public API, the seed workload.

The seed expression (DESIGN §2: seeds 000/002) is ``x / torch.norm(x, p=2, dim=1,
keepdim=True)`` on a 32768 × 65535 float32 tensor; here it runs at 64 rows (the full size is
in test_large.py).

Why the grid is what it is: these are properties of the package, not of an op, so one id
each (the seed expression per device and eps).
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import struct
import subprocess
import sys
import types
from pathlib import Path

import pytest
import rownorm
import torch
from packaging.version import Version
from rownorm import _loader
from rownorm._version import VERSION
from utils import TOL, assert_matches, randn, reference_forward

PACKAGE_DIR = Path(rownorm.__file__).resolve().parent


def test_build_info():
    info = rownorm.build_info()
    for key in ("torch_built_against", "cuda", "arch_list", "revision"):
        assert key in info, f"build_info() lacks {key!r}: {info}"
        assert isinstance(info[key], str) and info[key], f"{key} is empty"
    assert rownorm.__version__ == info["version"], info
    # The CUDA major the library is compiled for: recorded for the import-time check, and the
    # local label of the version (0.2.0+cu13).
    assert info["cuda_major"] == int(info["cuda"].split(".")[0]), info
    assert Version(info["version"]).local == f"cu{info['cuda_major']}", info
    if torch.version.cuda is not None:  # the library loaded, so the majors agree
        assert int(torch.version.cuda.split(".")[0]) == info["cuda_major"], info
    assert info["arch_source"] and isinstance(info["arch_source"], str), info

    # The stable ABI targets torch >= min_torch; the running torch must be at least that.
    def version(text: str) -> tuple[int, int]:
        major, minor = text.split("+")[0].split(".")[:2]
        return int(major), int(minor)

    assert version(info["torch_built_against"]) >= (2, 11), info
    assert version(torch.__version__) >= version(info.get("min_torch", "2.11")), info


def test_version():
    version = rownorm.__version__
    assert version != "unknown"
    parsed = Version(version)  # PEP 440, or InvalidVersion
    # _version.VERSION is the one written source; builds add only the local CUDA label.
    assert parsed.public == Version(VERSION).public, (version, VERSION)
    dist = _loader.installed_distribution()
    if dist is not None:
        assert version == importlib.metadata.version("rownorm") == dist.version
    else:  # in place (PYTHONPATH=python): what the build recorded, else the source version
        assert version == rownorm.build_info().get("version", VERSION)


def test_version_ignores_a_distribution_of_other_files(monkeypatch):
    """A source tree on PYTHONPATH reports its own version, not that of a wheel it shadows."""

    def fake_distribution(location: Path):
        dist = types.SimpleNamespace(
            version="9.9.9+cu99",
            locate_file=lambda rel: location / rel,
            read_text=lambda name: "" if name == "RECORD" else None,
        )
        return lambda name: dist

    monkeypatch.setattr(
        importlib.metadata, "distribution", fake_distribution(Path("/elsewhere/site-packages"))
    )
    assert _loader.package_version() == rownorm.build_info().get("version", VERSION)
    monkeypatch.setattr(importlib.metadata, "distribution", fake_distribution(PACKAGE_DIR.parent))
    assert _loader.package_version() == "9.9.9+cu99"


def test_py_typed_shipped():
    assert (PACKAGE_DIR / "py.typed").is_file()
    dist = _loader.installed_distribution()
    if dist is not None:
        files = {str(f) for f in dist.files or ()}
        assert "rownorm/py.typed" in files, sorted(files)


def _elf_section(path: str, name: str) -> bytes:
    """The contents of section ``name`` of a 64-bit little-endian ELF file."""
    data = Path(path).read_bytes()
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i: int) -> tuple[int, int, int]:  # (name offset, file offset, size)
        base = shoff + i * shentsize
        (name_at,) = struct.unpack_from("<I", data, base)
        offset, size = struct.unpack_from("<QQ", data, base + 0x18)
        return name_at, offset, size

    _, names_at, _ = header(shstrndx)
    for i in range(shnum):
        name_at, offset, size = header(i)
        end = data.index(b"\0", names_at + name_at)
        if data[names_at + name_at : end].decode() == name:
            return data[offset : offset + size]
    raise AssertionError(f"{path} has no {name} section")


def test_messages_name_no_build_paths():
    """The library's read-only data (its messages: the source files __FILE__ names in checks
    compiled into it) holds no path of the machine that built it: sources are named relative to
    the repository and to torch's include dir (setup.py's -fmacro-prefix-map)."""
    rodata = _elf_section(rownorm._LIBRARY_PATH, ".rodata")
    for relative in (b"src/bindings/", b"torch/csrc/"):
        at = rodata.find(relative)
        assert at >= 0, f"no {relative!r} in .rodata: the check is looking at the wrong thing"
        while at >= 0:
            start = rodata.rfind(b"\0", 0, at) + 1
            assert rodata[start:at] == b"", rodata[start : at + 40]
            at = rodata.find(relative, at + 1)


@pytest.mark.parametrize("built", [13, "13", "13.0"])
def test_cuda_major_mismatch_is_named(built):
    with pytest.raises(ImportError) as info:
        _loader.check_cuda_major(built, "12.8", version="0.2.0+cu13", torch_version="2.14.1+cu128")
    message = str(info.value)
    assert "rownorm 0.2.0+cu13 is built for CUDA 13" in message, message
    assert "torch 2.14.1+cu128 is built for CUDA 12.8" in message, message
    assert "+cu12" in message and "CUDA 12 toolkit" in message, message


@pytest.mark.parametrize(
    ("built", "torch_cuda"),
    [
        (13, "13.0"),
        (13, "13.2"),  # minor versions may differ
        (13, None),  # torch without CUDA: nothing to compare (loading decides)
        (None, "12.8"),  # a library without build info
        ("no build info", "12.8"),
    ],
)
def test_cuda_major_allowed(built, torch_cuda):
    _loader.check_cuda_major(built, torch_cuda)


def test_import_refuses_torch_of_another_cuda_major():
    """End to end: rownorm's import names both majors when torch reports another one."""
    built = rownorm.build_info().get("cuda_major")
    if built is None:
        pytest.skip("no build info (library not built by setup.py)")
    other = f"{int(built) - 1}.8"
    code = f"import torch; torch.version.cuda = {other!r}; import rownorm"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert f"is built for CUDA {built}, but torch" in proc.stderr, proc.stderr[-3000:]
    assert f"is built for CUDA {other}" in proc.stderr, proc.stderr[-3000:]


def test_load_error_for_torch_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    err = OSError("Could not load this library: _C.abi3.so")  # as torch.ops.load_library
    err.__cause__ = OSError("libtorch_cuda.so: cannot open shared object file")
    message = _loader._load_error("_C.abi3.so", err, {"cuda_major": 13})
    assert "built without CUDA" in message and "CUDA 13 build of torch" in message, message
    assert "libtorch_cuda.so" in message, message


def test_public_api():
    assert set(rownorm.__all__) >= {"build_info", "l2_normalize", "nn", "reference"}
    assert callable(rownorm.l2_normalize)
    assert issubclass(rownorm.nn.L2Norm, torch.nn.Module)
    assert hasattr(torch.ops.rownorm, "l2_normalize")
    assert hasattr(torch.ops.rownorm, "l2_normalize_backward")
    assert "torch.nn.functional.normalize" in (rownorm.l2_normalize.__doc__ or "")


def test_python_dash_m_rownorm():
    """``python -m rownorm`` passes its self-check; ``import rownorm`` loads neither the op
    table, the benchmark, the integrations nor transformers, and the self-check loads no
    benchmark code; ``rownorm.patch_model`` loads the transformers integration but not
    transformers itself (one interpreter for all: each costs a torch import)."""
    code = (
        "import runpy, sys, rownorm\n"
        "loaded = lambda p: sorted(m for m in sys.modules if m.startswith(p))\n"
        "assert not loaded('rownorm.testing'), loaded('rownorm.testing')\n"
        "assert not loaded('rownorm.bench'), loaded('rownorm.bench')\n"
        "assert not loaded('rownorm.integrations'), loaded('rownorm.integrations')\n"
        "assert not loaded('transformers'), loaded('transformers')\n"
        "assert callable(rownorm.patch_model) and callable(rownorm.patch_modeling)\n"
        "assert loaded('rownorm.integrations.transformers')\n"
        "assert not loaded('transformers'), loaded('transformers')\n"
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


def _setup_py_arch_chooser(devices, torch_archs):
    """setup.py's _choose_arch_list, run against a fake torch.cuda showing ``devices``."""
    setup_py = Path(__file__).resolve().parent.parent / "setup.py"
    if not setup_py.is_file():
        pytest.skip("setup.py is not beside tests/")
    tree = ast.parse(setup_py.read_text())
    names = {"_choose_arch_list", "DEFAULT_ARCH_LIST", "MIN_ARCH"}
    wanted = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name in names)
        or (isinstance(node, ast.Assign) and {getattr(t, "id", None) for t in node.targets} & names)
    ]
    cuda = types.SimpleNamespace(
        is_available=lambda: bool(devices),
        device_count=lambda: len(devices),
        get_device_name=lambda i: devices[i][0],
        get_device_capability=lambda i: devices[i][1],
        get_arch_list=lambda: list(torch_archs),
    )
    namespace = {"os": os, "re": re, "torch": types.SimpleNamespace(cuda=cuda)}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(setup_py), "exec"), namespace)
    return namespace["_choose_arch_list"], namespace["DEFAULT_ARCH_LIST"]


TORCH_ARCHS = ("sm_80", "sm_86", "sm_90", "sm_100", "sm_120")


@pytest.mark.parametrize(
    ("env", "devices", "expected"),
    [
        ("9.0", [("H100", (9, 0))], "9.0"),  # an explicit list always wins
        (None, [("H100", (9, 0))] * 2, "9.0"),  # the local GPU only, once
        ("native", [("H100", (9, 0)), ("A100", (8, 0))], "8.0;9.0"),
        (None, [("T4", (7, 5)), ("L4", (8, 9))], "8.9"),  # below sm_80: not built for
        (None, [("next", (13, 0))], "12.0+PTX"),  # newer than the toolkit: PTX of its newest
        (None, [], "default"),  # no GPU: every supported arch
        (None, [("T4", (7, 5))], "default"),
    ],
)
def test_setup_py_arch_list(monkeypatch, env, devices, expected):
    choose, default = _setup_py_arch_chooser(devices, TORCH_ARCHS)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    if env is not None:
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", env)
    archs, reason = choose()
    assert archs == (default if expected == "default" else expected), reason
    if devices and expected != "default" and env != "9.0":
        assert "this machine's GPUs only" in reason and devices[-1][0] in reason, reason


def test_failure_log_written_as_failures_happen(tmp_path, monkeypatch):
    """ROWNORM_FAILURE_LOG (tests/conftest.py): a failure is appended with its traceback when
    it is reported; passes are not; pytest-xdist workers leave it to the controller."""
    import conftest

    log = tmp_path / "failures.txt"
    monkeypatch.setenv("ROWNORM_FAILURE_LOG", str(log))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)

    def report(outcome: str) -> pytest.TestReport:
        longrepr = "AssertionError: planted" if outcome == "failed" else None
        return pytest.TestReport("t.py::x", ("t.py", 1, "x"), {}, outcome, longrepr, "call")

    conftest.pytest_runtest_logreport(report("passed"))
    assert not log.exists()
    conftest.pytest_runtest_logreport(report("failed"))
    assert log.read_text() == "===== FAILED t.py::x (call)\nAssertionError: planted\n"
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    conftest.pytest_runtest_logreport(report("failed"))
    assert log.read_text().count("FAILED") == 1
