"""DTensor sharding rules of the ``torch.ops.rownorm`` ops (forward and backward).

With them the ops accept :class:`~torch.distributed.tensor.DTensor` inputs, so rownorm runs
inside PyTorch's distributed engine (tensor / sequence parallelism, FSDP2 with TP) unchanged.
One rule serves every op; it reads what it needs from the op's schema:

* row tensors (every tensor argument but ``weight`` / ``bias``: ``x``, ``residual``, ``grad``,
  ``y``, ...) share one placement, which the row outputs (the forward's outputs, a backward's
  ``dx``) keep: Replicate, or Shard on any dim but the reduced one (``dim``, normalised; the last
  for ops without ``dim``), where every row is whole on its rank and the op runs locally;
* per-feature parameters (``weight``, ``bias``) are replicated;
* a backward's parameter gradients (its last outputs, one per ``<name>_grad`` flag) are sums
  over rows, so on a mesh dim where the rows are sharded each rank holds a partial sum:
  ``Partial("sum")``, reduced when DTensor needs the whole value; Replicate where the rows are
  replicated, and for a gradient not requested (the ``(0,)`` placeholder).

Anything else is redistributed by DTensor first, as for torch's own layer_norm and softmax: a
row tensor sharded on the reduced dim is all-gathered (the result is replicated), a Partial
input is reduced (all-reduced, or reduce-scattered onto a row shard, whichever DTensor finds
cheaper). No rule computes a row's statistic across ranks.

:class:`SequenceParallel` (made on first use) is torch's tensor-parallel style of that name for
modules of several row inputs and outputs (``rownorm.nn.AddRMSNorm``).

Importing ``torch.distributed.tensor`` takes a second or more, so ``import rownorm`` does not:
:func:`install` registers the rules at once if DTensor is already imported, and otherwise as
soon as it is (every DTensor user imports it before making a DTensor).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
import threading
import warnings

import torch

_DTENSOR_MODULE = "torch.distributed.tensor"
# Per-feature parameters: shape (x.size(dim),), replicated on every rank.
PARAMS = ("weight", "bias")
# A backward op's flag asking for one parameter gradient: ``weight_grad`` -> ``weight``.
_GRAD_FLAG_SUFFIX = "_grad"

_lock = threading.Lock()
_registered = False


def rownorm_ops() -> list[torch._ops.OpOverload]:
    """Every ``torch.ops.rownorm`` op overload of the loaded library that returns tensors
    (forward and backward); the diagnostics (plan_info, plan_row_tier) return text and need no
    rule."""
    names = sorted(
        n.split("::", 1)[1].split(".")[0]
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("rownorm::")
    )
    ops = [getattr(torch.ops.rownorm, n).default for n in dict.fromkeys(names)]
    return [
        op for op in ops if op._schema.returns and all(_is_tensor(r) for r in op._schema.returns)
    ]


def _is_tensor(arg: torch.Argument) -> bool:
    t = arg.type
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.TensorType)


class OpLayout:
    """What the sharding rule needs to know of one op, read from its schema."""

    def __init__(self, op: torch._ops.OpOverload) -> None:
        schema = op._schema
        self.op = op
        self.names = [a.name for a in schema.arguments]
        self.defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
        self.tensors = frozenset(a.name for a in schema.arguments if _is_tensor(a))
        self.has_dim = "dim" in self.names
        # One returned parameter gradient per flag, after the row outputs (dx first).
        self.grad_flags = [
            a.name
            for a in schema.arguments
            if isinstance(a.type, torch.BoolType) and a.name.endswith(_GRAD_FLAG_SUFFIX)
        ]
        self.n_row_outputs = len(schema.returns) - len(self.grad_flags)
        unknown = [f for f in self.grad_flags if f.removesuffix(_GRAD_FLAG_SUFFIX) not in PARAMS]
        if self.n_row_outputs < 1 or unknown or not self.tensors - set(PARAMS):
            raise RuntimeError(
                f"rownorm.distributed: cannot derive a sharding rule from the schema of {op}: "
                f"expected row tensor arguments, row outputs first and one parameter gradient "
                f"per *_grad flag of {PARAMS}"
            )

    def bind(self, args: tuple, kwargs: dict) -> dict:
        """{argument name: value}, defaults filled in (the dispatcher drops trailing ones)."""
        return self.defaults | dict(zip(self.names, args, strict=False)) | kwargs

    def strategies(self, args: tuple, kwargs: dict) -> list[tuple[list, list]]:
        """The acceptable (output placements, input placements) on one mesh dim."""
        from torch.distributed.tensor import Partial, Replicate, Shard

        bound = self.bind(args, kwargs)
        rows = [bound[n] for n in self.names if n in self.tensors and n not in PARAMS]
        ndim = next(r.ndim for r in rows if r is not None)
        reduced = bound["dim"] % ndim if self.has_dim else ndim - 1
        wanted = [bool(bound[f]) for f in self.grad_flags]

        choices = [Replicate()] + [Shard(d) for d in range(ndim) if d != reduced]
        result = []
        for row in choices:
            sharded = isinstance(row, Shard)
            outputs = [row] * self.n_row_outputs + [
                Partial("sum") if sharded and w else Replicate() for w in wanted
            ]
            # One entry per argument as DTensor passes them (positional, then keywords):
            # a placement for each DTensor, None for everything else (None tensors included).
            given = list(zip(self.names, args, strict=False)) + list(kwargs.items())
            inputs = [
                (Replicate() if name in PARAMS else row) if _is_spec(value) else None
                for name, value in given
            ]
            result.append((outputs, inputs))
        return result


def _is_spec(value: object) -> bool:
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    return isinstance(value, DTensorSpec)


def register_sharding_rules() -> None:
    """Registers the sharding rule of every rownorm op with DTensor (idempotent).

    Imports ``torch.distributed.tensor``; :func:`install` calls this when DTensor is imported.
    """
    global _registered
    with _lock:
        if _registered:
            return
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
        from torch.distributed.tensor.experimental import register_sharding

        propagator = DTensor._op_dispatcher.sharding_propagator
        for op in rownorm_ops():
            layout = OpLayout(op)
            register_sharding(op)(_rule(layout))
            # register_sharding keys its cache on the arguments from the first int one on;
            # every non-tensor argument (dim, eps, the *_grad flags that set an output's
            # shape) must be in the key, so the key starts at the first of them.
            first = min(
                (i for i, n in enumerate(layout.names) if n not in layout.tensors),
                default=len(layout.names),
            )
            propagator.op_to_schema_info[op] = RuntimeSchemaInfo(first, needs_pytree=True)
        _registered = True


def _rule(layout: OpLayout):
    def rule(*args, **kwargs):
        return layout.strategies(args, kwargs)

    rule.__name__ = f"{layout.op._schema.name.split('::')[1]}_sharding"
    return rule


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs the registration right after ``torch.distributed.tensor`` finishes importing."""

    def find_spec(self, name, path, target=None):
        if name != _DTENSOR_MODULE:
            return None
        # Find the real spec with the finders after this one, then wrap its loader.
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        except Exception:  # the normal import path reports it
            return None
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _uninstall_hook()
            _register_or_warn()

        spec.loader.exec_module = exec_then_register
        return spec


