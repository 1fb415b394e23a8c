"""l2_normalize under torch.compile (fullgraph, dynamic shapes) and CUDA graphs.

* ``torch.compile(fullgraph=True, dynamic=True)`` traces the op through its fake: one graph,
  no graph breaks, serving several shapes without recompiling; the results equal eager
  execution, forward and backward.
* CUDA graphs: ``mode="reduce-overhead"`` of ``nn.Linear -> rownorm.nn.L2Norm`` (inductor's
  cudagraph trees) and a manual ``torch.cuda.graph`` capture on a side stream, replayed on new
  data. Both need the kernels to launch on the current (capturing) stream with no host sync.

Inductor compiles take seconds each on CI's CPUs, so the CPU runs a few compiled functions,
each called on several shapes.
"""

from __future__ import annotations

import pytest
import rownorm
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from utils import (
    DIM_CASES,
    TOL,
    assert_grad_matches,
    assert_matches,
    cuda_only,
    dtype_id,
    l2,
    l2_backward,
    randn,
    reference_forward,
)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch, so frame counts and recompile limits are its own."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    tol = TOL[expected.dtype]
    torch.testing.assert_close(actual, expected, rtol=tol.rtol, atol=tol.atol)


# (shapes of one rank, dim): the compiled function is called on each, with no size 0 or 1
# (which dynamic shapes specialize on).
DYNAMIC_CASES = {
    "last_dim": ([(4, 33), (7, 1000), (2, 65537)], -1),
    "middle_dim": ([(2, 5, 3), (3, 33, 4), (5, 7, 9)], 1),
}


@pytest.mark.parametrize("case", DYNAMIC_CASES)
def test_compile_fullgraph_dynamic(device, case):
    shapes, dim = DYNAMIC_CASES[case]

    def fn(x: torch.Tensor) -> torch.Tensor:
        return rownorm.l2_normalize(x * 2.0 + 0.25, dim) * 3.0

    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    for shape in shapes:
        x = randn(shape, torch.float32, device)
        out = compiled(x)
        _assert_close(out, reference_forward(x * 2.0 + 0.25, dim, 1e-12) * 3.0)
        frames.append(counter.frame_count)
    assert frames[0] >= 1 and frames == frames[:1] * len(frames), "recompiled for a new shape"
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_compile_backward(device, dtype):
    dim = -1

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return rownorm.l2_normalize(x, dim, 1e-6) * w

    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    for rows, n in ((3, 33), (6, 1025), (2, 4097)):
        x = randn((rows, n), dtype, device).requires_grad_(True)
        w = randn((n,), dtype, device)
        dy = randn((rows, n), dtype, device)
        out = compiled(x, w)
        (dx,) = torch.autograd.grad(out, x, dy)
        assert_matches(out, (reference_forward(x, dim, 1e-6).double() * w.double()).to(dtype))
        # d(out)/dx = l2_normalize_backward(dy * w, x): rownorm's own backward, via autograd.
        assert_grad_matches(dx, (dy.double() * w.double()).to(dtype), x, dim, 1e-6)
        frames.append(counter.frame_count)
    assert frames[0] >= 1 and frames == frames[:1] * len(frames), "recompiled for a new shape"
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_compile_module_linear_l2norm(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 257), rownorm.nn.L2Norm(-1)).to(device)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for batch in (3, 8, 5):
        x = randn((batch, 16), torch.float32, device)
        out = compiled(x)
        expected = F.normalize(model[0](x), dim=-1)
        _assert_close(out, expected)
        out.square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        F.normalize(model[0](x), dim=-1).square().sum().backward()
        for got, want in zip(grads, (p.grad for p in model.parameters()), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        model.zero_grad()
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_compile_output_strides_match_eager(device):
    """The fake's strides are the kernel's: a compiled call returns what eager returns."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return rownorm.l2_normalize(x.transpose(0, 1), 0)

    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    x, _ = DIM_CASES["middle"](9, torch.float32, device)
    out = compiled(x)
    eager = fn(x)
    assert out.shape == eager.shape and out.stride() == eager.stride()
    _assert_close(out, eager)


# ---------------------------------------------------------------------------------------------
# CUDA graphs


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("features", [257, 4096])
def test_cuda_graphs_reduce_overhead(dtype, features):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, features), rownorm.nn.L2Norm())
    model = model.to(device="cuda", dtype=dtype)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for step in range(5):
            torch.compiler.cudagraph_mark_step_begin()
            x = randn((32, 64), dtype, "cuda")
            out = compiled(x).clone()
            expected = F.normalize(model[0](x).float(), dim=-1).to(dtype)
            assert_matches(out, expected, what=f"step {step}")
    assert counters["inductor"]["cudagraph_skips"] == 0, "the graph was not captured"
    assert not counters["graph_break"], dict(counters["graph_break"])


@cuda_only
def test_cuda_graphs_reduce_overhead_training():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 1000), rownorm.nn.L2Norm()).cuda()
    reference = torch.nn.Sequential(torch.nn.Linear(32, 1000)).cuda()
    reference.load_state_dict(model[:1].state_dict())
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):
        torch.compiler.cudagraph_mark_step_begin()
        x = randn((16, 32), torch.float32, "cuda")
        dy = randn((16, 1000), torch.float32, "cuda")
        out = compiled(x)
        out.backward(dy)
        expected = F.normalize(reference(x), dim=-1)
        expected.backward(dy)
        _assert_close(out.detach().clone(), expected.detach())
        for got, want in zip(model[0].parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5)
            got.grad = None
            want.grad = None
    assert counters["inductor"]["cudagraph_skips"] == 0, "the graph was not captured"


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("n", [33, 1000, 4096, 65535, 131072, 262144])
def test_cuda_graph_capture_and_replay(dtype, n):
    """Capture forward, backward and the strided-dim path on a side stream; replay on new data."""
    rows = 5
    x = randn((rows, n), dtype, "cuda")
    dy = randn((rows, n), dtype, "cuda")
    x3 = randn((2, 7, 5), dtype, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as PyTorch recommends
        l2(x)
        l2_backward(dy, x)
        l2(x3, 1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        y = l2(x)
        dx = l2_backward(dy, x)
        y3 = l2(x3, 1)
    for step in range(3):
        x.copy_(randn((rows, n), dtype, "cuda"))
        dy.copy_(randn((rows, n), dtype, "cuda"))
        x3.copy_(randn((2, 7, 5), dtype, "cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(y, reference_forward(x, -1, 1e-12), what=f"replay {step}")
        assert_grad_matches(dx, dy, x, -1, 1e-12, what=f"replay {step}")
        assert_matches(y3, reference_forward(x3, 1, 1e-12), what=f"replay {step}")


@cuda_only
@pytest.mark.parametrize("n", [100000, 200008])
def test_cuda_graph_capture_cold(n):
    """A shape never run before is captured directly (the tier's first launch is in capture)."""
    x = randn((3, n), torch.float16, "cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = l2(x)
    x.copy_(randn((3, n), torch.float16, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(y, reference_forward(x, -1, 1e-12))
