"""The package as a user gets it: the wheel and sdist that `python -m build` makes of this
checkout, and a fresh virtual environment (no system site packages) into which the README's own
`pip install` line installed the wheel. tests/conftest.py makes both once per session
(`built`, `readme_install`), for tests/test_packaging.py and tests/test_example_project.py."""

from __future__ import annotations

import shlex
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import acp_channels
from tests.live import ROOT

VERSION = acp_channels.__version__
WHEEL = f"acp_channels-{VERSION}-py3-none-any.whl"
SDIST = f"acp_channels-{VERSION}.tar.gz"


@dataclass
class Built:
    dist: Path
    log: str

    @property
    def wheel(self) -> Path:
        return self.dist / WHEEL

    @property
    def sdist(self) -> Path:
        return self.dist / SDIST


@dataclass
class Installed:
    """A virtual environment and what the README's install line printed there."""

    environment: Path
    argv: list[str]
    result: subprocess.CompletedProcess[str]

    @property
    def bin(self) -> Path:
        return self.environment / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"


def build(dist: Path) -> Built:
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return Built(dist, result.stdout + result.stderr)


def readme_section(title: str) -> str:
    """The text of one `## title` section of the README."""
    return (ROOT / "README.md").read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def readme_install_line() -> list[str]:
    """The `pip install ...` line of the README's "Add it to your project" section, as argv."""
    section = readme_section("Add it to your project")
    lines = [line.split("#", 1)[0].strip() for line in section.splitlines() if line.startswith("pip install ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def install_as_the_readme_says(built: Built, environment: Path) -> Installed:
    """A new virtual environment at `environment`, and the README's install line run in it, with
    its `dist` pointing at where `build` wrote."""
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(environment)
    argv = readme_install_line()
    assert argv[:2] == ["pip", "install"] and "--find-links" in argv
    argv[argv.index("--find-links") + 1] = str(built.dist)
    result = subprocess.run(
        [str(environment / "bin" / "python"), "-m", *argv, "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=environment.parent,
    )
    return Installed(environment, argv, result)
