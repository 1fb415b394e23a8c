"""rownorm.patch_model / patch_modeling on Hugging Face transformers models.

Each supported family is built from its config class at a tiny size (hidden 64, two layers,
vocabulary 128; nothing downloaded), and the patched model is compared with an unpatched copy:
logits and every parameter gradient at the dtype's tolerance, the state_dict's keys and the
parameters themselves unchanged, the summary naming every norm with the form it computes. A
few dozen optimizer steps of Llama, Qwen3 and Gemma3 follow the unpatched loss curve.

Why the grid is what it is: one model per family (its norm class and numerics are what
differ), float32 on every device and bfloat16 too (where the casting modes differ); the
recognition tests use hand-written modules for the forms that must NOT be patched.
"""

from __future__ import annotations

import copy

import pytest
import rownorm
import torch
from rownorm.integrations.transformers import FAMILIES, NormForm, RownormNorm, recognize

transformers = pytest.importorskip("transformers")

LLAMA = NormForm("rms_norm", "variance_epsilon", 0.0, "llama")
GEMMA = NormForm("rms_norm", "eps", 1.0, "once")
LAYER_NORM = NormForm("layer_norm", "eps")

_DECODER = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
    bos_token_id=1, eos_token_id=2,
)  # fmt: skip

# family: (config class, model class, config arguments, {norm class: form})
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _DECODER, {"LlamaRMSNorm": LLAMA}),
    "mistral": ("MistralConfig", "MistralForCausalLM", _DECODER, {"MistralRMSNorm": LLAMA}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _DECODER, {"Qwen2RMSNorm": LLAMA}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _DECODER | {"head_dim": 16},
              {"Qwen3RMSNorm": LLAMA}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", _DECODER, {"Phi3RMSNorm": LLAMA}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", _DECODER | {"head_dim": 16},
              {"GemmaRMSNorm": GEMMA}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", _DECODER | {"head_dim": 16},
               {"Gemma2RMSNorm": GEMMA}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", _DECODER | {"head_dim": 16},
               {"Gemma3RMSNorm": GEMMA}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                  bos_token_id=1, eos_token_id=2),
             {"LayerNorm": LAYER_NORM}),
    "bert": ("BertConfig", "BertForMaskedLM",
             dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, max_position_embeddings=64),
             {"LayerNorm": LAYER_NORM}),
}  # fmt: skip

# How close the patched model stays to the unpatched one, (logits, gradients), each as
# ‖patched − unpatched‖ / ‖unpatched‖. float32: rownorm's norms differ from the models' by
# float32 rounding (measured: 1e-7 to 1e-6). bfloat16: the logits are mostly bit-identical
# (measured: 0, Qwen3 6e-4); the gradients differ by ~1e-2 (measured: up to 1.1e-2), because
# the models' backward runs bf16 ops (dy·w rounded to bf16, ...) where rownorm's computes the
# norm's backward in float32 and rounds once.
RELERR = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (5e-3, 3e-2)}


def make_model(family: str, device, dtype=torch.float32) -> torch.nn.Module:
    config_cls, model_cls, kwargs, _ = MODELS[family]
    config = getattr(transformers, config_cls)(**kwargs)
    if hasattr(config, "_attn_implementation"):
        config._attn_implementation = "eager"  # the same attention on every device
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config)
    with torch.no_grad():  # Gemma's weights start at 0 and Llama's at 1: make them matter
        for name, p in model.named_parameters():
            if "norm" in name.lower():
                p.add_(0.1 * torch.randn_like(p))
    return model.to(device=device, dtype=dtype).eval()


