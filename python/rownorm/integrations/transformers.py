"""Hugging Face ``transformers`` models on rownorm's kernels.

:func:`patch_model` swaps, in place, every normalization module of a model whose numerics
rownorm reproduces; :func:`patch_modeling` swaps the norm classes of transformers' modeling
modules, so that models made afterwards (``from_pretrained``) have them from the start::

    import rownorm

    summary = rownorm.patch_model(model)  # a model already made
    print(summary)

    with rownorm.patch_modeling("llama", "qwen3"):  # or patch_modeling() for every family
        model = AutoModelForCausalLM.from_pretrained(...)

Nothing here imports ``transformers`` until :func:`patch_modeling` is called: :func:`patch_model`
works on any ``torch.nn.Module``.

What is patched, and how it is recognized
-----------------------------------------
* ``torch.nn.LayerNorm`` (and subclasses that keep its forward) over one dim: a forward that
  calls :func:`rownorm.layer_norm` (GPT-2, BERT, the ViT / SigLIP towers, ...).
* RMS norms: modules with a 1-D ``weight`` as their only parameter, an epsilon attribute
  (``variance_epsilon``, ``eps`` or ``epsilon``) and no submodules, whose forward computes one
  of the two forms Hugging Face's models write, which rownorm computes with
  :func:`rownorm.rms_norm`'s options:

  - Llama's ``weight * ŷ.to(input_dtype)`` (Llama, Mistral, Qwen2, Qwen3 with its per-head
    q_norm / k_norm, Phi-3, ...): ``casting_mode="llama"``;
  - Gemma's ``(ŷ * (1.0 + weight.float())).type_as(x)`` (Gemma, Gemma2, Gemma3 with its q_norm /
    k_norm): ``weight_offset=1.0``, ``casting_mode="once"``.

  The form is recognized by behaviour, not by class name, so that a transformers version that
  renames a class or its epsilon attribute is still patched and one that changes the numerics
  is left alone: each class is PROBED once, by running the module's own forward (its weight
  swapped for probe values with ``torch.func.functional_call``) on small CPU inputs. In float32
  the output must be ``ŷ·(w + c)`` with c = 0 or 1, ŷ computed with the module's epsilon (one
  probe row has mean(x²) = eps, so the attribute read is the one the forward uses); in bfloat16
  it must round like one of the two casting modes.

Every other module whose class name says it is a norm is left alone and listed in the summary,
with the reason. A patched module keeps its object, its Parameters (the same tensors), its
attributes, its hooks and its ``state_dict`` keys: only its class changes, to a subclass of its
own (``isinstance`` against the original class still holds) whose forward calls rownorm. Inputs
rownorm cannot take (a weight of another 16-bit dtype than x, a device other than CPU / CUDA)
run the original forward.

The fused residual stream (``patch_model(model, fuse_residual=True)``, opt-in): a decoder
layer of Llama's structure (``input_layernorm``, ``self_attn``, ``post_attention_layernorm``,
``mlp``, no other norm; Llama, Mistral, Qwen2, Qwen3, Phi-3 with its residual dropouts, Gemma)
whose ``post_attention_layernorm`` rownorm patched gets a subclass whose forward computes
``residual + attn`` and that norm as one :func:`rownorm.add_rms_norm`. Its class is probed
first: its own forward and the fused one, on a shallow copy of the layer whose submodules are
float64 stand-ins, must agree (output, gradients, the arguments ``self_attn`` receives) and
return one tensor. Other layers with a ``post_attention_layernorm`` are listed in
``PatchSummary.not_fused``.

Under ``torch.compile`` (``under_compile="inductor"``, the default) a patched module runs its
class's own forward, which Inductor traces and fuses with its neighbours (the residual add, the
casts, the weight's product) in forward and backward. Measured on an H100 (training step of
4-layer Llama / Qwen3 / Gemma decoders, hidden 2048, 8×1024 tokens, bf16; benchmarks/results/
h100/models/), rownorm's op in the compiled graph made the step 0.975–0.984× as fast as the
stock compiled model (fused residual stream included), and norms that cost nothing at all make
it at most 1.021–1.028× faster: under torch.compile no norm kernel can gain much, and an opaque one
loses Inductor's fusions. Eager steps are where rownorm's kernels pay (1.24–1.37×). With
``under_compile="rownorm"`` the compiled graph calls rownorm's ops instead. Where the weight's
dtype differs from x's, rownorm's op runs under compile too, so that the output dtype is the
same compiled or not (see Numerics).

Numerics: the output has x's dtype. Llama's form with a float32 weight on bf16 / fp16 x returns
float32 in Hugging Face's code (type promotion) and x's dtype here; with a weight in x's dtype
(a model loaded in bf16) the results differ only where ŷ itself rounds differently. The
backward is that of the unrounded formula (see :func:`rownorm.rms_norm`).
"""

