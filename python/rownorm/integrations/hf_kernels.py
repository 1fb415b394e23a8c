"""rownorm's RMS norm as a layer of Hugging Face's ``kernels`` library.

transformers marks its Llama-style RMS norm classes (Llama, Mistral, Qwen2, Qwen3, Phi-3 and
many more) with ``@use_kernel_forward_from_hub("RMSNorm")``. ``kernels.kernelize`` then gives
each such module the forward of the layer a kernel mapping names for "RMSNorm".
:func:`kernel_mapping` names :class:`RMSNorm`, a stateless layer in the shape ``kernels`` asks
for (no constructor, no members but the flags it reads) whose forward runs
:func:`rownorm.rms_norm` on the module's own weight and epsilon::

    from kernels import Mode, kernelize, use_kernel_mapping
    from rownorm.integrations.hf_kernels import kernel_mapping

    with use_kernel_mapping(kernel_mapping()):
        kernelize(model, mode=Mode.TRAINING, device="cuda")

The numerics are :func:`rownorm.patch_model`'s: each class is probed once, the way
``patch_model`` probes it (its own forward on small CPU inputs, an instance made as
``cls(64)``), and rownorm runs where the probe found a form it computes (Llama's casting, or
Gemma's ``1 + w``) and the inputs are ones it takes (see
:mod:`rownorm.integrations.transformers`); everywhere else, and for classes the probe rejects,
the class's own forward runs.

Under ``torch.compile`` :class:`RMSNorm` runs the class's own forward, which Inductor fuses
with its neighbours: measured on an H100, rownorm's op in a compiled training step made it
0.975–0.984× as fast (``benchmarks/results/h100/models/``). Where the weight's dtype differs
from x's, rownorm's op runs under compile too, so that the output dtype (x's) does not depend
on compiling, as with ``patch_model``. ``kernel_mapping(under_compile=
"rownorm")`` names :class:`RMSNormInGraph` instead, whose forward runs rownorm's op in the
compiled graph too (it compiles with ``fullgraph=True``) for the classes probed before the
trace: a trace does not probe, so a class whose first call is compiled runs its own forward
there.

Needs ``kernels`` only for :func:`kernel_mapping` (``pip install rownorm[kernels]``). Tested
with kernels 0.17.2's ``kernelize`` on classes decorated by its own
``use_kernel_forward_from_hub`` (transformers 5.23 turns its decorators on from kernels 0.18.2,
which could not be installed where this was written).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rownorm.functional import rms_norm
from rownorm.integrations import transformers as _hf

# The device types the mapping covers: rownorm's kernels run on CUDA GPUs and on the CPU.
DEVICES = ("cuda", "cpu")


# The form each class computes (a NormForm), or why rownorm does not compute it (a sentence):
# probed on the class's first eager call; a torch.compile trace reads what is here, and does
# not probe (the probe makes a module and runs it).
_FORMS: dict[type, _hf.NormForm | str] = {}


def _form(cls: type) -> _hf.NormForm | str | None:
    form = _FORMS.get(cls)
    if form is None and not torch.compiler.is_compiling():
        form = _FORMS[cls] = _hf._recognize_class(cls)
    return form


def _rownorm_forward(self: torch.nn.Module, hidden_states: torch.Tensor, in_graph: bool):
    own = type(self).forward  # the class's forward: kernelize replaces the instance's only
    if _hf._inductor_fuses("rownorm" if in_graph else "inductor", hidden_states, self.weight):
        return own(self, hidden_states)
    form = _form(type(self))
    if not isinstance(form, _hf.NormForm) or form.kind != "rms_norm":
        return own(self, hidden_states)
    if not _hf._rownorm_takes(hidden_states, self.weight):
        return own(self, hidden_states)
    return rms_norm(
        hidden_states,
        self.weight,
        -1,
        getattr(self, form.eps_attr),
        weight_offset=form.weight_offset,
        casting_mode=form.casting_mode,
    )


class RMSNorm(torch.nn.Module):
    """The "RMSNorm" layer: rownorm's :func:`~rownorm.rms_norm` in eager mode, the class's own
    forward under torch.compile (see the module docstring)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return _rownorm_forward(self, hidden_states, in_graph=False)


class RMSNormInGraph(torch.nn.Module):
    """The "RMSNorm" layer whose forward runs rownorm's op under torch.compile too."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return _rownorm_forward(self, hidden_states, in_graph=True)


@dataclass(frozen=True)
class LayerRepository:
    """A repository in the sense of ``kernels`` (what a kernel mapping names): ``load()`` gives
    the layer class. Hashable, as ``kernels`` caches layers by repository."""

    layer: type

    @property
    def layer_name(self) -> str:
        return self.layer.__name__

    def load(self) -> type:
        return self.layer


def kernel_mapping(under_compile: str = "inductor") -> dict:
    """The kernel mapping that runs rownorm for transformers' "RMSNorm" layers on CUDA and the
    CPU, in every ``kernels.Mode``, for ``kernels.use_kernel_mapping`` /
    ``kernels.register_kernel_mapping``.
    ``under_compile``: ``"inductor"`` (:class:`RMSNorm`) or ``"rownorm"``
    (:class:`RMSNormInGraph`), as :func:`rownorm.patch_model`'s."""
    _hf._check_under_compile("kernel_mapping", under_compile)
    from kernels import Mode  # the optional dependency, needed here only

    layer = RMSNorm if under_compile == "inductor" else RMSNormInGraph
    # TRAINING | TORCH_COMPILE is the last entry before FALLBACK in every mode's search order:
    # one entry serves training and inference, compiled or not.
    modes = {Mode.TRAINING | Mode.TORCH_COMPILE: LayerRepository(layer)}
    return {"RMSNorm": {device: dict(modes) for device in DEVICES}}
