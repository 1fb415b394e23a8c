"""Trains a small Llama-style model with rownorm norms on two devices, FSDP2 and TP + SP.

    torchrun --nproc-per-node 2 benchmarks/distributed_check.py --out DIR
    torchrun --nproc-per-node 2 benchmarks/distributed_check.py --device cpu --out DIR  # gloo

For each norm (``rownorm.nn.RMSNorm``; ``torch.nn.RMSNorm``, the unpatched model, for step
times) and each way of running it (eager; compiled), the same model, from the same weights on
the same tokens, is trained a few steps

* on one device (every rank runs it alone, on the whole batch): the reference;
* with FSDP2 (``fully_shard`` on every layer and the root; each rank half of the batch);
* with tensor parallelism and sequence-parallel norms (the torchtitan plan: ``SequenceParallel``
  on every norm, colwise / rowwise linears; every rank the whole batch).

The losses of every step and the gradients of the first must match the reference within the
dtype's tolerance. ``DIR/summary.md`` (and ``summary.json``) gets the checks and the mean step
times (after warm-up steps), rewritten after every run. The exit status is 1 if a check of a
rownorm run failed or a rownorm run raised (the unpatched model's runs are reported only).
NCCL settings come from the environment (NVLink multicast stays as ``NCCL_NVLS_ENABLE`` says).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time
import traceback

import rownorm
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# ---- the model --------------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        # -1 heads: all of them on one device, this rank's under tensor parallelism.
        q, k, v = (
            w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (the half-split form)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Layer(nn.Module):
    def __init__(self, dim: int, n_heads: int, hidden: int, norm) -> None:
        super().__init__()
        self.attention_norm = norm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = norm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, cfg: argparse.Namespace, norm) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(
            Layer(cfg.dim, cfg.heads, cfg.hidden, norm) for _ in range(cfg.layers)
        )
        self.norm = norm(cfg.dim)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        head_dim = cfg.dim // cfg.heads
        freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(cfg.seq).float(), freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.cos, self.sin)
        return self.output(self.norm(h))


NORMS = {"rownorm": rownorm.nn.RMSNorm, "torch": nn.RMSNorm}


def build(cfg, norm: str, device, dtype) -> Llama:
    """The model with the same weights for every norm (their state_dicts are the same)."""
    torch.manual_seed(0)
    model = Llama(cfg, NORMS[norm])
    with torch.no_grad():  # norm weights other than ones, so their gradients are tested
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn(p.shape))
            elif p.dim() == 2:
                p.normal_(0, 0.02)
    return model.to(device=device, dtype=dtype)


# ---- parallelism ------------------------------------------------------------------------------


def apply_fsdp2(model: Llama, mesh, compile_fn) -> Llama:
    from torch.distributed.fsdp import fully_shard

    for i, layer in enumerate(model.layers):
        # Compile inside FSDP2's (eager) hooks, layer by layer, as torchtitan does.
        if compile_fn is not None:
            layer = compile_fn(layer)
            model.layers.register_module(str(i), layer)
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def apply_tp_sp(model: Llama, mesh, compile_fn):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    parallelize_module(
        model,
        mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        },
    )
    gather = PrepareModuleInput(
        input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
    )
    for layer in model.layers:
        parallelize_module(
            layer,
            mesh,
            {
                "attention_norm": SequenceParallel(),
                "attention": gather,
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
                "feed_forward.w3": ColwiseParallel(),
            },
        )
    return model if compile_fn is None else compile_fn(model)


# ---- one run ----------------------------------------------------------------------------------


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def full_grad(p: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    g = p.grad
    return g.full_tensor() if isinstance(g, DTensor) else g


def train(cfg, norm: str, mode: str, compiled: bool, mesh, device, dtype, batch):
    """Trains ``cfg.steps`` steps; returns (losses, first-step gradients by name, step times)."""
    tokens, targets = batch
    model = build(cfg, norm, device, dtype)
    compile_fn = None
    if compiled:
        torch._dynamo.reset()  # every compiled run compiles its own model from scratch
        compile_fn = lambda m: torch.compile(m, fullgraph=True, backend=cfg.backend)  # noqa: E731
    if mode == "fsdp2":
        model = apply_fsdp2(model, mesh, compile_fn)
        rank, world = dist.get_rank(), dist.get_world_size()
        tokens, targets = tokens.chunk(world)[rank], targets.chunk(world)[rank]
    elif mode == "tp_sp":
        model = apply_tp_sp(model, mesh, compile_fn)
    elif compile_fn is not None:
        model = compile_fn(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, foreach=False)
    losses, grads, times = [], None, []
    for step in range(cfg.steps):
        sync(device)
        start = time.perf_counter()
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        if step == 0:
            grads = {n.replace("_orig_mod.", ""): full_grad(p) for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - start)
        loss = loss.detach()
        if mode == "fsdp2":  # each rank's loss is the mean over its half of the batch
            loss = loss.clone()
            dist.all_reduce(loss)
            loss /= dist.get_world_size()
        losses.append(loss.item())
    return losses, grads, times


def compare(ref, got, tol: float) -> dict:
    """The largest relative differences of losses and first-step gradients."""
    ref_losses, ref_grads, _ = ref
    losses, grads, _ = got
    loss_err = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses, ref_losses, strict=True))
    grad_err, worst = 0.0, ""
    for name, g in ref_grads.items():
        d = grads[name].float() - g.float()
        err = (d.norm() / g.float().norm().clamp_min(1e-12)).item()
        if not math.isfinite(err) or err > grad_err:
            grad_err, worst = err, name
    ok = loss_err <= tol and grad_err <= tol
    return {"loss_err": loss_err, "grad_err": grad_err, "worst_grad": worst, "ok": ok}


# ---- main -------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="directory for summary.md and summary.json")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                   help="default: bf16 on cuda, fp32 on cpu")  # fmt: skip
    p.add_argument("--steps", type=int, default=None, help="default: 12 on cuda, 3 on cpu")
    p.add_argument("--warmup", type=int, default=None, help="steps not timed (default 2 / 1)")
    p.add_argument("--no-compile", action="store_true", help="eager runs only")
    p.add_argument("--backend", default=None, help="torch.compile backend (default: inductor "
                   "on cuda, aot_eager on cpu, which needs no C++ compiler)")  # fmt: skip
    p.add_argument("--norms", default="rownorm,torch", help="comma list of rownorm,torch")
    p.add_argument("--modes", default="single,fsdp2,tp_sp",
                   help="comma list of single,fsdp2,tp_sp (single eager always runs: the "
                   "reference)")  # fmt: skip
    p.add_argument("--dim", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--batch", type=int, default=None, help="global batch (split by FSDP2)")
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--lr", type=float, default=1e-3)
    a = p.parse_args(argv)
    a.modes, a.norms = a.modes.split(","), a.norms.split(",")
    if not set(a.modes) <= {"single", "fsdp2", "tp_sp"}:
        p.error(f"--modes: single, fsdp2 or tp_sp, got {a.modes}")
    if not set(a.norms) <= set(NORMS):
        p.error(f"--norms: {', '.join(NORMS)}, got {a.norms}")
    gpu = a.device == "cuda"
    defaults = {
        "dtype": "bf16" if gpu else "fp32",
        "steps": 12 if gpu else 3,
        "warmup": 2 if gpu else 1,
        "backend": "inductor" if gpu else "aot_eager",
        "dim": 2048 if gpu else 64,
        "layers": 4 if gpu else 2,
        "heads": 16 if gpu else 4,
        "seq": 2048 if gpu else 32,
        "batch": 8 if gpu else 4,
        "vocab": 32768 if gpu else 128,
    }
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.hidden = 256 * math.ceil(8 * a.dim / 3 / 256)  # Llama's SwiGLU width
    if a.warmup >= a.steps:
        p.error("--warmup must be less than --steps")
    return a


def main(argv=None) -> int:
    cfg = parse_args(argv)
    from torch.distributed.device_mesh import init_device_mesh

    if cfg.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    # bf16: the distributed runs reduce in other orders (and FSDP2 in bf16); a few ulps of
    # bf16 (2^-8) over the model. fp32: the same sums, reordered.
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=gen).to(device)
    batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())

    rows, failed = [], False
    # The single-device eager run first: the reference of the others.
    runs = [("single", False)] + [
        (mode, compiled)
        for compiled in ((False,) if cfg.no_compile else (False, True))
        for mode in cfg.modes
        if (mode, compiled) != ("single", False)
    ]
    for norm in cfg.norms:
        ref = None
        for mode, compiled in runs:
            name = f"{mode}/{norm}/{'compiled' if compiled else 'eager'}"
            row = {"mode": mode, "norm": norm, "compiled": compiled}
            try:
                if ref is None and (mode, compiled) != runs[0]:
                    raise RuntimeError("no reference: the single-device eager run failed")
                result = train(cfg, norm, mode, compiled, mesh, device, dtype, batch)
                times = result[2][cfg.warmup :]
                row["step_ms"] = 1e3 * sum(times) / len(times)
                row["losses"] = result[0]
                ref = result if ref is None else ref
                row |= compare(ref, result, tol)
            except Exception as e:  # recorded in the summary; the exit status says it
                row |= {"ok": False, "error": f"{type(e).__name__}: {e}"}
                if rank == 0:
                    traceback.print_exc()
            # The unpatched model is there for its step times (and as a control of the
            # tolerance); only rownorm's runs decide the exit status.
            failed |= norm == "rownorm" and not row["ok"]
            rows.append(row)
            if rank == 0:  # rewritten after every run: a run cut short leaves what it did
                print(f"{name}: {json.dumps({k: v for k, v in row.items() if k != 'losses'})}",
                      flush=True)  # fmt: skip
                write_summary(cfg, rows, tol, device, world)
    dist.destroy_process_group()
    return 1 if failed else 0


def write_summary(cfg, rows, tol, device, world) -> None:
    os.makedirs(cfg.out, exist_ok=True)
    if device.type == "cuda":
        hw = f"{world} × {torch.cuda.get_device_name(device)}"
    else:
        hw = f"{world} CPU processes ({platform.processor() or platform.machine()})"
    lines = [
        "# rownorm distributed check: FSDP2 and TP + sequence parallel",
        "",
        f"- Made {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on {hw}; torch "
        f"{torch.__version__}, rownorm {rownorm.__version__}, backend "
        f"{dist.get_backend()}, NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE', '(unset)')}.",
        f"- Command: `torchrun --nproc-per-node {world} benchmarks/distributed_check.py "
        f"{' '.join(sys.argv[1:])}`",
        f"- Model: Llama-style, dim {cfg.dim}, {cfg.layers} layers, {cfg.heads} heads, SwiGLU "
        f"{cfg.hidden}, vocab {cfg.vocab}; {cfg.dtype} weights and activations; global batch "
        f"{cfg.batch} × {cfg.seq} tokens; AdamW lr {cfg.lr}; {cfg.steps} steps, the first "
        f"{cfg.warmup} not timed; compiled: torch.compile(fullgraph=True, backend={cfg.backend}) "
        "(FSDP2: each layer; TP: the whole model).",
        "- single: one device, the whole batch (the reference of its norm, eager). fsdp2: "
        "fully_shard on each layer and the root, each rank half the batch. tp_sp: "
        "colwise / rowwise linears, SequenceParallel norms (the torchtitan plan).",
        f"- loss err: max over steps of |loss − reference| / |reference|; grad err: max over "
        f"parameters of ‖g − g_ref‖ / ‖g_ref‖ after the first step. Tolerance {tol:g}.",
        "",
        "| mode | norm | compiled | step ms | loss err | grad err (worst) | result |",
        "|---|---|---|---:|---:|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['mode']} | {r['norm']} | {r['compiled']} | | | | "
                     f"ERROR: {r['error'][:300].replace('|', '/')} |")  # fmt: skip
            continue
        lines.append(
            f"| {r['mode']} | {r['norm']} | {r['compiled']} | {r['step_ms']:.2f} | "
            f"{r['loss_err']:.2e} | {r['grad_err']:.2e} ({r['worst_grad']}) | "
            f"{'ok' if r['ok'] else 'FAIL'} |"
        )
    lines += ["", f"Losses: {json.dumps({_key(r): r.get('losses') for r in rows})}", ""]
    with open(os.path.join(cfg.out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(cfg.out, "summary.json"), "w") as f:
        json.dump({"config": vars(cfg), "tolerance": tol, "runs": rows}, f, indent=1)


def _key(r) -> str:
    return f"{r['mode']}/{r['norm']}/{'compiled' if r['compiled'] else 'eager'}"


if __name__ == "__main__":
    sys.exit(main())
