"""The public API is what docs/api.md lists: `acp_channels.__all__` and `acp_channels.client.__all__`
name exactly the names of its tables, and every one of them can be imported."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import acp_channels
import acp_channels.client
from tests.live import ROOT

API = (ROOT / "docs" / "api.md").read_text()


def documented(heading: str) -> list[str]:
    """The names in the first column of the table under `heading`."""
    section = API.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([A-Za-z_][A-Za-z0-9_]*)` \|", section, flags=re.MULTILINE)


SERVER = documented("## The server: `acp_channels`")
CLIENT = documented("## The client: `acp_channels.client`")


def test_the_tables_are_read() -> None:
    assert "HttpClient" in CLIENT and "Principal" in SERVER  # a broken reader would pass below


def test_the_server_api_is_what_the_docs_list() -> None:
    assert sorted(acp_channels.__all__) == sorted(SERVER)


def test_the_client_api_is_what_the_docs_list() -> None:
    assert sorted(acp_channels.client.__all__) == sorted(CLIENT)


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
