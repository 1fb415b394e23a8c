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


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_training_follows_unpatched(device, family):
    """30 AdamW steps on one batch: the patched loss curve is the unpatched one."""
    curves = []
    for patch in (False, True):
        model = make_model(family, device).train()
        if patch:
            rownorm.patch_model(model)
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


def test_compiled_patched_model(device):
    """The patched model compiles with fullgraph=True (the norms are rownorm's custom ops)."""
    model = make_model("qwen3", device)
    rownorm.patch_model(model)
    ids = _ids(device)
    with torch.no_grad():
        eager = model(ids).logits
        compiled = torch.compile(model, fullgraph=True)(ids).logits
    assert relerr(compiled, eager) <= RELERR[torch.float32][0]
