"""Which xdist worker runs which test: the live tests of a module whose servers outlive one
test go to one worker per server shape, so that those servers start once per run, not once
per xdist worker (`./dev.sh test` runs `--dist loadgroup`; docs/testing.md).

pytest-xdist's own loadgroup reads groups from `xdist_group` marks by renaming node ids, which
pytest 9 no longer honours (pytest-dev/pytest-xdist#1386: the groups silently spread). The
controller sees only node ids, so the group is worked out from the id and the module's source,
through xdist's public scheduler hook (tests/conftest.py `pytest_xdist_make_scheduler`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

#: A module that names one of these starts real server processes.
LIVE_NAMES = ("DaphneServer", "UvicornServer", "HypercornServer", "ProjectServer(", "Cluster(", "start_server(")
#: A module with fixtures of this scope keeps its servers for several tests.
MODULE_SERVERS = re.compile(r"""scope=["'](module|class)["']""")
#: Every live test runs against one daphne process, and again through three daphne workers
#: sharing Redis behind a round-robin balancer (no sticky sessions).
SHAPES = ["one-worker", "three-workers"]


def keeps_servers(source: str) -> bool:
    """Whether a test module's source starts servers that outlive one test."""
    return any(name in source for name in LIVE_NAMES) and MODULE_SERVERS.search(source) is not None


def server_group(nodeid: str, source: str) -> str | None:
    """The group of a test (its module and server shape) when its module keeps servers."""
    if not keeps_servers(source):
        return None
    path, _, name = nodeid.partition("::")
    params = name[name.find("[") :] if "[" in name else ""
    return "-".join([path, *(shape for shape in SHAPES if shape in params)])


class ServerGroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling, a scope being a server group or else a single test."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self.rootpath = config.rootpath
        self.sources: dict[str, str] = {}

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.partition("::")[0]
        if path not in self.sources:
            file = Path(self.rootpath, path)
            self.sources[path] = file.read_text() if file.is_file() else ""
        return server_group(nodeid, self.sources[path]) or nodeid
