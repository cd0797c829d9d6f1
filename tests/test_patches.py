"""acp_channels._patches: the list of every patch, the versions they were tested with (the pins of
pyproject.toml, system check acp_channels.W006), and that they are process-wide only where
daphne serves: `manage.py check`, `migrate`, or a process that builds the application without
serving it leave daphne, Twisted, autobahn and SIGTERM as they were. (That a serving daphne
has them is what the live tests exercise: the 101's headers in tests/test_wire_websocket.py,
the guards in tests/test_edge_limits_live.py, SIGTERM's drain in
tests/test_cluster_faults.py::test_sigterm_drains_streams_cleanly_and_exits and
tests/test_observability_live.py::test_ready_fails_while_draining.)"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from acp_channels import _daphne_compat as daphne_compat
from acp_channels import _patches as patches
from acp_channels._patches import TESTED_VERSIONS, installed_version, release, untested_versions
from acp_channels._startup import check_versions
from tests.live import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
UPSTREAM = ROOT / "docs" / "upstream"


def requirements(group: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(requirement.name): requirement for requirement in map(Requirement, group)}


# -- the pins -----------------------------------------------------------------------------------


def test_the_tested_versions_are_pinned_with_upper_bounds() -> None:
    """Each tested package is pinned `>=low,<high` wherever pyproject names it: daphne and
    what it brings (Twisted, autobahn), channels and Django as dependencies; an extra naming one
    again (http2: Twisted's extras) pins it the same. The redis extra patches nothing: redis-py
    and msgpack through their public APIs."""
    groups = {"dependencies": PYPROJECT["dependencies"], **PYPROJECT["optional-dependencies"]}
    pinned: dict[str, set[str]] = {}
    for group_name, group in groups.items():
        for name, requirement in requirements(group).items():
            pinned.setdefault(name, set()).add(group_name)
            tested = TESTED_VERSIONS.get(next((t for t in TESTED_VERSIONS if canonicalize_name(t) == name), ""))
            if tested is not None:
                low, high = tested
                assert {str(spec) for spec in requirement.specifier} == {f">={low}", f"<{high}"}, (group_name, name)
    for name in ("Django", "channels", "daphne", "Twisted", "autobahn"):
        assert "dependencies" in pinned[canonicalize_name(name)], name
    assert "channels-redis" not in {name for name, _ in requirements(groups["redis"]).items()}
    assert {canonicalize_name(name) for name in TESTED_VERSIONS} <= pinned.keys()


def test_the_installed_versions_are_the_tested_ones() -> None:
    assert all(installed_version(name) is not None for name in TESTED_VERSIONS)
    assert untested_versions() == []
    assert check_versions() == []


@pytest.mark.parametrize(
    ("name", "version", "untested"),
    [
        ("Django", "5.2", False),
        ("Django", "5.2.19", False),
        ("Django", "5.3", True),
        ("Django", "5.3a1", True),  # a pre-release of the next version is that version
        ("Django", "6.0.1", True),
        ("Django", "5.1.9", True),
        ("daphne", "4.3.0", True),
        ("Twisted", "26.10.0", False),
        ("Twisted", "25.5.0", True),
        ("autobahn", "26.12.0", True),
    ],
)
def test_w006_warns_about_an_untested_version(
    monkeypatch: pytest.MonkeyPatch, name: str, version: str, untested: bool
) -> None:
    real = patches.installed_version
    monkeypatch.setattr(patches, "installed_version", lambda n: version if n == name else real(n))
    messages = check_versions()
    if not untested:
        assert messages == []
        return
    assert [message.id for message in messages] == ["acp_channels.W006"]
    low, high = TESTED_VERSIONS[name]
    assert f"{name} {version} is not a version acp-channels was tested with (>={low},<{high})" in messages[0].msg


def test_a_package_not_installed_is_not_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    """channels-redis is an extra: a site on one worker may not have it."""
    real = patches.installed_version
    monkeypatch.setattr(patches, "installed_version", lambda n: None if n == "channels-redis" else real(n))
    assert check_versions() == []


def test_release_reads_the_leading_numbers() -> None:
    assert release("4.2.3") == (4, 2, 3)
    assert release("4.2.3rc1") == (4, 2, 3)
    assert release(" 26.10.0.post1") == (26, 10, 0)
    assert release("unknown") == ()


# -- the list -----------------------------------------------------------------------------------


def installers() -> list[str]:
    """The `_install_*` functions `daphne_compat._install_patches` calls."""
    tree = ast.parse(inspect.getsource(daphne_compat._install_patches))
    return [
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.startswith("_install_")
    ]


def test_every_patch_of_daphne_compat_is_installed_and_listed() -> None:
    defined = sorted(
        name
        for name, value in vars(daphne_compat).items()
        if name.startswith("_install_") and name != "_install_patches" and inspect.isfunction(value)
    )
    assert len(defined) >= 8  # what the reader above sees (a broken reader would pass below)
    assert sorted(set(installers())) == defined
    docstring = patches.__doc__ or ""
    assert [name for name in defined if f"`{name}`" not in docstring] == []


def test_every_guard_of_daphne_guards_is_listed() -> None:
    from acp_channels import _daphne_guards as daphne_guards

    names = ["GuardedHTTPChannel", "GuardedWebRequest", "GuardedHTTPFactory", "H2BodyRefusal", "watch_h2_connections"]
    assert all(hasattr(daphne_guards, name) for name in names)
    assert [name for name in names if name not in (patches.__doc__ or "")] == []


def upstream_patches() -> list[Path]:
    return sorted(UPSTREAM.glob("*.patch"))


def test_every_daphne_fix_has_an_upstream_patch_in_the_readme() -> None:
    readme = (UPSTREAM / "README.md").read_text()
    found = upstream_patches()
    assert len(found) == 7
    assert [path.name for path in found if f"({path.name})" not in readme] == []
    assert "docs/upstream/" in (patches.__doc__ or "")


@pytest.mark.skipif(installed_version("daphne") != "4.2.3", reason="written against daphne 4.2.3's source")
@pytest.mark.parametrize("patch", upstream_patches(), ids=lambda path: path.name)
def test_an_upstream_patch_applies_to_daphnes_own_source(patch: Path, tmp_path: Path) -> None:
    """Each one alone, on a copy of the installed daphne (its files: `daphne/...` in the
    patch's paths, as in daphne's repository); the tests it adds are in its own files."""
    import daphne

    shutil.copytree(Path(daphne.__file__).parent, tmp_path / "daphne")
    result = subprocess.run(
        ["git", "apply", "--check", "--verbose", "--include", "daphne/*", str(patch)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"Checking patch daphne/", result.stderr), result.stderr  # it touched daphne's code


# -- only where daphne serves -------------------------------------------------------------------

STATE = """
import json, signal
import autobahn.util, daphne.http_protocol, daphne.server, daphne.ws_protocol
from autobahn.websocket import protocol
from acp_channels import _daphne_compat as daphne_compat
# The handler while daphne served, where the code ran a server; the one now otherwise.
sigterm = globals().get("sigterm_while_serving", signal.getsignal(signal.SIGTERM))
print("STATE " + json.dumps({
    "installed": daphne_compat.installed(),
    "sigterm_default": sigterm is signal.SIG_DFL,
    "sigterm_ours": getattr(sigterm, "__module__", None) == "acp_channels._daphne_compat",
    "hltype_autobahns": protocol.hltype is autobahn.util.hltype,
    "http_factory_daphnes": daphne.server.HTTPFactory is daphne.http_protocol.HTTPFactory,
    "handle_reply_daphnes": not hasattr(daphne.ws_protocol.WebSocketProtocol.handle_reply, "acp_channels_patched"),
    "run_wrapped": hasattr(daphne.server.Server.run, "acp_channels_serving"),
}))
"""


def process_state(code: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `code` in a fresh interpreter, then STATE: what it left of daphne's patches."""
    environment = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "demo_project.settings",
        **(env or {}),
    }
    result = subprocess.run(
        [sys.executable, "-c", code + STATE], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("STATE "))
    state: dict[str, Any] = json.loads(line.removeprefix("STATE "))
    return state


