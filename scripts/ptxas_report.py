"""Registers, spills, stack and shared memory of every kernel, from a build log with ptxas -v.

    python scripts/ptxas_report.py BUILD_LOG TOP_MD > ALL_MD

Reads the ``ptxas info`` lines of a build made with ``ROWNORM_PTXAS_VERBOSE=1`` and prints a
markdown table of every kernel (entry function) and arch, the kernels that spill first. Writes
to TOP_MD the short form for the GPU check's summary: the kernels that spill, then the 12 that
use the most registers. Prints nothing and writes nothing when the log names no kernel
(nothing was recompiled).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass


@dataclass
class Usage:
    regs: int = 0
    stack: int = 0
    spill_st: int = 0
    spill_ld: int = 0
    smem: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_st + self.spill_ld > 0


Kernels = dict[tuple[str, str], Usage]  # (mangled name, sm_XX) -> usage

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse(text: str) -> Kernels:
    """The usage of every entry function in a ptxas -v log: its frame line, then its
    register line, follow its 'Compiling entry function' line."""
    kernels: Kernels = {}
    cur = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            cur = (m.group(1), m.group(2))
            kernels[cur] = Usage()
            continue
        if cur is None:
            continue
        if m := _FRAME.search(line):
            usage = kernels[cur]
            usage.stack, usage.spill_st, usage.spill_ld = (int(g) for g in m.groups())
        if m := _REGS.search(line):
            s = _SMEM.search(line)
            kernels[cur].regs = int(m[1])
            kernels[cur].smem = int(s[1]) if s else 0
            cur = None
    return kernels


def demangle(names: list[str]) -> dict[str, str]:
    """Mangled -> demangled names through c++filt (the names themselves without it)."""
    try:
        out = subprocess.run(
            ["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True
        ).stdout.splitlines()
        return dict(zip(names, out, strict=True))
    except (OSError, subprocess.CalledProcessError, ValueError):
        return {n: n for n in names}


def short(name: str) -> str:
    """'void rownorm::K<rownorm::Op<float>, float, 4>(args...)' -> 'K<Op<float>, float, 4>'."""
    name = name.removeprefix("void ").replace("rownorm::", "")
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            return name[:i]
    return name


def table(rows: list[tuple[str, str, Usage]]) -> str:
    lines = [
        "| kernel | arch | regs | spill st/ld (B) | stack (B) | smem (B) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, arch, u in rows:
        flag = " **spills**" if u.spills else ""
        lines.append(
            f"| `{name}`{flag} | {arch} | {u.regs} | {u.spill_st}/{u.spill_ld} | {u.stack} "
            f"| {u.smem} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    log_path, top_path = argv
    with open(log_path, errors="replace") as f:
        kernels = parse(f.read())
    if not kernels:
        return 0
    pretty = demangle(sorted({name for name, _ in kernels}))
    rows = sorted(
        ((short(pretty[name]), arch, u) for (name, arch), u in kernels.items()),
        key=lambda r: (not r[2].spills, r[0]),
    )
    n_spill = sum(u.spills for u in kernels.values())
    head = (
        f"{len(kernels)} kernel(s), {n_spill} with spills, at most "
        f"{max(u.regs for u in kernels.values())} registers.\n"
    )
    print(head)
    print(table(rows))
    top = [r for r in rows if r[2].spills]
    top += sorted((r for r in rows if not r[2].spills), key=lambda r: -r[2].regs)[:12]
    with open(top_path, "w") as f:
        f.write(
            head + "\nKernels that spill, then the 12 using the most registers (all of them in "
            "build.log):\n\n" + table(top) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
