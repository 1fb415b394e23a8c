"""The implementations the benchmark times: rownorm's, and its peers.

An :class:`Impl` makes a callable for one (dim, kwargs) configuration: rownorm's public
function, an eager PyTorch expression, ``torch.compile`` of that expression, or Liger-Kernel's
op. A peer that cannot run here (Liger not installed, an op it does not offer, a dim it does
not reduce over) raises :class:`Unavailable`, which the report shows as "not run", never as a
failure.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Callable
from typing import Any

import torch

Fn = Callable[..., Any]  # fn(*tensors) -> Tensor | tuple[Tensor, ...]
Make = Callable[[int, dict], Fn]  # make(dim, kwargs) -> fn
FAMILIES = ("rownorm", "eager", "compile", "liger")


class Unavailable(Exception):
    """An implementation that cannot run here (package missing, op not offered); not a failure."""


@dataclasses.dataclass(frozen=True)
class Impl:
    """One implementation of an op.

    ``make(dim, kwargs)`` returns ``fn(*tensors)`` (called once per configuration, so
    torch.compile sees one static shape) or raises :class:`Unavailable`.
    """

    name: str  # CSV key and column: rownorm, eager_norm, compile, ...
    family: str  # what --impls selects: rownorm | eager | compile | liger
    label: str  # column header in the markdown tables
    expr: str  # the expression timed, for the legend
    make: Make
    grid: bool = True  # part of the default grid (False: seeds only, or when named in --impls)
    cuda_only: bool = False  # reported as unavailable on a CPU run


def compiled(fn: Fn) -> Fn:
    # Each configuration gets a fresh compile of one static shape; resetting first keeps the
    # recompile limit from silently sending later shapes to eager.
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def compile_of(make: Make) -> Make:
    return lambda dim, kw: compiled(make(dim, kw))


def last_dim(dim: int, what: str) -> None:
    if dim != -1:
        raise Unavailable(f"{what} reduces over the last dim only")


def _rownorm_api(name: str) -> Fn:
    """``rownorm.<name>`` (the public function), else the registered ``torch.ops.rownorm``
    op of the same signature; an error (not Unavailable) when neither exists."""
    import rownorm

    fn = getattr(rownorm, name, None)
    if fn is None and hasattr(torch.ops.rownorm, name):
        fn = getattr(torch.ops.rownorm, name)
    if fn is None:
        raise RuntimeError(f"rownorm has no {name} (neither rownorm.{name} nor torch.ops.rownorm)")
    return fn


def rownorm_impl(api: str, expr: str, pass_dim: bool = True) -> Impl:
    """rownorm's implementation: ``rownorm.<api>(*tensors, dim=dim, **kwargs)``."""

    def make(dim: int, kw: dict) -> Fn:
        fn = _rownorm_api(api)
        extra = {"dim": dim} if pass_dim else {}
        return lambda *t: fn(*t, **extra, **kw)

    return Impl("rownorm", "rownorm", "rownorm", expr, make)


def _liger_module():
    try:
        from liger_kernel.transformers import functional
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] == "liger_kernel":
            raise Unavailable("liger_kernel is not installed") from err
        raise Unavailable(f"liger_kernel does not import: {err}") from err
    except Exception as err:  # noqa: BLE001  (a broken optional peer is not a failure)
        raise Unavailable(f"liger_kernel does not import: {type(err).__name__}: {err}") from err
    return functional


def peer_versions() -> str:
    """torch / triton / Liger-Kernel versions, for the report."""
    parts = [f"torch {torch.__version__}"]
    try:
        parts.append(f"triton {importlib.metadata.version('triton')}")
    except importlib.metadata.PackageNotFoundError:
        parts.append("triton not installed")
    liger = liger_version()
    parts.append(f"Liger-Kernel {liger}" if liger else "Liger-Kernel not installed")
    return ", ".join(parts)


def liger_version() -> str | None:
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return None


def _liger_missing(op: str) -> Make:
    def make(dim: int, kw: dict) -> Fn:
        _liger_module()
        raise Unavailable(f"Liger-Kernel has no {op} op")

    return make


def liger_impl(
    op: str, attr: str | None, call: Callable[[Fn, dict], Fn] | None = None, args: str = "x"
) -> Impl:
    """Liger-Kernel's ``liger_kernel.transformers.functional.<attr>`` (last dim only), or a
    placeholder reported as unavailable when Liger has no such op."""
    if attr is None or call is None:
        return Impl("liger", "liger", "Liger", "Liger-Kernel", _liger_missing(op), cuda_only=True)

    def make(dim: int, kw: dict) -> Fn:
        fn = getattr(_liger_module(), attr, None)
        if fn is None:
            raise Unavailable(f"liger_kernel {liger_version()} has no {attr}")
        last_dim(dim, "Liger-Kernel")
        return call(fn, kw)

    return Impl(
        "liger",
        "liger",
        "Liger",
        f"liger_kernel.transformers.functional.{attr}({args})",
        make,
        cuda_only=True,
    )


def eager_and_compiled(
    label: str, expr: str, make: Make, suffix: str = "", grid: bool = True
) -> tuple[Impl, ...]:
    """An eager PyTorch expression and torch.compile of the same expression."""
    return (
        Impl(f"eager{suffix}", "eager", f"eager {label}", expr, make, grid),
        Impl(
            f"compile{suffix}",
            "compile",
            f"compile {label}",
            f"torch.compile({expr}, dynamic=False)",
            compile_of(make),
            grid,
        ),
    )


def err_text(exc: BaseException) -> str:
    """An exception as one short line, for the report."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first[:200]}"