from __future__ import annotations

import importlib
import math
import numbers
import types
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from rownorm.functional import layer_norm, rms_norm

# The families patch_modeling() patches without arguments: the modeling modules whose RMS norm
# classes are tested against rownorm (tests/test_hf_patch.py).
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3")

_EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")
_FLOATING = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_DEVICES = ("cpu", "cuda", "meta")


@dataclass(frozen=True)
class NormForm:
    """What a patched module computes: ``kind`` ``"rms_norm"`` or ``"layer_norm"``, the
    attribute holding its epsilon, and (rms_norm) :func:`rownorm.rms_norm`'s options."""

    kind: str
    eps_attr: str
    weight_offset: float = 0.0
    casting_mode: str = "once"

    def __str__(self) -> str:
        if self.kind == "layer_norm":
            return "layer_norm"
        return f"rms_norm(weight_offset={self.weight_offset:g}, casting_mode={self.casting_mode!r})"


@dataclass(frozen=True)
class Patched:
    name: str  # the module's qualified name in the model ("" for the model itself)
    original: str  # its class name before the patch
    form: NormForm


@dataclass(frozen=True)
class LeftAlone:
    name: str
    cls: str
    reason: str


@dataclass(frozen=True)
class Fused:
    name: str  # the decoder layer's qualified name in the model
    original: str  # its class name before the patch
    form: NormForm  # what its post_attention_layernorm computes (now inside add_rms_norm)


@dataclass
class PatchSummary:
    """What :func:`patch_model` did: the modules it patched (with the form each computes), the
    ones an earlier call had patched, and the norm-like modules it left alone (with why).
    With ``fuse_residual=True``, also the decoder layers whose residual add and
    post_attention_layernorm became one :func:`rownorm.add_rms_norm` (``fused``), and those
    with a ``post_attention_layernorm`` that were not fused, with why (``not_fused``)."""

    patched: list[Patched] = field(default_factory=list)
    already_patched: list[str] = field(default_factory=list)
    left_alone: list[LeftAlone] = field(default_factory=list)
    fused: list[Fused] = field(default_factory=list)
    not_fused: list[LeftAlone] = field(default_factory=list)

    def counts(self) -> dict[tuple[str, str], int]:
        """{(original class, form): modules}, in the order first seen."""
        return dict(Counter((p.original, str(p.form)) for p in self.patched))

    def __str__(self) -> str:
        lines = [f"rownorm patched {len(self.patched)} module(s)"]
        lines += [f"  {n} x {cls} -> {form}" for (cls, form), n in self.counts().items()]
        if self.already_patched:
            lines.append(f"already patched: {len(self.already_patched)} module(s)")
        if self.left_alone:
            lines.append(f"left alone: {len(self.left_alone)} norm-like module(s)")
            lines += [f"  {m.name or '<model>'} ({m.cls}): {m.reason}" for m in self.left_alone]
        if self.fused:
            fused = Counter(f.original for f in self.fused)
            lines.append(f"fused the residual add into add_rms_norm in {len(self.fused)} layer(s)")
            lines += [f"  {n} x {cls}" for cls, n in fused.items()]
        if self.not_fused:
            lines.append(f"not fused: {len(self.not_fused)} layer(s)")
            lines += [f"  {m.name or '<model>'} ({m.cls}): {m.reason}" for m in self.not_fused]
        return "\n".join(lines)


