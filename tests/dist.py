"""The package as a user gets it: the wheel and sdist that `python -m build` makes of this
checkout, and a fresh virtual environment (no system site packages) into which the README's own
`pip install` line installed the wheel. tests/conftest.py makes both once per run (`built`,
`readme_install`), for tests/test_packaging.py and tests/test_example_project.py.

Both are kept under CACHE, named by a digest of what goes into the wheel and of the README's
install line: every xdist worker of a run uses the first one's (a file lock), and a later run
whose inputs did not change uses them again (./dev.sh test on a fresh clone builds them once)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import acp_channels
from tests.live import ROOT

VERSION = acp_channels.__version__
WHEEL = f"acp_channels-{VERSION}-py3-none-any.whl"
SDIST = f"acp_channels-{VERSION}.tar.gz"
#: Beside the virtual environment ./dev.sh makes (never committed); elsewhere a temporary folder.
CACHE = (ROOT / ".venv" / "test-cache") if (ROOT / ".venv").is_dir() else Path(tempfile.gettempdir()) / "acp-test-cache"
#: A cache entry of other contents unused for this long is removed when a new one is made.
STALE_AFTER = 3600.0
#: What the wheel and the sdist are made of (examples/ is in the sdist).
BUILD_INPUTS = ("acp_channels", "examples", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "CHANGELOG.md")


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


def inputs_digest() -> str:
    digest = hashlib.sha256()
    for name in BUILD_INPUTS:
        top = ROOT / name
        for path in sorted([top] if top.is_file() else top.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def cached(name: str) -> Iterator[tuple[Path, bool]]:
    """CACHE/`name`-<digest> and whether it is complete, under a lock held while the caller
    fills it (it then writes `done` in it); an incomplete one is emptied first. A new one
    removes those of other contents not used for STALE_AFTER (a fresh environment is 140 MB:
    one per edit would fill the disk; one a parallel run may still be using is kept)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    place = CACHE / f"{name}-{inputs_digest()}"
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = (place / "done").exists()
        if not done:
            shutil.rmtree(place, ignore_errors=True)
            place.mkdir()
            stale = time.time() - STALE_AFTER
            for other in CACHE.glob(f"{name}-*"):
                if other != place and other.is_dir() and other.stat().st_mtime < stale:
                    shutil.rmtree(other, ignore_errors=True)
        else:
            os.utime(place)  # used now
        yield place, done


def cached_build() -> Built:
    """`build` once for these inputs (see CACHE)."""
    with cached("dist") as (dist, done):
        if not done:
            built = build(dist)
            (dist / "build.log").write_text(built.log)
            (dist / "done").touch()
    return Built(dist, (dist / "build.log").read_text())


def cached_readme_install(built: Built) -> Installed:
    """`install_as_the_readme_says` once for these inputs (see CACHE), into a folder of its own."""
    with cached("readme-install") as (folder, done):
        environment = folder / "venv"
        if not done:
            installed = install_as_the_readme_says(built, environment)
            record = {"argv": installed.argv, "returncode": installed.result.returncode,
                      "stdout": installed.result.stdout, "stderr": installed.result.stderr}  # fmt: skip
            (folder / "install.json").write_text(json.dumps(record))
            if installed.result.returncode == 0:
                (folder / "done").touch()
            return installed
    record = json.loads((folder / "install.json").read_text())
    result = subprocess.CompletedProcess(record["argv"], record["returncode"], record["stdout"], record["stderr"])
    return Installed(environment, record["argv"], result)


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
        [str(environment / "bin" / "python"), "-m", *argv, "--quiet", "--no-compile"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=environment.parent,
    )
    return Installed(environment, argv, result)
