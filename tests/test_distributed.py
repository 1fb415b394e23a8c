"""The rownorm ops under DTensor, FSDP2 and tensor + sequence parallelism: two processes on gloo.

Every op and its backward op gets DTensor inputs with every placement of a 1-D mesh of two
ranks: replicated, sharded on a dim that is not reduced (rows stay whole on each rank: the op
runs locally and keeps the placement; parameter gradients come back as partial sums), and
sharded on the reduced dim (DTensor gathers the rows first, as for torch's layer_norm and
softmax: the result is replicated). Outputs and gradients must equal the single-process
result. A tiny model with rownorm norms is then trained one step under FSDP2 and under a
tensor-parallel plan with SequenceParallel norms, eager and compiled, against the same model
in one process.

The two processes are spawned once for the whole file (starting them costs seconds); each case
records its outcome, and one test per case reports it.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
import traceback

import pytest
import rownorm
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rownorm.testing import OPS

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="needs torch.distributed with the gloo backend",
)

WORLD = 2
SHAPE = (4, 6, 10)  # every dim divisible by WORLD; 10 columns when the last dim is reduced
DTYPE = torch.float32  # fp32 is enough: the rules do not depend on the dtype (but see below)


def _placement_cases(op) -> list[tuple[int, str]]:
    """(dim, placement) pairs of an op: Replicate, Shard of each non-reduced dim, Shard of the
    reduced dim, Partial; reducing the last dim and (where the op allows) the middle one, given
    as -2."""
    dims = (-1,) if op.last_dim_only else (-1, -2)
    cases = []
    for dim in dims:
        cases += [(dim, "R"), (dim, "P")]
        cases += [(dim, f"S{d}") for d in range(len(SHAPE))]
    return cases


OP_CASES = [
    f"{op_id}/dim={dim}/{pl}" for op_id, op in OPS.items() for dim, pl in _placement_cases(op)
]
MODEL_CASES = [f"{mode}/{how}" for mode in ("fsdp2", "tp_sp") for how in ("eager", "compiled")]


# ---- in the spawned processes ---------------------------------------------------------------


def _placement(text: str):
    from torch.distributed.tensor import Partial, Replicate, Shard

    return {"R": Replicate(), "P": Partial()}.get(text) or Shard(int(text[1:]))


def _check_row_placement(actual, pl, dim: int, what: str) -> None:
    """The placement of a row output: x's; Replicate where x was sharded on the reduced dim
    (DTensor gathers the rows first); where x was Partial, whatever DTensor reduced it to
    (all-reduce or reduce-scatter), provided the rows are whole on each rank."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    reduced = dim % len(SHAPE)
    if isinstance(pl, Partial):
        ok = actual == Replicate() or (isinstance(actual, Shard) and actual.dim != reduced)
        assert ok, f"{what}: {actual}, from a Partial x"
        return
    expected = Replicate() if isinstance(pl, Shard) and pl.dim == reduced else pl
    assert actual == expected, f"{what}: {actual}, expected {expected}"


def _distribute(t, mesh, pl):
    """``t`` with placement ``pl``; Partial: each rank holds t / WORLD (exact for WORLD = 2)."""
    from torch.distributed.tensor import DTensor, Partial, distribute_tensor

    if isinstance(pl, Partial):
        return DTensor.from_local(t / WORLD, mesh, [pl], run_check=False)
    return distribute_tensor(t, mesh, [pl])


def _close(actual, expected, what: str) -> None:
    # 16-bit: a parameter gradient summed across ranks may round once more (one ulp)
    tol = 1e-5 if expected.dtype not in (torch.float16, torch.bfloat16) else 1e-2
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")


