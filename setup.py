"""Builds rownorm._C: the CUDA + CPU kernels of rownorm against the LibTorch stable ABI.

One wheel (cp310-abi3) serves every CPython >= 3.10 and every torch >= 2.11, because the
extension uses only the stable C shim (``torch/csrc/stable``, ``torch/headeronly``) and no
Python C API. It builds on machines without a GPU; environment knobs:

  TORCH_CUDA_ARCH_LIST  archs to build for. Unset (or "native"): the archs of the GPUs this
                        machine shows (a source build serves the machine it is built on, in a
                        fraction of the time); with no GPU visible, every supported arch:
                        8.0;8.6;8.9;9.0;10.0;12.0+PTX. Release wheels set the full list.
  CUDA_HOME             CUDA toolkit root (default: $CUDA_PATH, /usr/local/cuda, or nvcc's prefix)
  MAX_JOBS              parallel compile jobs (ninja)
  NVCC_THREADS          threads per nvcc invocation (--threads)
  DEBUG=1               -O0 -g -lineinfo host and device code
  ROWNORM_PTXAS_VERBOSE=1  print the ptxas resource report (registers, spills) for every kernel

Version: ``python/rownorm/_version.py`` holds the release version; the distribution's version
adds the CUDA major version the library is compiled for as a PEP 440 local label
(``0.2.0+cu13``). Why a local label rather than a distribution per CUDA major
(``rownorm-cu13``): the import name, ``importlib.metadata.version("rownorm")`` and requirements
such as ``rownorm>=0.2`` stay the same for every CUDA flavour (``0.2.0+cu13`` satisfies
``==0.2.0``), pip replaces one flavour with another rather than installing both over the same
files, and a source build labels itself from the toolkit it used. The cost: PyPI rejects local
labels, so wheels are published as GitHub release assets or on a per-CUDA index, as PyTorch's
own are.
"""

import os
import re
import runpy
import shutil
import subprocess
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
DEFAULT_ARCH_LIST = "8.0;8.6;8.9;9.0;10.0;12.0+PTX"
# The oldest arch the kernels support (DEFAULT_ARCH_LIST starts there).
MIN_ARCH = (8, 0)
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

import torch  # noqa: E402


def _choose_arch_list() -> tuple[str, str]:
    """(TORCH_CUDA_ARCH_LIST to build for, why it was chosen)."""
    given = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if given and given != "native":
        return given, "TORCH_CUDA_ARCH_LIST as given"
    if not torch.cuda.is_available():
        return DEFAULT_ARCH_LIST, "no GPU visible: every supported arch"
    # As cpp_extension does for an unset list: each visible GPU's arch, clamped to the newest
    # arch this torch (and so its CUDA toolkit) knows. No +PTX: this build serves this
    # machine's GPUs, and PTX of ~1,000 kernels would be JIT-compiled for minutes on any other.
    known = [a for a in torch.cuda.get_arch_list() if a.startswith("sm_")]
    sms = [int(re.sub(r"\D", "", a[3:])) for a in known]  # sm_90a -> 90
    newest = max(((sm // 10, sm % 10) for sm in sms), default=None)
    archs: list[str] = []
    used: list[str] = []
    skipped: list[str] = []
    for i in range(torch.cuda.device_count()):
        cap = torch.cuda.get_device_capability(i)
        name = f"{torch.cuda.get_device_name(i)} (sm_{cap[0]}{cap[1]})"
        if cap < MIN_ARCH:
            skipped.append(name)
            continue
        used.append(name)
        arch = f"{cap[0]}.{cap[1]}"
        if newest is not None and cap > newest:
            # A GPU newer than the toolkit: PTX of the newest arch, which its driver compiles.
            arch = f"{newest[0]}.{newest[1]}+PTX"
        if arch not in archs:
            archs.append(arch)
    note = f"; skipped below sm_{MIN_ARCH[0]}{MIN_ARCH[1]}: {', '.join(skipped)}" if skipped else ""
    if not archs:
        return DEFAULT_ARCH_LIST, f"no supported GPU visible{note}: every supported arch"
    archs.sort(key=lambda a: tuple(map(int, a.split("+")[0].split("."))))
    gpus = ", ".join(dict.fromkeys(used))
    return ";".join(archs), (
        f"TORCH_CUDA_ARCH_LIST unset: this machine's GPUs only, {gpus}{note}; set "
        "TORCH_CUDA_ARCH_LIST to build for others"
    )


ARCH_LIST, ARCH_REASON = _choose_arch_list()
# cpp_extension reads the list from the environment when it compiles.
os.environ["TORCH_CUDA_ARCH_LIST"] = ARCH_LIST
print(f"rownorm: building for TORCH_CUDA_ARCH_LIST={ARCH_LIST} ({ARCH_REASON})", flush=True)

# CUDA_HOME must be set before cpp_extension reads it.
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
        "cuda": CUDA_VERSION,
        # The CUDA major the library is compiled for; rownorm refuses to load into a torch
        # built for another (rownorm._loader.check_cuda_major).
        "cuda_major": CUDA_MAJOR,
        "arch_list": ARCH_LIST,
        "arch_source": ARCH_REASON,
        "revision": _git_revision(),
        "debug": DEBUG,
    }
    body = "".join(f"    {k!r}: {v!r},\n" for k, v in info.items())
    (ROOT / "python" / "rownorm" / "_build_info.py").write_text(
        '"""Written by setup.py at build time; do not edit."""\n\nBUILD_INFO = {\n' + body + "}\n"
    )


# The one source of the release version (also what rownorm.__version__ falls back to).
BASE_VERSION = runpy.run_path(str(ROOT / "python" / "rownorm" / "_version.py"))["VERSION"]
CUDA_VERSION = _nvcc_version()
try:
    CUDA_MAJOR = int(CUDA_VERSION.split(".")[0])
except ValueError as err:
    raise RuntimeError(
        f"rownorm: cannot tell the CUDA version of {cuda_home} (nvcc --version gave "
        f"{CUDA_VERSION!r}); check CUDA_HOME"
    ) from err
VERSION = f"{BASE_VERSION}+cu{CUDA_MAJOR}"
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
# __FILE__ (in torch's STD_TORCH_CHECK messages of its stable headers and in the shim error
# checks) relative to the repository and to torch's include dir (cpp_extension's, spelled as the
# compiler sees it), not the build machine's paths: a pip build may run in /tmp/pip-.... The host
# compiler also preprocesses nvcc's device passes, so -Xcompiler covers them.
TORCH_INCLUDE = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "include")
prefix_maps = [f"-fmacro-prefix-map={ROOT}/=", f"-fmacro-prefix-map={TORCH_INCLUDE}/="]
cxx_flags += prefix_maps
nvcc_flags += [f"-Xcompiler={flag}" for flag in prefix_maps]
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
    packages=find_packages(where="python", include=["rownorm", "rownorm.*"]),
    package_dir={"": "python"},
    # py.typed: rownorm's Python API is annotated (PEP 561).
    package_data={"rownorm": ["py.typed"]},
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
    install_requires=[f"torch>={MIN_TORCH}"],
)
