"""The fused residual stream of :func:`rownorm.integrations.transformers.patch_model`
(``fuse_residual=True``): decoder layers of Llama's structure whose residual add and
``post_attention_layernorm`` become one :func:`rownorm.add_rms_norm`. See that module's
docstring for what is fused and how each layer class is probed first."""

from __future__ import annotations

import copy
import inspect

import torch

from rownorm.functional import add_rms_norm
from rownorm.integrations.transformers import (
    Fused,
    LeftAlone,
    NormForm,
    PatchSummary,
    RownormNorm,
    _inductor_runs,
    _norm_like,
    _rownorm_takes,
    patched_class,
)

_LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
_RESID_DROPOUTS = ("resid_attn_dropout", "resid_mlp_dropout")  # Phi-3's, on each branch


class RownormFusedLayer:
    """Marks a decoder layer class made by this module: a subclass of the layer's class whose
    forward runs the residual add and ``post_attention_layernorm`` as one
    :func:`rownorm.add_rms_norm`. ``_rownorm_original`` is the class it derives from,
    ``_rownorm_dropouts`` whether it applies Phi-3's residual dropouts."""

    _rownorm_original: type
    _rownorm_dropouts: bool
    _rownorm_params: tuple[str, ...]
    _rownorm_defaults: dict


def _fusable(attn: torch.Tensor, residual: torch.Tensor, norm: torch.nn.Module) -> bool:
    """Whether add_rms_norm can stand for ``norm(residual + attn)`` on these inputs (else the
    layer adds and calls the norm module, as the original forward does)."""
    return (
        isinstance(norm, RownormNorm)
        and norm._rownorm_form.kind == "rms_norm"
        and not (norm._forward_hooks or norm._forward_pre_hooks or "forward" in vars(norm))
        and isinstance(attn, torch.Tensor)
        and isinstance(residual, torch.Tensor)
        and attn.shape == residual.shape
        and attn.dtype == residual.dtype
        and _rownorm_takes(attn, norm.weight)
        and not _inductor_runs(norm, attn, norm.weight)
    )


def _fused_layer_forward(self, hidden_states, *args, **kwargs):
    """A Llama-structured pre-norm decoder layer: attention on the normed input, then
    ``post_attention_layernorm(residual + attn)`` as one add_rms_norm whose second output is the
    residual stream the MLP branch is added to. The arguments after ``hidden_states`` are those
    of the class's own forward (``_rownorm_params``, with ``_rownorm_defaults``: Llama's
    ``attention_mask, position_ids, past_key_values, use_cache, position_embeddings``, and
    ``cache_position`` in versions that have it), all passed by keyword to ``self_attn`` as
    that forward passes them; :func:`_probe_layer` checked that it computes the same."""
    if len(args) > len(self._rownorm_params):
        raise TypeError(f"{type(self).__name__}.forward takes at most "
                        f"{len(self._rownorm_params) + 1} positional arguments")  # fmt: skip
    named = dict(self._rownorm_defaults)
    named.update(zip(self._rownorm_params, args, strict=False))
    named.update(kwargs)
    residual = hidden_states
    attn = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **named)[0]
    if self._rownorm_dropouts:
        attn = self.resid_attn_dropout(attn)
    norm = self.post_attention_layernorm
    if _fusable(attn, residual, norm):
        form = norm._rownorm_form
        normed, hidden_states = add_rms_norm(
            attn,
            residual,
            norm.weight,
            getattr(norm, form.eps_attr),
            weight_offset=form.weight_offset,
            casting_mode=form.casting_mode,
        )
    else:
        hidden_states = residual + attn
        normed = norm(hidden_states)
    out = self.mlp(normed)
    if self._rownorm_dropouts:
        out = self.resid_mlp_dropout(out)
    return hidden_states + out


_LAYER_CLASSES: dict[tuple[type, bool], type] = {}