def _check_op_case(mesh, case: str) -> None:
    """One op, one dim, one placement: the forward op, the backward op (every parameter
    gradient, and none) and autograd through the public function, against one process."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    op_id, dim_text, pl_text = case.split("/")
    op, dim, pl = OPS[op_id], int(dim_text.removeprefix("dim=")), _placement(pl_text)
    gen = torch.Generator().manual_seed(0)  # the same full tensors on both ranks
    # The float32 residual stream needs a 16-bit x (its own backward op)
    dtype = torch.bfloat16 if getattr(op, "float32_residual", False) else DTYPE
    inp = op.make_inputs(SHAPE, dim, dtype, "cpu", gen)

    def spread(name, t):
        return _distribute(t, mesh, Replicate() if name in op.params else pl)

    dinp = {k: spread(k, v) for k, v in inp.items()}

    # The forward op.
    outs, douts = op.raw(inp, dim), op.raw(dinp, dim)
    dys = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
    ddys = [_distribute(dy, mesh, pl) for dy in dys]
    for i, (o, do) in enumerate(zip(outs, douts, strict=True)):
        assert isinstance(do, DTensor), f"output {i} is a {type(do).__name__}"
        assert do.placements == douts[0].placements, f"output {i}: {do.placements}"
        _check_row_placement(do.placements[0], pl, dim, f"output {i}")
        _close(do.full_tensor(), o, f"output {i}")

    # The backward op, asking for every parameter gradient and then for none.
    for want in (frozenset(op.params), frozenset()):
        grads = op.raw_backward(dys, inp, dim, outs, want, every=True)
        dgrads = op.raw_backward(ddys, dinp, dim, douts, want, every=True)
        row_pl = dgrads["x"].placements[0]
        _check_row_placement(row_pl, pl, dim, f"{sorted(want)}: dx")
        for name, g in grads.items():
            dg = dgrads[name]
            if name in op.row_inputs:
                expected_pl = row_pl
            elif name in want:  # a sum over rows: partial where the rows are sharded
                expected_pl = Replicate() if row_pl == Replicate() else Partial("sum")
            else:
                expected_pl = Replicate()  # the (0,) placeholder of a gradient not requested
            assert dg.placements == (expected_pl,), (
                f"{sorted(want)}: d{name} {dg.placements}, expected {expected_pl}"
            )
            _close(dg.full_tensor(), g, f"backward op {sorted(want)}: d{name}")

    # Autograd through the public function (the registered formula calls the backward op).
    leaves = {k: v.clone().requires_grad_() for k, v in inp.items()}
    dleaves = {k: spread(k, v).requires_grad_() for k, v in inp.items()}
    names = list(leaves)
    ref = torch.autograd.grad(op.call(leaves, dim), [leaves[k] for k in names], dys)
    douts = op.call(dleaves, dim)
    ddys = [_distribute(dy, mesh, do.placements[0]) for dy, do in zip(dys, douts, strict=True)]
    got = torch.autograd.grad(douts, [dleaves[k] for k in names], ddys)
    for name, g, dg in zip(names, ref, got, strict=True):
        _close(dg.full_tensor(), g, f"autograd d{name}")


class _Block(torch.nn.Module):
    """A pre-norm MLP block: h + down(silu(up(rms_norm(h))))."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = rownorm.nn.RMSNorm(d)
        self.up = torch.nn.Linear(d, 4 * d, bias=False)
        self.down = torch.nn.Linear(4 * d, d, bias=False)

    def forward(self, h):
        return h + self.down(torch.nn.functional.silu(self.up(self.norm(h))))


