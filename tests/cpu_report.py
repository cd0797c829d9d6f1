"""Sums an `ACP_TEST_CPU_LOG` file (tests/conftest.py) per test module, the costliest first:
`python -m tests.cpu_report <file> [rows]`."""

from __future__ import annotations

import sys
from collections import defaultdict


def report(path: str, rows: int = 25) -> str:
    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    for line in open(path):
        nodeid, own, children, seconds = line.rstrip("\n").split("\t")
        module = nodeid.split("::")[0]
        cpu[module] += float(own) + float(children)
        wall[module] += float(seconds)
    total = sum(cpu.values())
    lines = [f"{total:.0f} s of CPU over {len(cpu)} modules", "   cpu s  share  wall s  module"]
    for module in sorted(cpu, key=cpu.__getitem__, reverse=True)[:rows]:
        lines.append(f"{cpu[module]:8.1f} {cpu[module] / total:6.1%} {wall[module]:7.1f}  {module}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(sys.argv[1], *(int(arg) for arg in sys.argv[2:3])))
