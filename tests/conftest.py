"""pytest configuration of the rownorm tests: markers, the device fixture, per-test seeds and
the hypothesis profiles.

The tests import the installed package (``import rownorm``), never the source tree, so they
run the same against an in-place build (``PYTHONPATH=python``) and an installed wheel.

Hypothesis profiles (``ROWNORM_HYPOTHESIS_PROFILE``): ``ci`` (the default: few examples, a
fixed derandomized sequence, so CI's CPU run is fast and reproducible) and ``gpu`` (thousands
of random examples, for a run on a GPU machine: ``ROWNORM_FUZZ_EXAMPLES`` per test, default
2,000).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import zlib

import pytest
import rownorm  # noqa: F401  (loads the library: torch.ops.rownorm.* exist from here on)
import torch
from hypothesis import HealthCheck, settings
from utils import HAS_CUDA

settings.register_profile(
    "ci",
    max_examples=25,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "gpu",
    # ROWNORM_FUZZ_EXAMPLES sets the count per property: the 52,000 cases of the default took
    # 84 s with 15 workers on a 32-core H200 machine (the comparisons run on host copies)
    max_examples=int(os.environ.get("ROWNORM_FUZZ_EXAMPLES", "2000")),
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("ROWNORM_HYPOTHESIS_PROFILE", "ci"))

# pytest-xdist workers share the cores: each with torch's default pool (one thread per core)
# oversubscribes them many times over, which made the GPU machine's fuzz net CPU-bound (its
# examples run the CPU op, torch and the float64 reference beside the CUDA op).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(
        max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    )

# CPU always; CUDA where a GPU is present (skipped, not silently dropped, where it is not).
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")],
    ),
]


def pytest_terminal_summary(terminalreporter) -> None:
    """The CUDA fuzz net's size (test_properties.test_cuda_matches_cpu_and_torch): the
    ``fuzz_cases`` its shards recorded, summed (their reports reach here from pytest-xdist's
    workers too)."""
    total = shards = 0
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for name, value in getattr(report, "user_properties", ()):
                if name == "fuzz_cases":
                    total, shards = total + value, shards + 1
    if shards:
        profile = os.environ.get("ROWNORM_HYPOTHESIS_PROFILE", "ci")
        terminalreporter.write_line(
            f"rownorm fuzz: {total} CUDA cases in {shards} shards (CUDA vs the CPU op vs torch "
            f"vs the float64 reference, forward and backward; hypothesis profile {profile})"
        )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "large: full-size workloads (GPU only, tens of GB of device memory)"
    )
    config.addinivalue_line("markers", "cuda: needs a CUDA device")
    config.addinivalue_line(
        "markers",
        "gpu_heavy: needs up to ~20 GiB of device memory at its peak (at most "
        "ROWNORM_TEST_HEAVY_SLOTS such tests run at a time across pytest-xdist's workers)",
    )
    config.addinivalue_line(
        "markers",
        "streams: runs ops on several CUDA streams (scripts/gpu_check.sh runs these tests "
        "under PyTorch's CUDA stream sanitizer, TORCH_CUDA_SANITIZER=1)",
    )


# Tests marked `gpu_heavy` (the parameter-gradient tests over many chunks: 0.7-18 GB at their
# peak on the H100, twelve of them above 2 GB; every other test of test_autograd, test_explain
# and test_concurrency took at most 1.6 GB) take one of a few slots shared by every process of
# the run, so that pytest-xdist's workers do not run them all at once: 15 workers that met on
# them ran an 80 GB GPU out of memory in runs of only those tests
# (benchmarks/results/h100/NOTES.md §47, §48). A slot is an exclusive lock on one of
# ROWNORM_TEST_HEAVY_SLOTS files (default: one per 20 GiB of the device's memory, at least
# one); the test returns its cached blocks to the device before giving the slot back.
_HEAVY_SLOT_BYTES = 20 * 1024**3


@contextlib.contextmanager
def _heavy_slot():
    import fcntl

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    raw = os.environ.get("ROWNORM_TEST_HEAVY_SLOTS", "")
    try:
        slots = int(raw) if raw else max(1, total // _HEAVY_SLOT_BYTES)
    except ValueError:
        raise pytest.UsageError(f"ROWNORM_TEST_HEAVY_SLOTS={raw!r} is not an integer") from None
    folder = tempfile.gettempdir()
    files = [
        open(os.path.join(folder, f"rownorm-tests-gpu-heavy-{os.getuid()}-{i}.lock"), "w")
        for i in range(max(1, slots))
    ]
    try:
        while True:
            for f in files:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                try:
                    yield
                finally:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                    fcntl.flock(f, fcntl.LOCK_UN)
                return
            time.sleep(0.05)
    finally:
        for f in files:
            f.close()


@pytest.fixture(autouse=True)
def _gpu_heavy_slot(request):
    if HAS_CUDA and request.node.get_closest_marker("gpu_heavy") is not None:
        with _heavy_slot():
            yield
    else:
        yield


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """``ROWNORM_FAILURE_LOG=PATH``: each failure appended to PATH as it happens, with its
    traceback. pytest (and pytest-xdist's controller) print failures at the end of the run, so
    a run cut by a time limit (scripts/gpu_check.sh) would lose them. Written by the process
    that reports (the controller under pytest-xdist), once per failure."""
    path = os.environ.get("ROWNORM_FAILURE_LOG")
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"===== FAILED {report.nodeid} ({report.when})\n{report.longreprtext}\n")


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _seed(request: pytest.FixtureRequest) -> None:
    """A fixed seed per test (from its id): fresh random inputs that are the same every run."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
