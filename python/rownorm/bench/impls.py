"""The implementations the benchmark times, and the peers' plumbing.

An :class:`Impl` makes a callable for one (dim, kwargs) configuration: rownorm's public
function, an eager PyTorch expression, ``torch.compile`` of that expression, or Liger-Kernel's
op (rownorm's and the torch equivalent come from the op table, in :mod:`rownorm.bench.specs`).
A peer that cannot run here (Liger not installed, an op it does not offer, a dim it does not
reduce over) raises :class:`Unavailable`, which the report shows as "not run", never as a
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


def liger_missing(op: str) -> Impl:
    """A Liger-Kernel column for an op Liger does not offer: reported as not run."""

    def make(dim: int, kw: dict) -> Fn:
        _liger_module()
        raise Unavailable(f"Liger-Kernel has no {op} op")

    return Impl("liger", "liger", "Liger", "Liger-Kernel", make, cuda_only=True)


def liger_impl(attr: str, call: Callable[[Fn, dict], Fn], args: str = "x") -> Impl:
    """Liger-Kernel's ``liger_kernel.transformers.functional.<attr>`` (last dim only);
    ``call(fn, kwargs)`` adapts it to the benchmark's positional tensors."""

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
