"""The package as a user gets it: `python -m build` makes a wheel and an sdist that `twine check`
passes, setuptools says nothing about the license, the wheel holds only `acp_channels` (typed,
with its license and the browser module acp-client.js), the sdist also the README's example
(examples/), and the README's install line installs it into a fresh virtual environment (no
system site packages) where it imports and its commands run. The build and the environment are
made once per session (tests/dist.py, tests/conftest.py), shared with tests/test_example_project.py."""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import tarfile
import zipfile

from tests.dist import VERSION, Built, Installed
from tests.live import ROOT


def test_build_makes_a_wheel_and_an_sdist_without_license_warnings(built: Built) -> None:
    assert built.wheel.exists() and built.sdist.exists(), sorted(p.name for p in built.dist.iterdir())
    warnings = [line for line in built.log.splitlines() if re.search(r"warn", line, re.I) and "licen" in line.lower()]
    assert warnings == []


def test_twine_check_passes(built: Built) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(built.wheel), str(built.sdist)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_wheel_holds_only_the_package_typed_and_licensed(built: Built) -> None:
    """Typed, licensed, and with the browser module (served by any site's staticfiles)."""
    with zipfile.ZipFile(built.wheel) as wheel:
        names = wheel.namelist()
        metadata = email.parser.Parser().parsestr(wheel.read(f"acp_channels-{VERSION}.dist-info/METADATA").decode())
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"acp_channels", f"acp_channels-{VERSION}.dist-info"}
    assert "acp_channels/py.typed" in names
    assert "acp_channels/static/acp_channels/acp-client.js" in names
    # What recipe 2 of docs/authentication.md runs from an installed package (tests/test_auth_recipes.py
    # runs it from this checkout): the tokens app's migration, its command and its admin's template.
    assert {
        "acp_channels/tokens/migrations/0001_initial.py",
        "acp_channels/tokens/management/commands/acp_token.py",
        "acp_channels/tokens/templates/acp_tokens/token_created.html",
    } <= set(names)
    assert f"acp_channels-{VERSION}.dist-info/licenses/LICENSE" in names
    assert metadata["Version"] == VERSION
    assert metadata["License-Expression"] == "MIT"
    assert metadata["License"] is None  # the deprecated free-text field is gone
    assert set(metadata.get_all("Provides-Extra") or []) == {"redis", "http2", "oauth", "test"}
    http2 = [line for line in metadata.get_all("Requires-Dist") or [] if 'extra == "http2"' in line]
    # daphne negotiates h2 only with Twisted's tls and http2 extras (h2, priority); httpx needs h2.
    assert any(line.startswith("twisted[http2,tls]") or line.startswith("Twisted[http2,tls]") for line in http2), http2
    assert any(line.startswith("h2") for line in http2), http2


def test_sdist_holds_the_package_license_changelog_and_example_but_no_demo_or_tests(built: Built) -> None:
    """The example the README shows comes along (the README links to it); the wheel never has it."""
    with tarfile.open(built.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "acp_channels/__init__.py"} <= names
    assert "acp_channels/static/acp_channels/acp-client.js" in names
    files = (ROOT / "examples").rglob("*")
    example = {p.relative_to(ROOT).as_posix() for p in files if p.is_file() and "__pycache__" not in p.parts}
    assert example and example <= names
    assert not any(name.endswith((".pyc", ".pyo")) for name in names)
    assert not any(name.startswith(("demo_project", "tests/", "bench/")) for name in names)


def test_readme_install_line_installs_the_wheel_into_a_fresh_venv(readme_install: Installed) -> None:
    installed = readme_install.result
    assert installed.returncode == 0, installed.stdout + installed.stderr
    python, cwd = readme_install.python, readme_install.environment.parent
    probe = (  # the [redis] extra came along
        "import acp_channels, acp_channels.layers, hiredis, importlib.metadata as m; "
        "print(acp_channels.__version__, m.version('acp-channels'), acp_channels.__file__)"
    )
    result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60, cwd=cwd)
    assert result.returncode == 0, result.stderr
    version, metadata_version, location = result.stdout.split()
    assert version == metadata_version == VERSION
    assert location.startswith(str(readme_install.environment))  # the wheel's copy, not this checkout
    for command in ("acp-client", "acp-bridge"):
        helped = subprocess.run(
            [str(readme_install.bin / command), "--help"], capture_output=True, text=True, timeout=60, cwd=cwd
        )
        assert helped.returncode == 0 and "usage" in helped.stdout.lower(), helped.stdout + helped.stderr
