"""Every op under torch.compile (fullgraph, dynamic shapes) and CUDA graphs.

* ``torch.compile(fullgraph=True, dynamic=True)`` traces the op through its fake: one graph,
  no graph breaks, serving several shapes without recompiling; the results equal eager
  execution, forward and backward.
* CUDA graphs: ``mode="reduce-overhead"`` of ``nn.Linear -> rownorm.nn.L2Norm`` (inductor's
  cudagraph trees) and a manual ``torch.cuda.graph`` capture on a side stream, replayed on new
  data. Both need the kernels to launch on the current (capturing) stream with no host sync.
* The same for the op table's ops (l1 / mean-abs, rms_norm, layer_norm, softmax, log_softmax,
  add_rms_norm), forward and backward with every parameter gradient, and their modules in
  one block compared with the torch modules they replace.

Inductor compiles take seconds each on CI's CPUs, so the CPU runs a few compiled functions,
each called on several shapes.
"""

from __future__ import annotations

import dataclasses

import pytest
import rownorm
import torch
import torch.nn.functional as F
from op_table import OP_FAMILIES, OPS, check_grads
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


# ---------------------------------------------------------------------------------------------
# The op set of the op table under torch.compile(fullgraph=True, dynamic=True), forward and
# backward (x, residual, weight and bias gradients), and its modules. One compiled function per
# op, called on three shapes (the row length changes too: parameters are dynamic as well).

OP_DYNAMIC_CASES = [(op_id, "last") for op_id in OP_FAMILIES] + [
    ("rms_norm_weight", "middle"),
    ("layer_norm_affine", "middle"),
    ("softmax", "middle"),
]
OP_SHAPES = {
    "last": ([(4, 33), (7, 1000), (3, 4097)], -1),
    "middle": ([(2, 5, 3), (3, 33, 4), (5, 7, 9)], 1),
}


@pytest.mark.parametrize(("op_id", "where"), OP_DYNAMIC_CASES, ids=str)
def test_compile_op_forward_backward(device, op_id, where):
    op = OPS[op_id]
    shapes, dim = OP_SHAPES[where]
    names = None

    def fn(*tensors):
        inp = dict(zip(names, tensors, strict=True))
        inp["x"] = inp["x"] * 2.0 + 0.25  # something for inductor to fuse around the op
        return tuple(o * 3.0 for o in op.call(inp, dim))

    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    for shape in shapes:
        inp = op.inputs(randn(shape, torch.float32, device), dim)
        names = op.grad_inputs(inp)
        results = []
        for f in (compiled, fn):
            leaves = [inp[k].detach().requires_grad_(True) for k in names]
            outs = f(*leaves)
            dys = [torch.ones_like(o) * (i + 1) for i, o in enumerate(outs)]
            grads = torch.autograd.grad(outs, leaves, dys)
            results.append((outs, grads))
        (c_outs, c_grads), (e_outs, e_grads) = results
        for c, e in zip(c_outs + c_grads, e_outs + e_grads, strict=True):
            assert c.shape == e.shape and c.dtype == e.dtype
            assert_matches(c, e, what=f"{op_id} {shape}")
        frames.append(counter.frame_count)
    assert frames[0] >= 1 and frames == frames[:1] * len(frames), "recompiled for a new shape"
    assert not counters["graph_break"], dict(counters["graph_break"])


class _Block(torch.nn.Module):
    """A pre-norm block using every rownorm module (or the torch ones it replaces)."""

    def __init__(self, torch_modules: bool) -> None:
        super().__init__()
        d = 48
        self.proj = torch.nn.Linear(16, d)
        if torch_modules:
            self.rms = torch.nn.RMSNorm(d)
            self.ln = torch.nn.LayerNorm(d)
            self.add_norm = torch.nn.RMSNorm(d, eps=1e-6)
            self.softmax = torch.nn.Softmax(-1)
            self.log_softmax = torch.nn.LogSoftmax(-1)
        else:
            self.rms = rownorm.nn.RMSNorm(d)
            self.ln = rownorm.nn.LayerNorm(d)
            self.add_norm = rownorm.nn.AddRMSNorm(d, eps=1e-6)
            self.softmax = rownorm.nn.Softmax(-1)
            self.log_softmax = rownorm.nn.LogSoftmax(-1)
        self.l1 = rownorm.nn.L1Norm(-1, 0.0, mean=True)
        self.torch_modules = torch_modules
        self.mlp = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        if self.torch_modules:
            r = self.mlp(self.rms(h)) + h
            normed = self.add_norm(r)
            y = self.ln(normed)
            mean_abs = y / torch.mean(torch.abs(y), -1, keepdim=True)  # seed 003
        else:
            normed, r = self.add_norm(self.mlp(self.rms(h)), h)
            mean_abs = self.l1(self.ln(normed))
        return self.softmax(mean_abs) + self.log_softmax(r)


