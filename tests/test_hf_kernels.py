"""rownorm.integrations.hf_kernels: rownorm's RMS norm as the "RMSNorm" layer of Hugging Face's
``kernels`` library, kernelized into modules of transformers' norm classes decorated the way
transformers decorates them (``use_kernel_forward_from_hub("RMSNorm")``; transformers 5.23
turns its own decorators on only from kernels 0.18.2). Skipped without kernels or
transformers."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("kernels")
pytest.importorskip("transformers")

from rownorm.integrations import hf_kernels  # noqa: E402
from rownorm.integrations.hf_kernels import RMSNorm, RMSNormInGraph, kernel_mapping  # noqa: E402
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

from kernels import Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping  # noqa: E402


def _hub(cls: type) -> type:
    """A subclass of a transformers norm class, decorated as transformers decorates it."""
    return use_kernel_forward_from_hub("RMSNorm")(type(f"Hub{cls.__name__}", (cls,), {}))


HubLlama = _hub(LlamaRMSNorm)
HubGemma = _hub(GemmaRMSNorm)


class _Doubling(torch.nn.Module):
    """Not a norm rownorm computes (its forward scales x by 2w), decorated as one."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        return 2 * hidden_states * self.weight


HubDoubling = use_kernel_forward_from_hub("RMSNorm")(_Doubling)


def _models(device: str, dtype: torch.dtype, n: int = 96):
    """A stack of decorated norms with random weights, and an untouched copy of it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(HubLlama(n), HubGemma(n), HubDoubling(n))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    model = model.to(device=device, dtype=dtype)
    return model, copy.deepcopy(model)


def _count_rownorm_calls(monkeypatch) -> list:
    calls = []
    real = hf_kernels.rms_norm

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(hf_kernels, "rms_norm", counting)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernelized_norms_match(device, dtype, monkeypatch):
    """Kernelized, Llama's and Gemma's RMS norms run rownorm with the form the probe found
    (Llama's casting; Gemma's 1 + w), their outputs and every gradient those of the
    transformers forward at the dtype's tolerance; a decorated module that is not such a norm
    keeps its own forward."""
    model, ref = _models(device, dtype)
    with use_kernel_mapping(kernel_mapping()):
        kernelize(model, mode=Mode.TRAINING, device=device)
    assert all("forward" in vars(m) for m in model)
    calls = _count_rownorm_calls(monkeypatch)
    x = torch.randn(5, 96, device=device, dtype=dtype, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y, y_ref = model(x), ref(x_ref)
    assert [(c["weight_offset"], c["casting_mode"]) for c in calls] == [
        (0.0, "llama"),
        (1.0, "once"),
    ]
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, y_ref, **tol)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, *model.parameters()], dy)
    grads_ref = torch.autograd.grad(y_ref, [x_ref, *ref.parameters()], dy)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref, **tol)


def test_inputs_rownorm_does_not_take_run_the_class_forward(monkeypatch):
    """A weight of another 16-bit dtype than x: the class's own forward, as patch_model's."""
    model, ref = _models("cpu", torch.float32)
    with use_kernel_mapping(kernel_mapping()):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    model[0].weight.data = model[0].weight.data.half()
    ref[0].weight.data = ref[0].weight.data.half()
    calls = _count_rownorm_calls(monkeypatch)
    x = torch.randn(3, 96, dtype=torch.bfloat16)
    assert torch.equal(model[0](x), ref[0](x))
    assert calls == []


def test_layers_are_what_kernels_accepts():
    """Stateless (no constructor, no members but kernels' two flags), forward(self, x)."""
    base = {name for name in dir(torch.nn.Module)}
    for layer in (RMSNorm, RMSNormInGraph):
        assert layer.__init__ is torch.nn.Module.__init__
        assert set(dir(layer)) - base == {"can_torch_compile", "has_backward"}
        assert layer.can_torch_compile and layer.has_backward


def test_mapping():
    """One entry per device for the mode searched last in every mode; under_compile picks the
    layer and is checked."""
    for under_compile, layer in (("inductor", RMSNorm), ("rownorm", RMSNormInGraph)):
        mapping = kernel_mapping(under_compile)
        assert set(mapping) == {"RMSNorm"}
        assert set(mapping["RMSNorm"]) == set(hf_kernels.DEVICES)
        for modes in mapping["RMSNorm"].values():
            assert list(modes) == [Mode.TRAINING | Mode.TORCH_COMPILE]
            assert modes[Mode.TRAINING | Mode.TORCH_COMPILE].load() is layer
    with pytest.raises(ValueError, match="under_compile"):
        kernel_mapping("fast")


@pytest.mark.parametrize("under_compile", ["inductor", "rownorm"])
def test_compiled(under_compile, monkeypatch):
    """Under torch.compile (fullgraph): RMSNorm leaves the norm to Inductor (the class's own
    forward), RMSNormInGraph runs rownorm's op in the graph for classes probed before the
    trace; the same values as eager either way."""
    model, ref = _models("cpu", torch.float32)
    model = model[:2]
    with use_kernel_mapping(kernel_mapping(under_compile)):
        kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, device="cpu")
    x = torch.randn(4, 96)
    model(x)  # the eager call that probes the classes
    calls = _count_rownorm_calls(monkeypatch)
    torch._dynamo.reset()
    y = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    assert len(calls) == (2 if under_compile == "rownorm" else 0)
    torch.testing.assert_close(y, ref[:2](x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3"])
def test_kernelized_model(device, family, monkeypatch):
    """A tiny transformers model whose RMS norm modules carry the "RMSNorm" layer name (their
    class decorated as transformers decorates it), kernelized: every norm runs rownorm, and the
    logits and every parameter gradient stay those of the unkernelized model (float32, the
    tolerance of tests/test_hf_patch.py)."""
    from test_hf_patch import RELERR, _ids, loss_and_grads, make_model, relerr

    model, ref = make_model(family, device), make_model(family, device)
    norm_cls = next(type(m) for m in model.modules() if type(m).__name__.endswith("RMSNorm"))
    hub_cls = _hub(norm_cls)
    norms = [m for m in model.modules() if type(m) is norm_cls]
    for m in norms:
        m.__class__ = hub_cls
    with use_kernel_mapping(kernel_mapping()):
        kernelize(model, mode=Mode.TRAINING, device=device)
    calls = _count_rownorm_calls(monkeypatch)
    logits, loss, grads = loss_and_grads(model, _ids(device))
    logits_ref, loss_ref, grads_ref = loss_and_grads(ref, _ids(device))
    assert len(calls) == len(norms)
    tol_logits, tol_grads = RELERR[torch.float32]
    assert relerr(logits, logits_ref) <= tol_logits
    for name, g in grads.items():
        assert relerr(g, grads_ref[name]) <= tol_grads, name


def test_compiled_keeps_the_output_dtype(monkeypatch):
    """A float32 weight on bf16 x: the transformers forward returns float32, rownorm x's dtype;
    under torch.compile RMSNorm runs rownorm's op there too, so that compiling does not change
    the output dtype (as patch_model)."""
    model, _ = _models("cpu", torch.float32)
    model = model[:1]
    with use_kernel_mapping(kernel_mapping()):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    x = torch.randn(4, 96, dtype=torch.bfloat16)
    eager = model(x)
    calls = _count_rownorm_calls(monkeypatch)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    assert eager.dtype == compiled.dtype == torch.bfloat16
    assert len(calls) == 1
    assert torch.equal(eager, compiled)