class _Tiny(torch.nn.Module):
    """Two blocks (RMSNorm), an AddRMSNorm of their outputs, a LayerNorm, a linear head."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(d), _Block(d)])
        self.add_norm = rownorm.nn.AddRMSNorm(d)
        self.norm = rownorm.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        h1 = self.blocks[0](x)
        y, r = self.add_norm(self.blocks[1](h1), h1)
        return self.head(self.norm(y + r))


def _tiny_reference(x, target):
    torch.manual_seed(0)
    model = _Tiny()
    # Parameters that are not all ones / zeros, so a wrong parameter gradient shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn(p.shape))
    loss = torch.nn.functional.mse_loss(model(x), target)
    loss.backward()
    return model, loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _check_model_case(mesh, case: str) -> None:
    """One training step of the tiny model, distributed, against the same step in one process."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mode, how = case.split("/")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 8, 16, generator=gen)  # (batch, sequence, hidden)
    target = torch.randn(4, 8, 16, generator=gen)
    ref_model, ref_loss, ref_grads = _tiny_reference(x, target)
    model = _Tiny()
    model.load_state_dict(ref_model.state_dict())
    rank = dist.get_rank()

    # aot_eager traces what inductor would (dynamo, DTensor desugaring, AOT autograd) without
    # compiling C++ for the CPU, which would cost CI minutes and tests nothing of the rules.
    compile_ = lambda m: torch.compile(m, fullgraph=True, backend="aot_eager")  # noqa: E731
    if mode == "fsdp2":
        for i, block in enumerate(model.blocks):
            # FSDP2's hooks run eagerly: compile each block inside them (as torchtitan does).
            if how == "compiled":
                model.blocks[i] = block = compile_(block)
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        # Data parallel: each rank its half of the batch; FSDP2 averages the gradients.
        x, target = x.chunk(WORLD)[rank], target.chunk(WORLD)[rank]
    else:
        plan = {"blocks.0": PrepareModuleInput(input_layouts=(Replicate(),),
                                               desired_input_layouts=(Shard(1),),
                                               use_local_output=False)}  # fmt: skip
        for i in range(len(model.blocks)):
            plan |= {
                f"blocks.{i}.norm": SequenceParallel(),
                f"blocks.{i}.up": ColwiseParallel(input_layouts=Shard(1)),
                f"blocks.{i}.down": RowwiseParallel(output_layouts=Shard(1),
                                                    use_local_output=False),
            }  # fmt: skip
        plan |= {
            # torch's SequenceParallel takes one input; rownorm's takes (x, residual).
            "add_norm": rownorm.distributed.SequenceParallel(),
            "norm": SequenceParallel(),
            "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        }
        parallelize_module(model, mesh, plan)
    run = compile_(model) if how == "compiled" and mode == "tp_sp" else model
    loss = torch.nn.functional.mse_loss(run(x), target)
    loss.backward()

    if mode == "fsdp2":  # the mean over the whole batch
        loss = loss.detach().clone()
        dist.all_reduce(loss)
        loss /= WORLD
    _close(loss.detach(), ref_loss, "loss")
    for name, p in model.named_parameters():
        name = name.replace("_orig_mod.", "")
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        _close(grad, ref_grads[name], f"grad of {name}")


def _worker(rank: int, init_file: str, out_file: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (WORLD,))
    results = {}
    checks = [(c, _check_op_case) for c in OP_CASES] + [(c, _check_model_case) for c in MODEL_CASES]
    for case, check in checks:
        try:
            check(mesh, case)
            results[case] = None
        except Exception:  # recorded, reported by the test of that case
            results[case] = f"rank {rank}: {traceback.format_exc()}"
    outcomes = [None] * WORLD
    dist.all_gather_object(outcomes, results)
    if rank == 0:
        merged = {c: [r[c] for r in outcomes if r[c]] for c in results}
        with open(out_file, "w") as f:
            json.dump(merged, f)
    dist.destroy_process_group()
    # Everything is written: skip the interpreter's teardown of torch (seconds per process).
    sys.stdout.flush()
    os._exit(0)


# ---- the tests ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def outcomes() -> dict[str, list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "outcomes.json")
        mp.spawn(_worker, args=(os.path.join(tmp, "init"), out_file), nprocs=WORLD, join=True)
        with open(out_file) as f:
            return json.load(f)


@pytest.mark.parametrize("case", OP_CASES)
def test_op_placements(outcomes, case):
    errors = outcomes[case]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("case", MODEL_CASES)
def test_tiny_model(outcomes, case):
    errors = outcomes[case]
    assert not errors, "\n".join(errors)


def test_every_op_has_a_rule():
    """Every op of the library, forward and backward, gets a rule; the table covers each."""
    import rownorm.distributed as rd
    from torch.distributed.tensor import DTensor

    ops = rd.rownorm_ops()
    names = {op._schema.name.removeprefix("rownorm::") for op in ops}
    table = {op.name for op in OPS.values()}
    # and layer_norm_with_stats, the forward that autograd runs for layer_norm; the float32
    # residual stream's backward (the add_rms_norm_fp32_residual case runs it)
    more = {"layer_norm_with_stats", "add_rms_norm_stream_backward"}
    assert names == table | {f"{n}_backward" for n in table} | more
    funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    assert all(op in funcs for op in ops)