def test_compile_modules(device):
    torch.manual_seed(0)
    model = _Block(torch_modules=False).to(device)
    reference = _Block(torch_modules=True).to(device)
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.5, 1.5)
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for batch in (3, 8, 5):
        x = randn((batch, 16), torch.float32, device)
        out = compiled(x)
        expected = reference(x)
        _assert_close(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        for (name, got), want in zip(model.named_parameters(), reference.parameters(), strict=True):
            atol = 1e-5 * want.grad.abs().max().item()
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=atol, msg=name)
        model.zero_grad()
        reference.zero_grad()
    assert not counters["graph_break"], dict(counters["graph_break"])


# ---------------------------------------------------------------------------------------------
# The op set under CUDA graphs


def _linear_then(module: torch.nn.Module, features: int):
    """nn.Linear -> a rownorm module (AddRMSNorm: the Linear's output plus a residual)."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(64, features)
            self.norm = module

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.linear(x)
            if isinstance(self.norm, rownorm.nn.AddRMSNorm):
                out, r = self.norm(h, h * 0.5)
                return out + r
            return self.norm(h)

    return Net()


CUDA_GRAPH_MODULES = {
    "rms_norm": lambda n: rownorm.nn.RMSNorm(n),
    "layer_norm": lambda n: rownorm.nn.LayerNorm(n),
    "mean_abs": lambda n: rownorm.nn.L1Norm(-1, 1e-12, mean=True),
    "softmax": lambda n: rownorm.nn.Softmax(-1),
    "log_softmax": lambda n: rownorm.nn.LogSoftmax(-1),
    "add_rms_norm": lambda n: rownorm.nn.AddRMSNorm(n),
}


@cuda_only
@pytest.mark.parametrize("module", CUDA_GRAPH_MODULES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("features", [257, 4096])
def test_cuda_graphs_reduce_overhead_ops(module, dtype, features):
    torch.manual_seed(0)
    model = _linear_then(CUDA_GRAPH_MODULES[module](features), features)
    model = model.to(device="cuda", dtype=dtype)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for step in range(4):
            torch.compiler.cudagraph_mark_step_begin()
            x = randn((32, 64), dtype, "cuda")
            out = compiled(x).clone()
            assert_matches(out, model(x), what=f"step {step}")
    assert counters["inductor"]["cudagraph_skips"] == 0, "the graph was not captured"
    assert not counters["graph_break"], dict(counters["graph_break"])


@cuda_only
@pytest.mark.parametrize("module", CUDA_GRAPH_MODULES)
def test_cuda_graphs_reduce_overhead_training_ops(module):
    torch.manual_seed(0)
    model = _linear_then(CUDA_GRAPH_MODULES[module](1000), 1000).cuda()
    eager = _linear_then(CUDA_GRAPH_MODULES[module](1000), 1000).cuda()
    eager.load_state_dict(model.state_dict())
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):
        torch.compiler.cudagraph_mark_step_begin()
        x = randn((16, 64), torch.float32, "cuda")
        dy = randn((16, 1000), torch.float32, "cuda")
        out = compiled(x)
        out.backward(dy)
        expected = eager(x)
        expected.backward(dy)
        _assert_close(out.detach().clone(), expected.detach())
        for got, want in zip(model.parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5)
            got.grad = None
            want.grad = None
    assert counters["inductor"]["cudagraph_skips"] == 0, "the graph was not captured"


@cuda_only
@pytest.mark.parametrize("op_id", OP_FAMILIES)
@pytest.mark.parametrize("n", [33, 4096, 65535, 131072])
def test_cuda_graph_capture_and_replay_ops(op_id, n):
    """Capture every op's forward and backward (parameter gradients included) on a side
    stream, and the strided-dim path; replay on new data."""
    op = OPS[op_id]
    dtype = torch.bfloat16
    inp = op.inputs(randn((5, n), dtype, "cuda"), -1)
    inp3, dim3 = (
        (None, None) if op.last_dim_only else (op.inputs(randn((2, 7, 5), dtype, "cuda"), 1), 1)
    )
    case = dataclasses.replace(op, eps=op.resolved_eps(inp["x"]))
    outs0 = case.raw(inp, -1)
    dys = tuple(randn(o.shape, dtype, "cuda") for o in outs0)
    want = frozenset(op.params)

    def run():
        outs = case.raw(inp, -1)
        grads = case.raw_backward(dys, inp, -1, outs, want)
        outs3 = case.raw(inp3, dim3) if inp3 is not None else ()
        return outs, grads, outs3

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        outs, grads, outs3 = run()
    for step in range(3):
        for t in list(inp.values()) + list(dys) + (list(inp3.values()) if inp3 else []):
            t.copy_(randn(t.shape, dtype, "cuda"))
        graph.replay()
        torch.cuda.synchronize()
        for o, ref in zip(outs, case.reference(inp, -1), strict=True):
            assert_matches(o, ref, dim=-1, what=f"replay {step}")
        check_grads(case, inp, -1, dys, grads, what=f"replay {step}")
        if inp3 is not None:
            for o, ref in zip(outs3, case.reference(inp3, dim3), strict=True):
                assert_matches(o, ref, dim=dim3, what=f"replay {step} strided dim")
