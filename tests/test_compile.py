"""Every op under torch.compile (fullgraph, dynamic shapes) and CUDA graphs.

* ``torch.compile(fullgraph=True, dynamic=True)`` traces each op through its fake: one graph,
  no graph breaks, serving several shapes without recompiling; the results equal eager
  execution, forward and backward (every input's gradient).
* CUDA graphs: ``mode="reduce-overhead"`` of ``nn.Linear -> every op's module`` (inductor's
  cudagraph trees), inference and training, and a manual ``torch.cuda.graph`` capture on a
  side stream of the forward, backward (parameter gradients included) and strided-dim
  path, replayed on new data. Both need the kernels to launch on the current (capturing)
  stream with no host sync.

Why the grid is what it is: one id per op family (and device), from the op table. The op
tests compile with ``aot_eager``: the fake, AOT autograd and dynamic shapes are what the ops
contribute, and inductor takes seconds per compile; inductor runs every module in one block
(test_compile_modules) and under CUDA graphs, where it captures the kernels.
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
    OPS,
    TOL,
    assert_matches,
    check_grads,
    cuda_only,
    families,
    randn,
    raw_case,
)

FAMILIES = list(families())


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


# The op tests' backend: the fakes, AOT autograd and dynamic shapes are what the ops bring;
# inductor runs in test_compile_modules and the CUDA-graph tests.
OP_BACKEND = "aot_eager"


# Shapes of one rank (none of size 0 or 1, which dynamic shapes specialize on): the row length
# changes too, so the parameters are dynamic as well.
OP_SHAPES = {
    "last": ([(4, 33), (7, 1000)], -1),
    "middle": ([(2, 5, 3), (3, 33, 4)], 1),
}


@pytest.mark.parametrize("op_id", FAMILIES)
def test_compile_op_forward_backward(device, op_id):
    op = OPS[op_id]
    for where, (shapes, dim) in OP_SHAPES.items():
        if op.last_dim_only and where != "last":
            continue
        names: list[str] = []  # the differentiable inputs, set per shape below

        def fn(*tensors, dim=dim, names=names):
            inp = dict(zip(names, tensors, strict=True))
            inp["x"] = inp["x"] * 2.0 + 0.25  # something for the compiler to fuse around the op
            return tuple(o * 3.0 for o in op.call(inp, dim))

        torch._dynamo.reset()
        counters.clear()
        counter = CompileCounterWithBackend(OP_BACKEND)
        compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
        frames = []
        for shape in shapes:
            inp = op.inputs(randn(shape, torch.float32, device), dim)
            names[:] = op.grad_inputs(inp)
            results = []
            for f in (compiled, fn):
                leaves = [inp[k].detach().requires_grad_(True) for k in names]
                outs = f(*leaves)
                dys = [torch.ones_like(o) * (i + 1) for i, o in enumerate(outs)]
                results.append((outs, torch.autograd.grad(outs, leaves, dys)))
            (c_outs, c_grads), (e_outs, e_grads) = results
            for c, e in zip(c_outs + c_grads, e_outs + e_grads, strict=True):
                assert c.shape == e.shape and c.dtype == e.dtype
                assert_matches(c, e, what=f"{op_id} {where} {shape}")
            frames.append(counter.frame_count)
        assert frames[0] >= 1 and frames == frames[:1] * len(frames), f"{where}: recompiled"
        assert not counters["graph_break"], dict(counters["graph_break"])


def test_compile_output_strides_match_eager(device):
    """The fakes' strides are the kernels': under inductor (which allocates from the fakes and
    checks the strides of what a custom op returns), every op on a permuted input, reduced
    over a non-last dim where it can, returns what eager returns. One compile for all."""
    cases = []
    for op_id in FAMILIES:
        op = OPS[op_id]
        x, dim = DIM_CASES["middle"](9, torch.float32, device)
        x, dim = (x.transpose(1, 2), -1) if op.last_dim_only else (x.transpose(0, 1), 0)
        cases.append((op, op.inputs(x, dim), dim))

    def fn(*flat):
        tensors, outs = iter(flat), []
        for op, inp, dim in cases:
            outs += op.call({k: next(tensors) for k in inp}, dim)
        return tuple(outs)

    flat = [t for _, inp, _ in cases for t in inp.values()]
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    for out, eager in zip(compiled(*flat), fn(*flat), strict=True):
        assert out.shape == eager.shape and out.stride() == eager.stride()
        _assert_close(out, eager)


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
        self.l2 = rownorm.nn.L2Norm(-1)
        self.torch_modules = torch_modules
        self.mlp = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        if self.torch_modules:
            r = self.mlp(self.rms(h)) + h
            normed = self.add_norm(r)
            y = self.ln(normed)
            mean_abs = y / torch.mean(torch.abs(y), -1, keepdim=True)  # seed 003
            unit = F.normalize(r, dim=-1)
        else:
            normed, r = self.add_norm(self.mlp(self.rms(h)), h)
            mean_abs = self.l1(self.ln(normed))
            unit = self.l2(r)
        return self.softmax(mean_abs) + self.log_softmax(r) + unit


def test_compile_modules(device):
    """Every module in one block under inductor (the CPU's one inductor compile), forward and
    parameter gradients equal to the torch modules they replace."""
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
# CUDA graphs


class _EveryModule(torch.nn.Module):
    """nn.Linear, then the module of every op family on its output (a residual op: plus half
    of it), summed: one compile covers every module."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, features)
        x = torch.zeros((2, features))
        self.ops = [OPS[op_id] for op_id in FAMILIES]
        self.norms = torch.nn.ModuleList(op.module(op.inputs(x, -1), -1) for op in self.ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        total = torch.zeros_like(h)
        for op, norm in zip(self.ops, self.norms, strict=True):
            total = total + (sum(norm(h, h * 0.5)) if op.residual else norm(h))
        return total


@cuda_only
@pytest.mark.parametrize(
    ("dtype", "features"),
    [(torch.float32, 257), (torch.bfloat16, 4096)],
    ids=["fp32-257", "bf16-4096"],
)
def test_cuda_graphs_reduce_overhead(dtype, features):
    torch.manual_seed(0)
    model = _EveryModule(features).to(device="cuda", dtype=dtype)
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
def test_cuda_graphs_reduce_overhead_training():
    torch.manual_seed(0)
    model = _EveryModule(1000).cuda()
    eager = _EveryModule(1000).cuda()
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
@pytest.mark.parametrize("op_id", FAMILIES)
def test_cuda_graph_capture_and_replay(op_id):
    """Capture the forward and backward (parameter gradients included) on a side stream, and
    the strided-dim path; replay on new data. Row lengths on the group, CTA, cluster and
    streaming tiers; a length never run before (the tier's first launch is in the capture)."""
    op = OPS[op_id]
    dtype = torch.bfloat16
    for n in (33, 4096, 65535, 131072, 200008 + 8 * FAMILIES.index(op_id)):
        cold = n > 200000
        inp = op.inputs(randn((5, n), dtype, "cuda"), -1)
        inp3, dim3 = (
            (None, None) if op.last_dim_only else (op.inputs(randn((2, 7, 5), dtype, "cuda"), 1), 1)
        )
        case = raw_case(op, inp["x"])
        dys = tuple(randn((5, n), dtype, "cuda") for _ in range(op.n_outputs))
        want = frozenset(op.params)

        def run(case=case, inp=inp, dys=dys, want=want, inp3=inp3, dim3=dim3, cold=cold):
            outs = case.raw(inp, -1)
            if cold:  # the forward alone, its first launch captured
                return outs, {}, ()
            grads = case.raw_backward(dys, inp, -1, outs, want)
            outs3 = case.raw(inp3, dim3) if inp3 is not None else ()
            return outs, grads, outs3

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        if not cold:
            with torch.cuda.stream(side):
                run()  # warm-up outside the capture, as PyTorch recommends
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            outs, grads, outs3 = run()
        for step in range(3):
            for t in list(inp.values()) + list(dys) + (list(inp3.values()) if inp3 else []):
                t.copy_(randn(t.shape, dtype, "cuda"))
            graph.replay()
            torch.cuda.synchronize()
            what = f"N={n} replay {step}"
            for o, ref in zip(outs, case.reference(inp, -1), strict=True):
                assert_matches(o, ref, dim=-1, what=what)
            check_grads(case, inp, -1, dys, grads, what=what)
            if outs3:
                for o, ref in zip(outs3, case.reference(inp3, dim3), strict=True):
                    assert_matches(o, ref, dim=dim3, what=what + " strided dim")
