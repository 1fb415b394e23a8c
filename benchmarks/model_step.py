"""Training step and decode-sized forward of small Hugging Face decoders: stock, rownorm-patched
and Liger-patched, eager and compiled, side by side in one process.

    python benchmarks/model_step.py [--families llama,qwen3,gemma] [--compile llama]
                                    [--variants stock,rownorm,...] [--no-eager] [--profile]
                                    [--layers 4] [--batch 8] [--seq 1024] [--out PATH.md]

Models are built from their config classes with random weights (nothing is downloaded), in
bf16, hidden 2048 (TinyLlama's shape: 32 heads of 64, 4 KV heads, MLP 5632), vocab 32000 for
every family so that the norms' share of the step is comparable across families. A training
step is forward with labels (the model's cross-entropy loss), backward and a fused AdamW step;
the decode-sized forward is one token for each of `batch` sequences, no cache. Times are
rownorm.bench's Timer: the median of at least --steps reps between CUDA events after warm-up
(the first call compiles), the L2 flushed before each; tokens/s counts the batch's tokens;
peak memory is torch.cuda.max_memory_allocated over the training steps.

Variants: `stock` (the model as transformers builds it), `rownorm` (rownorm.patch_model: every
norm module swapped, parameters kept; under torch.compile the norms' own forward, which
Inductor fuses), `rownorm-fused` (patch_model(fuse_residual=True): also each layer's residual add
and post_attention_layernorm as one add_rms_norm), `rownorm-op` (rownorm-fused with
under_compile="rownorm": rownorm's ops in the compiled graph too; eager, the same as
rownorm-fused), `liger-norm`
(Liger-Kernel's apply_liger_kernel_to_* with rms_norm=True and every other Liger kernel off: the
same scope as rownorm's patch), where the liger_kernel package imports and supports the family,
and `zero-norm`: every RMS norm module returns its input. Not a model anyone trains: it is the
ceiling of what any norm kernel can give the step, the norms at zero cost (its speedup bounds
every other variant's from above).

`--profile` also runs one profiled training step of each case and writes, per case, the CUDA
kernels that took the most time in it (torch.profiler), to PATH.md's `.profile.txt` beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
from dataclasses import dataclass

import rownorm
import torch
from rownorm.bench.timer import Timer

HIDDEN = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=64,
    vocab_size=32000,
    max_position_embeddings=4096,
)


def make_config(family: str, layers: int):
    import transformers as tf

    common = dict(HIDDEN, num_hidden_layers=layers)
    if family == "llama":
        return tf.LlamaConfig(**common)
    if family == "qwen3":
        return tf.Qwen3Config(**common)
    if family == "gemma":
        return tf.GemmaConfig(**common)
    if family == "gemma3":
        return tf.Gemma3TextConfig(**common, sliding_window=1024)
    raise ValueError(f"model_step: unknown family {family!r}")


def build(family: str, layers: int):
    import transformers as tf

    torch.manual_seed(0)
    config = make_config(family, layers)
    config._attn_implementation = "sdpa"
    model = tf.AutoModelForCausalLM.from_config(config)
    return model.to(device="cuda", dtype=torch.bfloat16).train()


def apply_variant(model, family: str, variant: str) -> str:
    if variant == "stock":
        return ""
    if variant in ("rownorm", "rownorm-fused", "rownorm-op"):
        summary = rownorm.patch_model(
            model,
            fuse_residual=variant != "rownorm",
            under_compile="rownorm" if variant == "rownorm-op" else "inductor",
        )
        return f"{len(summary.patched)} norms patched, {len(summary.fused)} layers fused"
    if variant == "zero-norm":
        norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
        for m in norms:
            m.forward = _identity
        return f"{len(norms)} norms return their input"
    if variant == "liger-norm":
        from liger_kernel.transformers import monkey_patch as lp

        fn = getattr(lp, f"apply_liger_kernel_to_{'gemma3_text' if family == 'gemma3' else family}")
        kwargs = dict(rope=False, cross_entropy=False, fused_linear_cross_entropy=False)
        kwargs["geglu" if family.startswith("gemma") else "swiglu"] = False
        fn(rms_norm=True, model=model, **kwargs)
        return "liger rms_norm only"
    raise ValueError(variant)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass
class Result:
    family: str
    mode: str
    variant: str
    train_ms: float
    decode_ms: float
    tokens_per_s: float
    peak_gib: float
    note: str
    profile: str = ""


@contextlib.contextmanager
def modeling_restored():
    """Puts back, on exit, every attribute of transformers' loaded `modeling_*` modules:
    Liger's apply_liger_kernel_to_* replaces classes there (modeling_llama.LlamaRMSNorm =
    LigerRMSNorm), which would make every later case's "stock" model Liger's."""
    modules = [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("transformers.models.")
        and name.rpartition(".")[2].startswith("modeling_")
    ]
    saved = [(m, dict(vars(m))) for m in modules]
    try:
        yield
    finally:
        for m, attrs in saved:
            for name in set(vars(m)) - set(attrs):
                delattr(m, name)
            for name, value in attrs.items():
                if vars(m).get(name) is not value:
                    setattr(m, name, value)


def run_case(family, variant, compiled, args) -> Result:
    model = build(family, args.layers)  # loads the family's modeling module: restored below
    with modeling_restored():
        return _run_case(model, family, variant, compiled, args)


def _run_case(model, family, variant, compiled, args) -> Result:
    note = apply_variant(model, family, variant)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(
        0, HIDDEN["vocab_size"], (args.batch, args.seq), device="cuda", generator=gen
    )
    one = ids[:, :1].contiguous()
    fwd = torch.compile(model) if compiled else model

    def train() -> None:
        loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def decode() -> None:
        with torch.no_grad():
            fwd(input_ids=one, use_cache=False)

    timer = Timer(torch.device("cuda"))
    torch.cuda.reset_peak_memory_stats()
    train_ms, _ = timer(train, min_reps=args.steps)
    peak = torch.cuda.max_memory_allocated() / 2**30
    decode_ms, _ = timer(decode, min_reps=args.steps)
    tokens = args.batch * args.seq
    profile = kernel_profile(train, args.profile_top) if args.profile else ""
    return Result(
        family,
        "compiled" if compiled else "eager",
        variant,
        train_ms,
        decode_ms,
        tokens / train_ms * 1e3,
        peak,
        note,
        profile,
    )


def kernel_profile(step, top: int) -> str:
    """The `top` CUDA kernels by total time over two profiled training steps (warm), and the
    sum of all, as a text table."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    kernels.sort(key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in kernels) / 2
    lines = [f"all kernels: {total / 1e3:.2f} ms per step, {len(kernels)} distinct"]
    for e in kernels[:top]:
        per_step = e.device_time_total / 2
        share = 100 * per_step / total
        lines.append(f"{per_step / 1e3:8.3f} ms {share:5.1f}%  x{e.count // 2:<4} {e.key[:110]}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="llama,qwen3,gemma")
    parser.add_argument("--compile", default="llama", help="families also run compiled")
    parser.add_argument("--variants", default="stock,rownorm,rownorm-fused,liger-norm,zero-norm")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10, help="timed steps at the least")
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--no-eager", dest="eager", action="store_false", help="only the compiled cases"
    )
    parser.add_argument("--profile", action="store_true", help="kernel profile of each case")
    parser.add_argument("--profile-top", type=int, default=25)
    args = parser.parse_args()

    compiled_families = {f for f in args.compile.split(",") if f}
    results: list[Result] = []
    for family in args.families.split(","):
        modes = [False] if args.eager else []
        for compiled in modes + [True] if family in compiled_families else modes:
            for variant in args.variants.split(","):
                try:
                    r = run_case(family, variant, compiled, args)
                except Exception as exc:  # noqa: BLE001  (printed; the table leaves it out)
                    print(f"{family} {variant} compiled={compiled}: {type(exc).__name__}: {exc}")
                    continue
                finally:  # the model and its optimizer state go before the next case
                    gc.collect()
                    torch.cuda.empty_cache()
                    torch._dynamo.reset()
                results.append(r)
                print(
                    f"{r.family} {r.mode} {r.variant}: train {r.train_ms:.2f} ms "
                    f"decode {r.decode_ms:.3f} ms peak {r.peak_gib:.2f} GiB {r.note}",
                    flush=True,
                )

    lines = [
        f"# Model step, {torch.cuda.get_device_name()}, torch {torch.__version__}",
        "",
        f"{args.layers} layers, batch {args.batch}×{args.seq}, bf16; median of at least "
        f"{args.steps} steps. Speedup: the stock model's time in the same mode over the variant's.",
        "",
        "| family | mode | variant | train step ms | speedup | tokens/s | decode fwd ms | "
        "speedup | peak GiB |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        key = (r.family, r.mode, "stock")
        base = next((b for b in results if (b.family, b.mode, b.variant) == key), None)
        train_x = f"{base.train_ms / r.train_ms:.3f}" if base else "—"
        decode_x = f"{base.decode_ms / r.decode_ms:.3f}" if base else "—"
        lines.append(
            f"| {r.family} | {r.mode} | {r.variant} | {r.train_ms:.2f} | {train_x} | "
            f"{r.tokens_per_s:,.0f} | {r.decode_ms:.3f} | {decode_x} | {r.peak_gib:.2f} |"
        )
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    if args.profile:
        text = "\n\n".join(f"## {r.family} {r.mode} {r.variant}\n{r.profile}" for r in results)
        print(text)
        if args.out:
            with open(args.out.removesuffix(".md") + ".profile.txt", "w") as f:
                f.write(text + "\n")


if __name__ == "__main__":
    main()