def relerr(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-30) -> float:
    """‖a − b‖ / max(‖b‖, floor)."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(floor)).item()


def loss_and_grads(model, ids) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logits = model(ids).logits
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
    loss.backward()
    return logits.detach(), loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _ids(device) -> torch.Tensor:
    return torch.randint(3, 128, (2, 24), generator=torch.Generator().manual_seed(1)).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", list(MODELS))
def test_patched_model_matches(device, family, dtype):
    """Logits and every parameter gradient as the unpatched model's; the same Parameter
    objects and state_dict keys; the summary names every norm with its form."""
    reference = make_model(family, device, dtype)
    model = copy.deepcopy(reference)
    params = dict(model.named_parameters())
    keys = list(model.state_dict())
    expected = {
        (name, type(m).__name__)
        for name, m in reference.named_modules()
        if type(m).__name__ in MODELS[family][3]
    }

    summary = rownorm.patch_model(model)

    assert {(p.name, p.original) for p in summary.patched} == expected
    assert all(p.form == MODELS[family][3][p.original] for p in summary.patched)
    assert summary.left_alone == [] and summary.already_patched == []
    assert list(model.state_dict()) == keys
    assert all(p is params[n] for n, p in model.named_parameters())
    assert all(isinstance(model.get_submodule(name), RownormNorm) for name, _ in expected)

    ids = _ids(device)
    logits, _, grads = loss_and_grads(model, ids)
    ref_logits, _, ref_grads = loss_and_grads(reference, ids)
    assert logits.dtype == ref_logits.dtype
    logits_tol, grad_tol = RELERR[dtype]
    assert relerr(logits, ref_logits) <= logits_tol, relerr(logits, ref_logits)
    # A gradient that is zero in exact arithmetic (BERT's key bias: softmax ignores a shift
    # per query) is rounding noise: errors are measured against 1e-3 of the whole gradient.
    floor = 1e-3 * torch.stack([g.double().norm() for g in ref_grads.values() if g is not None])
    floor = floor.norm().item()
    for name, g in ref_grads.items():
        if g is None:
            assert grads[name] is None, name
            continue
        err = relerr(grads[name], g, floor)
        assert err <= grad_tol, (name, err)

    again = rownorm.patch_model(model)
    assert again.patched == [] and sorted(again.already_patched) == sorted(n for n, _ in expected)


@pytest.mark.parametrize(
    "family, fuse_residual",
    [("llama", False), ("qwen3", False), ("gemma3", False), ("phi3", True)],
)
def test_training_follows_unpatched(device, family, fuse_residual):
    """30 AdamW steps on one batch: the patched loss curve is the unpatched one (fused: in
    training mode, where Phi-3's residual dropouts run, at p = 0)."""
    curves = []
    for patch in (False, True):
        model = make_model(family, device).train()
        if patch:
            summary = rownorm.patch_model(model, fuse_residual=fuse_residual)
            assert len(summary.fused) == (2 if fuse_residual else 0)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        ids = _ids(device)
        losses = []
        for _ in range(30):
            _, loss, _ = loss_and_grads(model, ids)
            opt.step()
            losses.append(loss.item())
        curves.append(torch.tensor(losses))
    unpatched, patched = curves
    assert unpatched[-1] < 0.5 * unpatched[0], "the tiny model must learn the batch"
    assert torch.allclose(patched, unpatched, rtol=1e-4), (patched, unpatched)


def test_patch_modeling_before_from_pretrained(tmp_path):
    """patch_modeling swaps the modeling module's class, so from_pretrained makes rownorm's
    norms and loads the saved weights into them; undo (here: leaving the with) restores it."""
    from transformers.models.qwen3 import modeling_qwen3

    original = modeling_qwen3.Qwen3RMSNorm
    make_model("qwen3", "cpu").save_pretrained(tmp_path)
    reference = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path).eval()
    with rownorm.patch_modeling("qwen3") as patch:
        assert modeling_qwen3.Qwen3RMSNorm is not original
        assert issubclass(modeling_qwen3.Qwen3RMSNorm, original)
        model = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path).eval()
        assert "Qwen3RMSNorm" in str(patch)
    assert modeling_qwen3.Qwen3RMSNorm is original
    norms = [m for m in model.modules() if isinstance(m, original)]
    assert len(norms) == 9 and all(isinstance(m, RownormNorm) for m in norms)
    summary = rownorm.patch_model(model)
    assert summary.patched == [] and len(summary.already_patched) == 9
    ids = _ids("cpu")
    with torch.no_grad():
        assert relerr(model(ids).logits, reference(ids).logits) <= RELERR[torch.float32][0]


def test_patch_modeling_every_family():
    """Without arguments: every family of FAMILIES (each has its own RMS norm class), undone
    by undo(); a family whose norms are torch.nn.LayerNorm is refused with what to do."""
    patch = rownorm.patch_modeling()
    try:
        patched = {m.__name__.rsplit(".", 1)[1]: name for m, name, _, _ in patch.replaced}
        assert set(patched) == {f"modeling_{f}" for f in FAMILIES}
        model = make_model("gemma3", "cpu")
        assert all(isinstance(m, RownormNorm) for m in model.modules() if "RMSNorm" in
                   type(m).__name__)  # fmt: skip
    finally:
        patch.undo()
    assert not any(isinstance(m, RownormNorm) for m in make_model("gemma3", "cpu").modules())
    with pytest.raises(ValueError, match="rownorm.patch_model"):
        rownorm.patch_modeling("gpt2")


