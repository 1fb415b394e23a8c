"""Builds rownorm._C: the CUDA + CPU kernels of rownorm against the LibTorch stable ABI.

One wheel (cp310-abi3) serves every CPython >= 3.10 and every torch >= 2.11, because the
extension uses only the stable C shim (``torch/csrc/stable``, ``torch/headeronly``) and no
Python C API. It builds on machines without a GPU; environment knobs:

  TORCH_CUDA_ARCH_LIST  archs to build for (default: 8.0;8.6;8.9;9.0;10.0;12.0+PTX)
  CUDA_HOME             CUDA toolkit root (default: $CUDA_PATH, /usr/local/cuda, or nvcc's prefix)
  MAX_JOBS              parallel compile jobs (ninja)
  NVCC_THREADS          threads per nvcc invocation (--threads)
  DEBUG=1               -O0 -g -lineinfo host and device code
  ROWNORM_PTXAS_VERBOSE=1  print the ptxas resource report (registers, spills) for every kernel
"""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
DEFAULT_ARCH_LIST = "8.0;8.6;8.9;9.0;10.0;12.0+PTX"
# torch 2.11: the oldest torch whose stable ABI has everything the bindings use.
TORCH_TARGET_VERSION = "0x020b000000000000"
MIN_TORCH = "2.11"


def _find_cuda_home() -> str | None:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    if Path("/usr/local/cuda/bin/nvcc").exists():
        return "/usr/local/cuda"
    nvcc = shutil.which("nvcc")
    if nvcc:
        # The nvcc on PATH may be a wrapper script; trust it only if a toolkit sits beside it.
        prefix = Path(os.path.realpath(nvcc)).parent.parent
        if (prefix / "include" / "cuda_runtime.h").exists():
            return str(prefix)
    return None


cuda_home = _find_cuda_home()
if cuda_home is None:
    raise RuntimeError(
        "rownorm: no CUDA toolkit found; set CUDA_HOME to the toolkit root (the directory "
        "holding bin/nvcc and include/cuda_runtime.h)"
    )
os.environ["CUDA_HOME"] = cuda_home
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_ARCH_LIST)

import torch  # noqa: E402  (CUDA_HOME must be set before cpp_extension reads it)
from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # noqa: E402


def _read_sources() -> list[str]:
    lines = (ROOT / "src" / "sources.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def _git_revision() -> str:
    try:
        sha = (
            subprocess.check_output(
                ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, stderr=subprocess.DEVNULL
            )
            .decode()
            .strip()
        )
        dirty = subprocess.call(
            ["git", "diff", "--quiet", "HEAD"], cwd=ROOT, stderr=subprocess.DEVNULL
        )
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("ROWNORM_REVISION", "unknown")


def _nvcc_version() -> str:
    try:
        out = subprocess.check_output([os.path.join(cuda_home, "bin", "nvcc"), "--version"])
        for line in out.decode().splitlines():
            if "release" in line:
                return line.split("release")[1].split(",")[0].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return str(torch.version.cuda)


def _write_build_info() -> None:
    info = {
        "version": VERSION,
        "torch_built_against": torch.__version__.split("+")[0],
        "torch_cuda_built_against": torch.version.cuda,
        "min_torch": MIN_TORCH,
        "cuda": _nvcc_version(),
        "arch_list": os.environ["TORCH_CUDA_ARCH_LIST"],
        "revision": _git_revision(),
        "debug": DEBUG,
    }
    body = "".join(f"    {k!r}: {v!r},\n" for k, v in info.items())
    (ROOT / "python" / "rownorm" / "_build_info.py").write_text(
        '"""Written by setup.py at build time; do not edit."""\n\nBUILD_INFO = {\n' + body + "}\n"
    )


VERSION = "0.1.0"
DEBUG = os.environ.get("DEBUG", "0") == "1"
_write_build_info()

# (Py_LIMITED_API itself is defined by cpp_extension for py_limited_api=True.)
common_flags = [f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}", "-DUSE_CUDA"]
opt = ["-O0", "-g"] if DEBUG else ["-O3"]
cxx_flags = ["-std=c++17", *opt, *common_flags]
nvcc_flags = [
    "-std=c++17",
    *opt,
    *common_flags,
    "--expt-relaxed-constexpr",
    "-lineinfo",
    f"--threads={os.environ.get('NVCC_THREADS', '1')}",
]
if DEBUG:
    nvcc_flags += ["-G"]
if os.environ.get("ROWNORM_PTXAS_VERBOSE") == "1":
    nvcc_flags += ["-Xptxas=-v"]


class BuildExt(BuildExtension.with_options(use_ninja=True)):
    """build_ext that refuses a library carrying its own copy of the C++ runtime.

    rownorm reports bad input by throwing C++ exceptions that torch catches and turns into
    Python errors. If the compiler links libstdc++ statically (seen: a toolchain under
    /opt/gcc whose driver does so by default), the library throws with its private runtime and
    the process crashes on the first error instead of raising. Checked with readelf when
    it is available.
    """

    def run(self) -> None:
        super().run()
        readelf = shutil.which("readelf")
        if readelf is None:
            return
        for extension in self.extensions:
            path = self.get_ext_fullpath(extension.name)
            if self.inplace:
                path = os.path.join(
                    ROOT, "python", *extension.name.split(".")[:-1], os.path.basename(path)
                )
            if not os.path.exists(path):
                continue
            dynamic = subprocess.run([readelf, "-d", path], capture_output=True, text=True).stdout
            if "libstdc++" not in dynamic:
                raise RuntimeError(
                    f"rownorm: {os.path.basename(path)} does not link libstdc++ dynamically "
                    f"(compiler: {os.environ.get('CXX', 'c++')}); its C++ exceptions would crash "
                    "torch instead of raising errors. Build with a compiler that links the "
                    "shared libstdc++, e.g. CXX=/usr/bin/g++."
                )


ext = CUDAExtension(
    name="rownorm._C",
    sources=_read_sources(),
    include_dirs=[str(ROOT / "src")],
    extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
    # A launcher declared in kernels/launch.h but never instantiated is a link error here, not
    # an "undefined symbol" at import time (every other symbol resolves in torch and cudart).
    extra_link_args=["-Wl,--no-undefined"],
    py_limited_api=True,
)

setup(
    name="rownorm",
    version=VERSION,
    packages=["rownorm"],
    package_dir={"": "python"},
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
    python_requires=">=3.10",
    install_requires=[f"torch>={MIN_TORCH}"],
)