# ---- the patched classes --------------------------------------------------------------------


UNDER_COMPILE = ("inductor", "rownorm")


class RownormNorm:
    """Marks a class made by this module: a subclass of a model's norm class whose forward
    calls rownorm. ``_rownorm_form`` is what it computes, ``_rownorm_original`` the class it
    derives from (whose forward serves inputs rownorm cannot take), ``_rownorm_under_compile``
    what runs under torch.compile (one of :data:`UNDER_COMPILE`; see the module docstring)."""

    _rownorm_form: NormForm
    _rownorm_original: type
    _rownorm_under_compile: str


def _check_under_compile(caller: str, under_compile: str) -> None:
    if under_compile not in UNDER_COMPILE:
        raise ValueError(
            f"{caller}: under_compile must be one of {UNDER_COMPILE}, got {under_compile!r}"
        )


def _inductor_fuses(under_compile: str, x: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """Whether a norm's own forward runs instead of rownorm's op (for Inductor to fuse): under
    torch.compile with ``under_compile="inductor"``, where the parameters have x's dtype (so
    that the output's dtype does not depend on compiling)."""
    return (
        under_compile == "inductor"
        and torch.compiler.is_compiling()
        and all(p is None or p.dtype == x.dtype for p in params)
    )


def _inductor_runs(module: RownormNorm, x: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """:func:`_inductor_fuses` for a patched module, with its class's ``under_compile``."""
    return _inductor_fuses(module._rownorm_under_compile, x, *params)


def _single_input(args: tuple, kwargs: dict) -> torch.Tensor:
    values = (*args, *kwargs.values())
    if len(values) != 1:
        raise TypeError(f"a norm's forward takes one tensor, got {len(values)} arguments")
    return values[0]


def _rownorm_takes(x: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """Whether rownorm's kernels take x and these parameters (else the original forward runs)."""
    if x.dtype not in _FLOATING or x.device.type not in _DEVICES or x.dim() < 1:
        return False
    return all(
        p is None or (p.dtype in (x.dtype, torch.float32) and p.device == x.device) for p in params
    )


def _rms_forward(self, *args, **kwargs):
    x = _single_input(args, kwargs)
    form = self._rownorm_form
    if not _rownorm_takes(x, self.weight) or _inductor_runs(self, x, self.weight):
        return self._rownorm_original.forward(self, *args, **kwargs)
    return rms_norm(
        x,
        self.weight,
        -1,
        getattr(self, form.eps_attr),
        weight_offset=form.weight_offset,
        casting_mode=form.casting_mode,
    )


def _layer_norm_forward(self, *args, **kwargs):
    x = _single_input(args, kwargs)
    params = (self.weight, self.bias)
    if not _rownorm_takes(x, *params) or _inductor_runs(self, x, *params):
        return self._rownorm_original.forward(self, *args, **kwargs)
    return layer_norm(x, self.weight, self.bias, -1, self.eps)


_CLASSES: dict[tuple[type, NormForm, str], type] = {}


def patched_class(cls: type, form: NormForm, under_compile: str = "inductor") -> type:
    """The subclass of ``cls`` computing ``form`` with rownorm, running ``under_compile``'s
    choice under torch.compile (one class per (cls, form, under_compile)).

    Its name, ``Rownorm<cls>``, keeps "RMSNorm" / "LayerNorm" in it: transformers' weight
    initialization (``_init_weights``) recognizes norms by those words."""
    key = (cls, form, under_compile)
    if key not in _CLASSES:
        forward = _rms_forward if form.kind == "rms_norm" else _layer_norm_forward

        def extra_repr(self) -> str:
            text = cls.extra_repr(self)
            return f"{text}, rownorm={form}" if text else f"rownorm={form}"

        _CLASSES[key] = type(
            f"Rownorm{cls.__name__}",
            (cls, RownormNorm),
            {
                "forward": forward,
                "extra_repr": extra_repr,
                "_rownorm_form": form,
                "_rownorm_original": cls,
                "_rownorm_under_compile": under_compile,
                "__module__": __name__,
                "__doc__": f"{cls.__name__} computing {form} with rownorm's kernels.",
            },
        )
    return _CLASSES[key]


# ---- recognition ----------------------------------------------------------------------------


def _is_torch_layer_norm(module: torch.nn.Module) -> bool:
    return (
        isinstance(module, torch.nn.LayerNorm)
        and type(module).forward is torch.nn.LayerNorm.forward
        and len(module.normalized_shape) == 1
    )


def _eps_attr(module: torch.nn.Module) -> str | None:
    for name in _EPS_ATTRS:
        value = getattr(module, name, "absent")
        if value is None or (isinstance(value, numbers.Real) and not isinstance(value, bool)):
            return name
    return None


def _rms_candidate(module: torch.nn.Module) -> str | None:
    """Why ``module`` cannot be an RMS norm rownorm computes, or None if it may be one."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return "no 1-D weight"
    if len(list(module.parameters(recurse=False))) != 1 or any(True for _ in module.children()):
        return "parameters or submodules besides a weight"
    if _eps_attr(module) is None:
        return f"no epsilon attribute ({', '.join(_EPS_ATTRS)})"
    return None


_PROBES: dict[tuple[type, str], NormForm | str] = {}


def _probe_rms(module: torch.nn.Module, eps_attr: str) -> NormForm | str:
    """The form of an RMS norm candidate's forward, or why it is none rownorm computes (see the
    module docstring). Cached per (class, epsilon attribute)."""
    key = (type(module), eps_attr)
    if key not in _PROBES:
        _PROBES[key] = _run_probe(module, eps_attr)
    return _PROBES[key]


def _run_probe(module: torch.nn.Module, eps_attr: str) -> NormForm | str:
    n = module.weight.shape[0]
    eps_value = getattr(module, eps_attr)
    eps = torch.finfo(torch.float32).eps if eps_value is None else float(eps_value)
    gen = torch.Generator().manual_seed(0)
    rows = max(8, -(-1024 // max(n, 1)))
    x = torch.randn(rows, n, generator=gen) * torch.logspace(-1, 1, rows).unsqueeze(1)
    if eps > 0:  # a row with mean(x²) = eps: a forward using another epsilon misses there
        x[0] *= math.sqrt(eps) / x[0].pow(2).mean().sqrt()
    w = 0.5 * torch.randn(n, generator=gen)

    def run(xs: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(module, {"weight": ws}, (xs,))

    def yhat(xs: torch.Tensor) -> torch.Tensor:  # in float32, as the models compute it
        xf = xs.float()
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)

    try:
        with torch.no_grad():
            at_zero = run(x, torch.zeros(n))
            out = run(x, w)
            xb, wb = x.bfloat16(), w.bfloat16()
            out_b = run(xb, wb)
    except Exception as e:  # a forward that is not a norm of one tensor
        return f"its forward failed on a probe input ({type(e).__name__}: {e})"
    for t in (at_zero, out, out_b):
        if not isinstance(t, torch.Tensor) or t.shape != x.shape:
            return "its forward does not return one tensor of the input's shape"
    y = yhat(x)
    close = lambda a, b: torch.allclose(a.float(), b, rtol=1e-5, atol=1e-6)  # noqa: E731
    offsets = [c for c in (0.0, 1.0) if close(at_zero, c * y)]
    if not offsets:
        return "its float32 output is not x·rsqrt(mean(x²) + eps)·(w + c), c = 0 or 1"
    c = offsets[0]
    if not close(out, y * (w + c)):
        return "its float32 output is not x·rsqrt(mean(x²) + eps)·(w + c), c = 0 or 1"
    if out_b.dtype != torch.bfloat16:
        return f"it returns {out_b.dtype} for bfloat16 x and weight"
    yb = yhat(xb)
    scale = wb.float() + c
    candidates = {
        "once": (yb * scale).to(torch.bfloat16),
        "llama": (scale * yb.to(torch.bfloat16).float()).to(torch.bfloat16),
    }
    misses = {mode: int((out_b != ref).sum()) for mode, ref in candidates.items()}
    mode = min(misses, key=misses.get)  # "once" on a tie: both round alike on this probe
    if misses[mode] > 0.02 * out_b.numel():
        return f"its bfloat16 output rounds like neither casting mode (mismatches: {misses})"
    return NormForm("rms_norm", eps_attr, weight_offset=c, casting_mode=mode)


def recognize(module: torch.nn.Module) -> NormForm | str:
    """The form ``module`` computes, if rownorm computes it; else why not (a sentence)."""
    if _is_torch_layer_norm(module):
        return NormForm("layer_norm", "eps")
    if isinstance(module, torch.nn.LayerNorm):
        return "a torch.nn.LayerNorm over several dims, or with its own forward"
    reason = _rms_candidate(module)
    if reason is not None:
        return reason
    if "forward" in vars(module):
        return "its forward is replaced on the instance (a hook, e.g. accelerate's)"
    return _probe_rms(module, _eps_attr(module))


def _norm_like(module: torch.nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


# ---- patching -------------------------------------------------------------------------------


def patch_model(
    model: torch.nn.Module, *, fuse_residual: bool = False, under_compile: str = "inductor"
) -> PatchSummary:
    """Swaps, in place, every normalization module of ``model`` that rownorm computes for one
    that computes it with rownorm's kernels (see the module docstring for what is recognized).

    With ``fuse_residual=True``, also every decoder layer of Llama's structure (Llama, Mistral,
    Qwen2, Qwen3, Phi-3, Gemma: see the module docstring) whose ``post_attention_layernorm``
    is a patched RMS norm gets a forward that computes ``h = residual + attn`` and
    ``post_attention_layernorm(h)`` as one :func:`rownorm.add_rms_norm`; every other module
    with a ``post_attention_layernorm`` is left alone and listed in ``summary.not_fused``.

    ``under_compile``: what a patched module runs under torch.compile: ``"inductor"`` (the
    default) its class's own forward, which Inductor fuses with its neighbours; ``"rownorm"``
    rownorm's op (see the module docstring for the measurements behind the default).

    The modules stay the same objects with the same Parameters, attributes and hooks, so the
    ``state_dict`` keys and any optimizer holding the parameters are unchanged. Calling it again
    patches what is new and reports the rest as already patched (with this call's
    ``under_compile``).

    Returns:
        A :class:`PatchSummary`: what was patched (and computes which form), and the modules
        whose class name says they are norms that were left alone, with the reason.
    """
    _check_under_compile("patch_model", under_compile)
    summary = PatchSummary()
    for name, module in model.named_modules():
        if isinstance(module, RownormNorm):
            if module._rownorm_under_compile != under_compile:  # the call's choice holds
                module.__class__ = patched_class(
                    module._rownorm_original, module._rownorm_form, under_compile
                )
            summary.already_patched.append(name)
            continue
        form = recognize(module)
        if isinstance(form, NormForm):
            original = type(module).__name__
            module.__class__ = patched_class(type(module), form, under_compile)
            summary.patched.append(Patched(name, original, form))
        elif _norm_like(module):
            summary.left_alone.append(LeftAlone(name, type(module).__name__, form))
    if fuse_residual:
        from rownorm.integrations.fused_layers import fuse_layers

        fuse_layers(model, summary)
    return summary


@dataclass
class ModelingPatch:
    """The classes :func:`patch_modeling` replaced: ``(module, name, original, patched)``.
    :meth:`undo` puts the originals back (models made meanwhile keep their patched modules);
    used as a context manager it undoes on exit."""

    replaced: list[tuple[types.ModuleType, str, type, type]] = field(default_factory=list)

    def undo(self) -> None:
        for module, name, original, patched in reversed(self.replaced):
            if getattr(module, name, None) is patched:
                setattr(module, name, original)
        self.replaced.clear()

    def __enter__(self) -> ModelingPatch:
        return self

    def __exit__(self, *exc) -> None:
        self.undo()

    def __str__(self) -> str:
        names = ", ".join(f"{m.__name__}.{n}" for m, n, _, _ in self.replaced)
        return f"rownorm patched {len(self.replaced)} class(es): {names or 'none'}"


def _modeling_module(family: str | types.ModuleType) -> types.ModuleType:
    if isinstance(family, types.ModuleType):
        return family
    return importlib.import_module(f"transformers.models.{family}.modeling_{family}")


def patch_modeling(
    *families: str | types.ModuleType, under_compile: str = "inductor"
) -> ModelingPatch:
    """Replaces the RMS norm classes of transformers' modeling modules with rownorm's
    subclasses of them, so that models made afterwards (``from_pretrained``, or from a config)
    have rownorm's norms from the start.

    Args:
        families: model families (``"llama"``, ``"qwen3"``, ``"gemma3"``: the name of
            ``transformers.models.<family>.modeling_<family>``) or modeling modules; none:
            every family of :data:`FAMILIES`.
        under_compile: what the norms run under torch.compile, as in :func:`patch_model`.

    Each class is recognized by probing an instance (``cls(64)``), as :func:`patch_model`
    recognizes modules. Families whose norms are ``torch.nn.LayerNorm`` (GPT-2, BERT) have no
    class of their own to replace: patch their models with :func:`patch_model`.

    Returns:
        A :class:`ModelingPatch` (also a context manager that undoes the patch on exit).

    Raises:
        ValueError: a family has no RMS norm class that rownorm computes.
    """
    _check_under_compile("patch_modeling", under_compile)
    patch = ModelingPatch()
    try:
        for family in families or FAMILIES:
            module = _modeling_module(family)
            found = _patch_module_classes(module, patch, under_compile)
            if not found:
                raise ValueError(
                    f"patch_modeling: {module.__name__} defines no RMS norm class that rownorm "
                    f"computes; for models whose norms are torch.nn.LayerNorm, call "
                    f"rownorm.patch_model(model) once the model is made"
                )
    except BaseException:
        patch.undo()
        raise
    return patch


def _patch_module_classes(
    module: types.ModuleType, patch: ModelingPatch, under_compile: str
) -> bool:
    found = False
    for name, cls in list(vars(module).items()):
        if not (
            isinstance(cls, type)
            and issubclass(cls, torch.nn.Module)
            and cls.__module__ == module.__name__
            and "norm" in name.lower()
        ):
            continue
        if issubclass(cls, RownormNorm):
            found = True
            continue
        form = _recognize_class(cls)
        if isinstance(form, NormForm):
            patched = patched_class(cls, form, under_compile)
            setattr(module, name, patched)
            patch.replaced.append((module, name, cls, patched))
            found = True
    return found


def _recognize_class(cls: type) -> NormForm | str:
    try:
        with torch.device("cpu"):
            instance = cls(64)
    except Exception as e:
        return f"cannot be made as {cls.__name__}(64) to be probed ({type(e).__name__})"
    return recognize(instance)


def patched_modules(model: torch.nn.Module) -> Iterable[tuple[str, torch.nn.Module]]:
    """The (name, module) pairs of ``model`` that run rownorm's norms."""
    return ((n, m) for n, m in model.named_modules() if isinstance(m, RownormNorm))