# ---- recognition by behaviour ---------------------------------------------------------------


class _Norm(torch.nn.Module):
    def __init__(self, n: int = 64, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.epsilon = eps


class RenamedLlamaNorm(_Norm):  # another name, another epsilon attribute: still recognized
    def forward(self, h):
        dtype = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.epsilon)
        return self.weight * h.to(dtype)


class OffsetNorm(_Norm):
    def forward(self, x):
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.epsilon)
        return (out * (1.0 + self.weight.float())).type_as(x)


class Bf16MathNorm(_Norm):  # computes in x's dtype: rounds like neither casting mode
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.epsilon) * self.weight


class FixedEpsNorm(_Norm):  # ignores its epsilon attribute
    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight).type_as(x)


class MeanCenteredNorm(_Norm):  # a LayerNorm without bias, not an RMS norm
    def forward(self, x):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], self.weight, None, self.epsilon)


def test_recognized_by_behaviour():
    assert recognize(RenamedLlamaNorm()) == NormForm("rms_norm", "epsilon", 0.0, "llama")
    assert recognize(OffsetNorm()) == NormForm("rms_norm", "epsilon", 1.0, "once")
    assert recognize(torch.nn.RMSNorm(64)) == NormForm("rms_norm", "eps", 0.0, "once")
    assert "rounds like neither casting mode" in recognize(Bf16MathNorm())
    assert "float32 output is not" in recognize(FixedEpsNorm())
    assert "float32 output is not" in recognize(MeanCenteredNorm())
    hooked = RenamedLlamaNorm()
    hooked.forward = lambda x: x  # as accelerate's hooks wrap a module's forward
    assert "forward is replaced" in recognize(hooked)


def test_left_alone_listed(device):
    """Norm-like modules rownorm does not compute stay as they are and are listed."""
    model = torch.nn.Sequential(
        RenamedLlamaNorm(), Bf16MathNorm(), torch.nn.GroupNorm(4, 64), torch.nn.LayerNorm((4, 16))
    ).to(device)
    summary = rownorm.patch_model(model)
    assert [p.name for p in summary.patched] == ["0"]
    assert [(m.name, m.cls) for m in summary.left_alone] == [
        ("1", "Bf16MathNorm"), ("2", "GroupNorm"), ("3", "LayerNorm")
    ]  # fmt: skip
    assert "left alone: 3" in str(summary) and "1 x RenamedLlamaNorm" in str(summary)
    assert type(model[1]) is Bf16MathNorm


def test_unsupported_inputs_run_the_original_forward(device):
    """A bf16 weight with float32 x (rownorm takes a float32 weight or one of x's dtype) runs
    the module's own forward, as it did before the patch."""
    norm = RenamedLlamaNorm().to(device=device, dtype=torch.bfloat16)
    reference = copy.deepcopy(norm)
    rownorm.patch_model(norm)
    x = torch.randn(3, 64, device=device)
    assert torch.equal(norm(x), reference(x))
    xb = x.bfloat16()
    assert relerr(norm(xb), reference(xb)) < RELERR[torch.bfloat16][0]


def _compile_captured(module, *args):
    """``module(*args)`` through torch.compile(fullgraph=True) with a backend that keeps the
    traced graphs (and runs them as traced), and the rownorm ops those graphs call (packet
    names: dynamo's graphs hold the packet or the overload)."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(module, fullgraph=True, backend=capture)(*args)
    calls = {
        str(n.target).removesuffix(".default")
        for g in graphs
        for n in g.graph.nodes
        if n.op == "call_function" and str(n.target).startswith("rownorm.")
    }
    return out, calls


@pytest.mark.parametrize("fuse_residual", [False, True], ids=["norms", "fused"])
@pytest.mark.parametrize("under_compile", ["inductor", "rownorm"])
def test_compiled_patched_model(device, under_compile, fuse_residual):
    """The patched model compiles with fullgraph=True (Inductor) and matches its eager self;
    ``under_compile`` decides what the compiled graph calls: the norm classes' own forward, no
    rownorm op ("inductor", the default), or rownorm's ops ("rownorm")."""
    model = make_model("qwen3", device)
    summary = rownorm.patch_model(model, fuse_residual=fuse_residual, under_compile=under_compile)
    assert len(summary.fused) == (2 if fuse_residual else 0)
    ids = _ids(device)
    with torch.no_grad():
        eager = model(ids).logits
        traced, calls = _compile_captured(model, ids)
        traced = traced.logits
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)(ids).logits
    if under_compile == "rownorm":
        ops = {"rownorm.rms_norm"}
        assert calls == (ops | {"rownorm.add_rms_norm"} if fuse_residual else ops)
    else:
        assert calls == set()
    assert relerr(traced, eager) <= RELERR[torch.float32][0]
    assert relerr(compiled, eager) <= RELERR[torch.float32][0]