UNTOUCHED = {
    "installed": False,
    "sigterm_default": True,
    "sigterm_ours": False,
    "hltype_autobahns": True,
    "http_factory_daphnes": True,
    "handle_reply_daphnes": True,
}


def test_manage_py_check_installs_nothing() -> None:
    """`manage.py check` loads daphne (its app imports daphne.server) and patches nothing."""
    code = (
        "import sys\n"
        "from django.core.management import execute_from_command_line\n"
        "execute_from_command_line(['manage.py', 'check'])\n"
        "assert 'daphne.server' in sys.modules\n"
    )
    assert process_state(code) == {**UNTOUCHED, "run_wrapped": False}


def test_migrate_installs_nothing(tmp_path: Path) -> None:
    code = (
        "from django.core.management import execute_from_command_line\n"
        "execute_from_command_line(['manage.py', 'migrate', '-v0'])\n"
    )
    env = {"DJANGO_SETTINGS_MODULE": "tests.auth_site", "ACP_TEST_DATABASE": str(tmp_path / "db.sqlite3")}
    assert process_state(code, env) == {**UNTOUCHED, "run_wrapped": False}
    assert (tmp_path / "db.sqlite3").stat().st_size > 0  # it did migrate


def test_building_the_application_without_serving_it_installs_nothing() -> None:
    """Importing the demo's asgi module (as uvicorn or a test does) only wraps daphne's
    `Server.run`, a class attribute that does nothing until a daphne Server runs."""
    assert process_state("import demo_project.asgi\n") == {**UNTOUCHED, "run_wrapped": True}


def test_a_daphne_server_that_runs_installs_everything() -> None:
    """The wrapper installs the patches as daphne's own `Server.run` starts, with SIGTERM,
    before the reactor runs (stopped here by the ready callback: nothing is served)."""
    code = (
        "import signal, demo_project.asgi, daphne.server\n"
        "from twisted.internet import reactor\n"
        "def stop():\n"
        "    global sigterm_while_serving\n"
        "    sigterm_while_serving = signal.getsignal(signal.SIGTERM)\n"
        "    reactor.stop()\n"
        "server = daphne.server.Server(demo_project.asgi.application, ['tcp:port=0:interface=127.0.0.1'],\n"
        "                              ready_callable=lambda: reactor.callWhenRunning(stop))\n"
        "server.run()\n"
    )
    state = process_state(code)
    assert state == {
        "installed": True,
        "sigterm_default": False,
        "sigterm_ours": True,  # set once the reactor runs, over Twisted's
        "hltype_autobahns": False,
        "http_factory_daphnes": False,
        "handle_reply_daphnes": False,
        "run_wrapped": True,
    }