def fused_layer_class(cls: type, dropouts: bool, params: tuple, defaults: dict) -> type:
    """The subclass of decoder layer class ``cls`` whose forward fuses the residual add into
    add_rms_norm (one per (cls, dropouts)). Subclassing keeps what the class's base adds around
    ``forward`` (transformers' gradient checkpointing wraps a subclass's forward too)."""
    key = (cls, dropouts)
    if key not in _LAYER_CLASSES:
        _LAYER_CLASSES[key] = type(
            f"Rownorm{cls.__name__}",
            (cls, RownormFusedLayer),
            {
                "forward": _fused_layer_forward,
                "_rownorm_original": cls,
                "_rownorm_dropouts": dropouts,
                "_rownorm_params": params,
                "_rownorm_defaults": defaults,
                "__module__": __name__,
                "__doc__": f"{cls.__name__} with its residual add fused into add_rms_norm.",
            },
        )
    return _LAYER_CLASSES[key]


class _ProbeStub(torch.nn.Module):
    """Stands for a decoder layer's submodule in the probe: ``fn`` of its hidden states,
    recording the keyword arguments it is called with."""

    def __init__(self, fn, calls: list | None = None) -> None:
        super().__init__()
        self.fn = fn
        self.calls = calls

    def forward(self, *args, **kwargs):
        if self.calls is not None:
            self.calls.append(kwargs)
        return self.fn(kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])


def _layer_arguments(cls: type) -> tuple[tuple[str, ...], dict] | str:
    """The names of the arguments after ``hidden_states`` of ``cls.forward`` (those it takes
    positionally first) and their defaults, or why the signature is not a decoder layer's
    (``self, hidden_states``, then arguments with defaults, then ``**kwargs``)."""
    try:
        params = list(inspect.signature(cls.forward).parameters.values())
    except (TypeError, ValueError):
        return "its forward's signature cannot be read"
    P = inspect.Parameter
    if (
        [p.name for p in params[:2]] != ["self", "hidden_states"]
        or not params[-1:]
        or (params[-1].kind != P.VAR_KEYWORD)
    ):
        return "its forward's signature is not (self, hidden_states, ..., **kwargs)"
    rest = params[2:-1]
    if any(p.kind not in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY) or p.default is P.empty
           for p in rest):  # fmt: skip
        return "its forward has arguments without defaults besides hidden_states"
    positional = tuple(p.name for p in rest if p.kind == P.POSITIONAL_OR_KEYWORD)
    return positional, {p.name: p.default for p in rest}


_LAYER_PROBES: dict[tuple[type, bool], str | None] = {}


def _probe_layer(layer: torch.nn.Module, dropouts: bool) -> str | None:
    """Why the layer's class's forward is not the wiring :func:`_fused_layer_forward` fuses, or
    None if it is. Cached per (class, dropouts)."""
    key = (type(layer), dropouts)
    if key not in _LAYER_PROBES:
        _LAYER_PROBES[key] = _run_layer_probe(layer, dropouts)
    return _LAYER_PROBES[key]