def test_under_compile_keeps_the_output_dtype():
    """A float32 weight on bfloat16 x: the patched norm returns x's dtype where Hugging Face's
    returns float32, so under compile rownorm's op runs even with under_compile="inductor"
    (the output's dtype must not depend on compiling)."""
    norm = transformers.models.llama.modeling_llama.LlamaRMSNorm(64)
    rownorm.patch_model(norm)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        out, calls = _compile_captured(norm, x)
        assert out.dtype == norm(x).dtype == torch.bfloat16
    assert calls == {"rownorm.rms_norm"}
    norm.to(torch.bfloat16)  # now the weight has x's dtype: the class's own forward is traced
    with torch.no_grad():
        out, calls = _compile_captured(norm, x)
    assert calls == set() and out.dtype == torch.bfloat16


def test_under_compile_of_a_second_call():
    """Patching again with another under_compile switches the patched modules to it."""
    model = make_model("llama", "cpu")
    rownorm.patch_model(model)
    norms = [m for m in model.modules() if isinstance(m, RownormNorm)]
    assert norms and {m._rownorm_under_compile for m in norms} == {"inductor"}
    again = rownorm.patch_model(model, under_compile="rownorm")
    assert again.patched == [] and len(again.already_patched) == len(norms)
    assert {m._rownorm_under_compile for m in norms} == {"rownorm"}
    assert {type(m)._rownorm_original for m in norms} == {type(norms[0])._rownorm_original}


def test_under_compile_checked():
    with pytest.raises(ValueError, match="patch_model: under_compile must be one of"):
        rownorm.patch_model(torch.nn.LayerNorm(8), under_compile="aot")
    with pytest.raises(ValueError, match="patch_modeling: under_compile must be one of"):
        rownorm.patch_modeling("llama", under_compile="")


# ---- the fused residual stream (patch_model(model, fuse_residual=True)) ---------------------

# The families whose decoder layers have Llama's structure (Phi-3 with its residual dropouts).
FUSED = ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma"]


def _count_add_rms_norm(monkeypatch) -> list[int]:
    """Counts the fused layers' add_rms_norm calls (so a test sees the fused path ran)."""
    from rownorm.integrations import fused_layers as integration

    calls = [0]
    original = integration.add_rms_norm

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(integration, "add_rms_norm", counted)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", FUSED)
def test_fused_residual_matches(device, family, dtype, monkeypatch):
    """Every decoder layer fused (one add_rms_norm per layer per forward); logits and every
    parameter gradient as the unpatched model's; the same Parameters and state_dict keys."""
    reference = make_model(family, device, dtype)
    model = copy.deepcopy(reference)
    params = dict(model.named_parameters())
    keys = list(model.state_dict())
    layers = [n for n, m in reference.named_modules() if type(m).__name__.endswith("DecoderLayer")]

    summary = rownorm.patch_model(model, fuse_residual=True)

    assert [f.name for f in summary.fused] == layers and len(layers) == 2
    assert all(f.form == MODELS[family][3][f.original.replace("DecoderLayer", "RMSNorm")]
               for f in summary.fused)  # fmt: skip
    assert summary.not_fused == [] and f"in {len(layers)} layer(s)" in str(summary)
    assert list(model.state_dict()) == keys
    assert all(p is params[n] for n, p in model.named_parameters())
    assert all(isinstance(model.get_submodule(n), type(reference.get_submodule(n))) for n in layers)

    calls = _count_add_rms_norm(monkeypatch)
    ids = _ids(device)
    logits, _, grads = loss_and_grads(model, ids)
    assert calls[0] == len(layers)
    ref_logits, _, ref_grads = loss_and_grads(reference, ids)
    logits_tol, grad_tol = RELERR[dtype]
    assert relerr(logits, ref_logits) <= logits_tol, relerr(logits, ref_logits)
    floor = 1e-3 * torch.stack([g.double().norm() for g in ref_grads.values()]).norm().item()
    for name, g in ref_grads.items():
        err = relerr(grads[name], g, floor)
        assert err <= grad_tol, (name, err)

    again = rownorm.patch_model(model, fuse_residual=True)
    assert again.fused == [] and set(layers) <= set(again.already_patched)


