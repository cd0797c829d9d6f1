"""The public API is what docs/api.md lists: `acp_channels.__all__`, `acp_channels.errors.__all__`
and `acp_channels.client.__all__` name exactly the names of its tables, and every one of them can
be imported; every other module of the package has a leading underscore."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import acp_channels
import acp_channels.client
import acp_channels.errors
from tests.live import ROOT

API = (ROOT / "docs" / "api.md").read_text()


def documented(heading: str) -> list[str]:
    """The names in the first column of the table under `heading`."""
    section = API.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([A-Za-z_][A-Za-z0-9_]*)` \|", section, flags=re.MULTILINE)


SERVER = documented("## The server: `acp_channels`")
CLIENT = documented("## The client: `acp_channels.client`")
ERRORS = documented("## The server's errors: `acp_channels.errors`")
#: Modules with a public name: the ones docs/api.md names, and what Python and Django require.
PUBLIC_MODULES = frozenset({
    "acp_channels", "acp_channels.apps", "acp_channels.urls", "acp_channels.auth", "acp_channels.layers",
    "acp_channels.errors", "acp_channels.client", "acp_channels.bridge", "acp_channels.oauth",
})  # fmt: skip


def test_the_tables_are_read() -> None:
    assert "HttpClient" in CLIENT and "Principal" in SERVER  # a broken reader would pass below


def test_the_server_api_is_what_the_docs_list() -> None:
    assert sorted(acp_channels.__all__) == sorted(SERVER)


def test_the_client_api_is_what_the_docs_list() -> None:
    assert sorted(acp_channels.client.__all__) == sorted(CLIENT)


def test_the_public_errors_are_what_the_docs_list() -> None:
    assert sorted(acp_channels.errors.__all__) == sorted(ERRORS)
    assert {"AcpError", "Refused"} <= set(ERRORS)


#: The optional app of built-in tokens: its name, and the modules Django looks for in an app.
TOKENS_APP_MODULES = frozenset({
    "acp_channels.tokens", "acp_channels.tokens.apps", "acp_channels.tokens.models", "acp_channels.tokens.admin",
})  # fmt: skip


def test_every_other_module_is_marked_internal() -> None:
    """Below the public modules, each module or package name starts with an underscore (or
    lives in one that does; `__main__` is Python's); Django's management commands and an app's
    migrations keep the names Django needs."""
    package = ROOT / "acp_channels"
    public_named = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if (
            "management" in parts
            or "migrations" in parts
            or any(part.startswith("_") and part != "__init__" for part in parts)
        ):
            continue
        public_named.add(module)
    assert public_named == PUBLIC_MODULES | TOKENS_APP_MODULES


@pytest.mark.parametrize("name", SERVER)
def test_every_server_name_imports(name: str) -> None:
    assert getattr(acp_channels, name) is not None


@pytest.mark.parametrize("name", CLIENT)
def test_every_client_name_imports(name: str) -> None:
    assert getattr(acp_channels.client, name) is not None


def test_importing_the_package_imports_nothing_of_djangos() -> None:
    """Settings modules may import it before Django is configured."""
    code = "import sys, acp_channels; print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout.strip() == "[]"


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        acp_channels.nothing_here  # noqa: B018


def test_every_logger_of_the_package_is_documented() -> None:
    """Logger names are public (docs/api.md): docs/operations.md names each one the code uses."""
    operations = (ROOT / "docs" / "operations.md").read_text()
    used = set()
    for path in (ROOT / "acp_channels").rglob("*.py"):
        used |= set(re.findall(r'getLogger\("(acp_channels[\w.]*)"\)', path.read_text()))
    assert "acp_channels.host" in used  # the reader finds them
    assert sorted(name for name in used if f"`{name}`" not in operations) == []