def _run_layer_probe(layer: torch.nn.Module, dropouts: bool) -> str | None:
    """Runs the class's own forward on a shallow copy of the layer whose submodules are
    float64 stand-ins on the CPU (distinct nonlinear maps; a rownorm RMS norm with an offset as
    post_attention_layernorm), and the fused forward on the same: the outputs, the input and
    weight gradients and the arguments the attention receives must agree, and the output must
    be one tensor (transformers 4.x layers return tuples: left alone)."""
    cls = type(layer)
    arguments = _layer_arguments(cls)
    if isinstance(arguments, str):
        return arguments
    params, defaults = arguments
    n = 16
    gen = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    a, b = rand(n, n) / 4, rand(n, n) / 4
    calls: list[dict] = []
    post = patched_class(torch.nn.RMSNorm, NormForm("rms_norm", "eps", 1.0, "llama"))(
        n, eps=1e-6, dtype=torch.float64
    )
    with torch.no_grad():
        post.weight.copy_(rand(n))
    stubs = {
        "input_layernorm": _ProbeStub(lambda x: 2.0 * torch.tanh(x)),
        "self_attn": _ProbeStub(lambda x: (torch.tanh(x @ a), None), calls),
        "post_attention_layernorm": post,
        "mlp": _ProbeStub(lambda x: torch.sin(x @ b)),
    }
    if dropouts:
        stubs |= {_RESID_DROPOUTS[0]: _ProbeStub(lambda x: 0.5 * x)}
        stubs |= {_RESID_DROPOUTS[1]: _ProbeStub(lambda x: 0.25 * x)}
    probe = copy.copy(layer)  # shares the layer's attributes; its own dicts below
    probe.__dict__.update(
        _modules=dict(layer._modules) | stubs,
        _parameters={},
        _buffers={},
        training=False,
        _rownorm_dropouts=dropouts,
        _rownorm_params=params,
        _rownorm_defaults=defaults,
    )
    x = rand(2, 3, n).requires_grad_()
    dy = rand(2, 3, n)
    # Distinct objects for the layer's arguments, by keyword, positionally and left to their
    # defaults; one more keyword argument goes through **kwargs.
    values = {name: object() for name in defaults}
    calls_by = {
        "keyword": ((), values | {"rownorm_probe": object()}),
        "positional": (tuple(values[k] for k in params), {"rownorm_probe": object()}),
        "default": ((), {}),
    }
    for how, (args, kwargs) in calls_by.items():
        results, calls[:] = [], []
        try:
            for forward in (cls.forward, _fused_layer_forward):
                out = forward(probe, x, *args, **kwargs)
                if not isinstance(out, torch.Tensor):
                    return f"its forward returns {type(out).__name__}, not one tensor"
                grads = torch.autograd.grad(out, (x, post.weight), dy)
                results.append((out.detach(), *grads))
        except Exception as e:  # a forward of another structure
            return f"its forward failed on the probe ({type(e).__name__}: {e})"
        if not all(
            torch.allclose(u, v, rtol=1e-10, atol=1e-12) for u, v in zip(*results, strict=True)
        ):
            return "its forward computes something else than the Llama decoder layer's wiring"
        if len(calls) != 2 or calls[0].keys() != calls[1].keys():
            return f"its forward calls self_attn otherwise (arguments given {how})"
        if any(calls[0][k] is not calls[1][k] for k in calls[0] if k != "hidden_states"):
            return f"its forward passes other arguments to self_attn (arguments given {how})"
    return None


def _fuse_reason(layer: torch.nn.Module) -> str | None:
    """Why ``layer`` (a module with a ``post_attention_layernorm``) is not fused, or None."""
    missing = [p for p in _LAYER_PARTS if not isinstance(getattr(layer, p, None), torch.nn.Module)]
    if missing:
        return f"no {', '.join(missing)} submodule"
    if "forward" in vars(layer):
        return "its forward is replaced on the instance (a hook, e.g. accelerate's)"
    others = [n for n, m in layer.named_children() if n not in _LAYER_PARTS and _norm_like(m)]
    if others:
        return f"it has norms besides Llama's two ({', '.join(others)})"
    norm = layer.post_attention_layernorm
    if not isinstance(norm, RownormNorm):
        return "its post_attention_layernorm is not one rownorm patched"
    if norm._rownorm_form.kind != "rms_norm":
        return f"its post_attention_layernorm computes {norm._rownorm_form}, not an RMS norm"
    return _probe_layer(layer, _has_dropouts(layer))


def _has_dropouts(layer: torch.nn.Module) -> bool:
    """Whether the layer has Phi-3's residual dropouts, applied on each branch."""
    return all(isinstance(getattr(layer, d, None), torch.nn.Module) for d in _RESID_DROPOUTS)


def fuse_layers(model: torch.nn.Module, summary: PatchSummary) -> None:
    """Fuses every fusable decoder layer of ``model``, recording each in ``summary``."""
    for name, module in model.named_modules():
        if isinstance(module, RownormFusedLayer):
            summary.already_patched.append(name)
            continue
        if not isinstance(getattr(module, "post_attention_layernorm", None), torch.nn.Module):
            continue
        reason = _fuse_reason(module)
        if reason is not None:
            summary.not_fused.append(LeftAlone(name, type(module).__name__, reason))
            continue
        dropouts = _has_dropouts(module)
        original = type(module).__name__
        params, defaults = _layer_arguments(type(module))  # the probe parsed them
        module.__class__ = fused_layer_class(type(module), dropouts, params, defaults)
        summary.fused.append(Fused(name, original, module.post_attention_layernorm._rownorm_form))
