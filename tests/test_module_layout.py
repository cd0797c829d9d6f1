"""The package's layering, read from its source with `ast` (no import runs):

- the edges (views, consumer) talk only to the gateway and the protocol rules: they import neither
  the host, nor the worker bus, nor the cross-worker protocol, nor the agents;
- the host does not know the bus (nor the gateway or the edges above it);
- the agent adapters (a module or a package each) import only the agents' interface, never the
  package or its factory;
- the module-level import graph of `acp_channels` has no cycle (imports inside functions are the
  deliberate late ones, run after every module is loaded);
- no module passes 500 lines.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live import ROOT

PACKAGE = ROOT / "acp_channels"
EDGES = ("acp_channels._views", "acp_channels._consumers")
#: What an edge reaches only through the gateway (`worker_protocol`: the typed cross-worker ops).
BEHIND_THE_GATEWAY = (
    "acp_channels._host",
    "acp_channels._worker",
    "acp_channels._worker_protocol",
    "acp_channels._agents",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST, late: bool, typing: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif (not late and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)) or (
            not typing and isinstance(child, ast.If) and _is_type_checking(child)
        ):
            continue  # runs later (when called), or never (for type checkers only)
        else:
            yield from _import_nodes(child, late, typing)


def imports(name: str, *, late: bool = True, typing: bool = True) -> set[str]:
    """The `acp_channels` modules `name` imports (`from X import Y` names X, and X.Y when Y is
    a module): with `late`, imports inside functions too; with `typing`, those under
    `if TYPE_CHECKING:` too."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    package = name if is_package(name) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(tree, late, typing):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*anchor, *([base] if base else [])])
        found.add(base)
        found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)
    return {target for target in found if target in MODULES}


def import_graph(*, late: bool) -> dict[str, set[str]]:
    """Module -> the modules importing it runs (type-checking imports never run). Importing
    `a.b.c` runs `a` and `a.b` too, except the packages the importer is itself inside (they are
    already being imported); naming such a package in an import (`from a.b import name`) is an
    edge to it all the same: the name must exist there."""
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        own = {name.rsplit(".", depth)[0] for depth in range(1, name.count(".") + 1)}
        named = imports(name, late=late, typing=False)
        implied = {target.rsplit(".", depth)[0] for target in named for depth in range(1, target.count(".") + 1)}
        graph[name] = ((named | (implied - own)) & MODULES.keys()) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_layout_is_read_from_the_source() -> None:
    """The readers above see what they check (a broken reader would pass every rule)."""
    assert {"acp_channels._gateway", "acp_channels._views", "acp_channels._agents.channel"} <= MODULES.keys()
    assert "acp_channels._gateway" in imports("acp_channels._views", late=False)
    assert "acp_channels._host" in imports("acp_channels._gateway", late=False)
    # `from acp_channels import protocol` names the module; lazy imports count anywhere only.
    assert "acp_channels._protocol" in imports("acp_channels._views", late=False)
    assert "acp_channels._host" not in imports("acp_channels._inventory", late=False)
    assert "acp_channels._host" in imports("acp_channels._inventory")
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("edge", EDGES)
def test_an_edge_imports_only_the_gateway_and_the_protocol_rules(edge: str) -> None:
    reached = imports(edge)
    assert "acp_channels._gateway" in reached
    behind = sorted(target for target in reached for hidden in BEHIND_THE_GATEWAY if _under(target, hidden))
    assert behind == [], f"{edge} imports {behind}: reach them through acp_channels._gateway"


def test_the_host_does_not_know_the_bus_nor_what_is_above_it() -> None:
    above = ("acp_channels._worker", "acp_channels._worker_protocol", "acp_channels._gateway", *EDGES)
    reached = imports("acp_channels._host")
    assert sorted(target for target in reached if any(_under(target, name) for name in above)) == []


@pytest.mark.parametrize("adapter", ["acp_channels._agents.sdk", "acp_channels._agents.stdio"])
def test_an_agent_adapter_imports_only_the_agents_interface(adapter: str) -> None:
    """An adapter is a module or a package: what its modules import from outside it."""
    reached = {target for name in MODULES if _under(name, adapter) for target in imports(name)}
    outside = {target for target in reached if not _under(target, adapter)}
    assert "acp_channels._agents.channel" in outside
    agents = sorted(target for target in outside if _under(target, "acp_channels._agents"))
    assert agents == ["acp_channels._agents.channel"]


def test_the_agents_interface_and_factory_live_apart() -> None:
    assert not any(_under(target, "acp_channels._agents") for target in imports("acp_channels._agents.channel"))
    factory_imports = imports("acp_channels._agents.factory", late=False)
    assert "acp_channels._agents.channel" in factory_imports
    assert not {"acp_channels._agents.sdk", "acp_channels._agents.stdio"} & factory_imports  # loaded when used


def test_the_package_has_no_import_cycle() -> None:
    """None at import time, and none through the late imports inside functions either (those
    break cycles at import time only: the modules still depend on each other)."""
    at_import = import_graph(late=False)
    # importing agents.channel runs the package
    assert "acp_channels._agents" in at_import["acp_channels._host.connection"]
    assert "acp_channels._agents.sdk" not in at_import["acp_channels._agents.factory"]
    assert cycles(at_import) == []
    with_late = import_graph(late=True)
    assert "acp_channels._agents.sdk" in with_late["acp_channels._agents.factory"]
    assert cycles(with_late) == []


def test_importing_the_agents_package_loads_no_adapter() -> None:
    """`from acp_channels._agents import AgentChannel` stays cheap: no SDK, no subprocess code,
    no Django (a fresh interpreter, so nothing was imported before)."""
    script = (
        "import sys\n"
        "from acp_channels._agents import AgentChannel, AgentClosed, create_agent_channel, factory_problem\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('acp_channels', 'acp', 'django'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert {"acp_channels._agents.channel", "acp_channels._agents.factory"} <= loaded
    assert not {name for name in loaded if name.split(".")[0] in ("acp", "django")}
    assert not {"acp_channels._agents.sdk", "acp_channels._agents.stdio"} & loaded


#: The most lines a module of the package may have: past it, split it by responsibility.
MAX_LINES = 500


def test_no_module_exceeds_the_line_limit() -> None:
    lengths = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert lengths["acp_channels._checks"] > 100  # the reader sees the package
    over = {name: length for name, length in lengths.items() if length > MAX_LINES}
    assert over == {}