def _register_or_warn() -> None:
    # Never break torch's import or rownorm's over the rules: say what is missing instead.
    try:
        register_sharding_rules()
    except Exception as e:
        warnings.warn(
            f"rownorm: the DTensor sharding rules of the rownorm ops were not registered "
            f"({type(e).__name__}: {e}); the rownorm ops will not accept DTensor inputs",
            RuntimeWarning,
            stacklevel=3,
        )


_hook: _AfterImport | None = None


def _uninstall_hook() -> None:
    global _hook
    if _hook is not None and _hook in sys.meta_path:
        sys.meta_path.remove(_hook)
    _hook = None


def install() -> None:
    """Registers the rules now if DTensor is imported, else when it is (``import rownorm``
    calls this; it costs nothing until DTensor is used)."""
    global _hook
    if not torch.distributed.is_available():
        return
    if _DTENSOR_MODULE in sys.modules:
        _register_or_warn()
    elif _hook is None:
        _hook = _AfterImport()
        sys.meta_path.insert(0, _hook)


def __getattr__(name: str):
    # SequenceParallel subclasses a torch.distributed.tensor class: made on first use.
    if name == "SequenceParallel":
        return _sequence_parallel()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _sequence_parallel() -> type:
    from torch.distributed.tensor.parallel import SequenceParallel as TorchSequenceParallel

    class SequenceParallel(TorchSequenceParallel):
        """torch's ``SequenceParallel`` for a norm module of several row inputs and outputs.

        torch's style shards the first input only and expects one output; this one shards
        every tensor input on the sequence dim (``rownorm.nn.AddRMSNorm(x, residual)``) and
        treats every output of a tuple alike (its ``(out, x + residual)``). Parameters are
        replicated as by torch's. For one-input modules (RMSNorm, LayerNorm) it is torch's.
        """

        @staticmethod
        def _prepare_input_fn(sequence_sharding, mod, inputs, device_mesh):
            prepare = TorchSequenceParallel._prepare_input_fn
            return tuple(
                prepare(sequence_sharding, mod, (t,), device_mesh)
                if isinstance(t, torch.Tensor)
                else t
                for t in inputs
            )

        @staticmethod
        def _prepare_output_fn(use_local_output, mod, outputs, device_mesh):
            prepare = TorchSequenceParallel._prepare_output_fn
            if isinstance(outputs, tuple):
                return tuple(prepare(use_local_output, mod, o, device_mesh) for o in outputs)
            return prepare(use_local_output, mod, outputs, device_mesh)

    SequenceParallel.__module__ = __name__
    return SequenceParallel


install()