class _Attention(torch.nn.Module):
    def __init__(self, n: int = 64) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(n, n)

    def forward(self, hidden_states, **kwargs):
        return torch.tanh(self.proj(hidden_states)), None


class PostNormLayer(torch.nn.Module):
    """Llama's submodules and signature, Gemma2's wiring (the attention output normed before
    the residual add): the probe must see that it is not Llama's."""

    def __init__(self, n: int = 64) -> None:
        super().__init__()
        self.input_layernorm = RenamedLlamaNorm(n)
        self.self_attn = _Attention(n)
        self.post_attention_layernorm = RenamedLlamaNorm(n)
        self.mlp = torch.nn.Linear(n, n)

    def forward(self, hidden_states, attention_mask=None, position_ids=None,
                past_key_values=None, use_cache=False, position_embeddings=None,
                **kwargs):  # fmt: skip
        attn, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        hidden_states = hidden_states + self.post_attention_layernorm(attn)
        return hidden_states + self.mlp(hidden_states)


class LlamaWiredLayer(PostNormLayer):
    def forward(self, hidden_states, attention_mask=None, position_ids=None,
                past_key_values=None, use_cache=False, position_embeddings=None,
                **kwargs):  # fmt: skip
        residual = hidden_states
        attn, _ = self.self_attn(
            hidden_states=self.input_layernorm(hidden_states), attention_mask=attention_mask,
            position_ids=position_ids, past_key_values=past_key_values, use_cache=use_cache,
            position_embeddings=position_embeddings, **kwargs,
        )  # fmt: skip
        hidden_states = residual + attn
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class TupleLayer(LlamaWiredLayer):  # returns (hidden_states,), as transformers 4.x layers did
    def forward(self, hidden_states, attention_mask=None, position_ids=None,
                past_key_values=None, use_cache=False, position_embeddings=None,
                **kwargs):  # fmt: skip
        return (super().forward(hidden_states, **kwargs),)


class Bf16PostNormLayer(LlamaWiredLayer):  # its post_attention_layernorm is not patched
    def __init__(self, n: int = 64) -> None:
        super().__init__(n)
        self.post_attention_layernorm = Bf16MathNorm(n)


def test_unexpected_layers_left_alone(device):
    """Only layers whose forward is Llama's wiring (probed) and whose post_attention_layernorm
    rownorm patched are fused; the rest keep their class and are listed with the reason."""
    torch.manual_seed(0)
    model = torch.nn.ModuleList(
        [LlamaWiredLayer(), PostNormLayer(), TupleLayer(), Bf16PostNormLayer()]
    ).to(device)
    reference = copy.deepcopy(model)
    summary = rownorm.patch_model(model, fuse_residual=True)
    assert [(f.name, f.original) for f in summary.fused] == [("0", "LlamaWiredLayer")]
    reasons = {m.name: (m.cls, m.reason) for m in summary.not_fused}
    assert reasons["1"] == ("PostNormLayer", "its forward computes something else than the "
                            "Llama decoder layer's wiring")  # fmt: skip
    assert reasons["2"] == ("TupleLayer", "its forward returns tuple, not one tensor")
    assert reasons["3"] == ("Bf16PostNormLayer",
                            "its post_attention_layernorm is not one rownorm patched")  # fmt: skip
    assert [type(m) for m in model[1:]] == [PostNormLayer, TupleLayer, Bf16PostNormLayer]
    x = torch.randn(2, 5, 64, device=device)
    for layer, ref in zip(model, reference, strict=True):
        out, ref_out = layer(x), ref(x)
        out, ref_out = (out[0], ref_out[0]) if isinstance(out, tuple) else (out, ref_out)
        assert relerr(out, ref_out) <= RELERR[torch.float32][0]


def test_gemma2_layers_not_fused():
    """Gemma2's layers norm each branch before and after (four norms): left alone, listed."""
    model = make_model("gemma2", "cpu")
    summary = rownorm.patch_model(model, fuse_residual=True)
    assert summary.fused == [] and len(summary.patched) == 9
    assert [(m.cls, m.reason) for m in summary.not_fused] == 2 * [
        ("Gemma2DecoderLayer",
         "it has norms besides Llama's two (pre_feedforward_layernorm, post_feedforward_layernorm)")
    ]  # fmt: skip
    assert "not fused: 2 layer(s)" in str(summary)
