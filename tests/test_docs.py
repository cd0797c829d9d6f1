"""The docs hold: relative links resolve (files and heading anchors), every `§N` names a section
of docs/wire-contract.md, the README's benchmark summary is what bench/report.py makes of
bench/results.json, commands meant to be pasted are ASCII, and the curl session (docs/curl.md) runs
against the live demo server (one worker, and three behind a round-robin balancer) and prints
what the README says it prints."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from bench import report
from tests.cluster import Cluster
from tests.live import ROOT, DaphneServer

DOCS = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "bench" / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "examples").rglob("*.md")),
]
CONTRACT = ROOT / "docs" / "wire-contract.md"
FENCE = re.compile(r"^ *```.*?^ *```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)
#: `§2.1` and the like; `RFC 9110 §8.3.1` cites another document.
SECTION = re.compile(r"(?<!RFC \d{4} )§(\d+(?:\.\d+)*)")


def prose(text: str) -> str:
    """Markdown without code blocks and inline code: where links are links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(heading) for heading in HEADING.findall(FENCE.sub("", path.read_text()))}


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^ *```(\w*)\n(.*?)^ *```", text, re.S | re.M)]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check offline
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with anchor #{anchor} in {linked.relative_to(ROOT)}")
    assert broken == []


def test_slug_matches_githubs_rule() -> None:
    assert slug("Browsers on other origins (CORS)") == "browsers-on-other-origins-cors"
    assert slug("2.1 POST") == "21-post"
    assert slug("The Python client: `HttpClient` and `acp-client`") == "the-python-client-httpclient-and-acp-client"


def contract_sections() -> set[str]:
    return {m.group(1) for m in re.finditer(r"^#{2,3} (\d+(?:\.\d+)*)\. ?", CONTRACT.read_text(), re.M)} | {
        m.group(1) for m in re.finditer(r"^### (\d+\.\d+) ", CONTRACT.read_text(), re.M)
    }


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    suffixes = {".py", ".md", ".mjs", ".js", ".ts", ".toml", ".sh", ".txt"}
    return [ROOT / name for name in names if Path(name).suffix in suffixes and (ROOT / name).is_file()]


def test_contract_has_the_sections_it_is_cited_by() -> None:
    sections = contract_sections()
    assert {"1", "2", "2.1", "6.6", "13", "14"} <= sections
    missing = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        cited = set(SECTION.findall(text))
        if not cited:
            continue
        if path != CONTRACT and "wire-contract.md" not in text:
            missing.append(f"{path.relative_to(ROOT)} cites § without naming docs/wire-contract.md")
        missing += [f"{path.relative_to(ROOT)}: §{number}" for number in sorted(cited - sections)]
    assert missing == []


def test_checklist_items_cited_exist() -> None:
    """`item N` / `items N-M` / `checklist N`, in files citing the contract, point into §14's 77
    numbered items."""
    contract = CONTRACT.read_text()
    checklist = contract.split("## 14.", 1)[1]
    numbered = {int(n) for n in re.findall(r"^(\d+)\. ", checklist, re.M)}
    assert numbered == set(range(1, 78))
    cited: set[int] = set()
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        if path == CONTRACT or "wire-contract.md" not in text:
            continue
        for phrase in re.findall(r"\b(?:items?|checklist) (\d+(?:[-, ]+\d+)*)", text):
            cited |= {int(n) for n in re.findall(r"\d+", phrase)}
    assert cited and cited <= numbered


def test_readme_benchmark_summary_is_generated_from_the_results_file() -> None:
    readme = (ROOT / "README.md").read_text()
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    assert report.README_START in readme and report.README_END in readme
    assert report.with_readme_summary(readme, results) == readme, "run: .venv/bin/python -m bench.report"


def test_readme_shows_no_benchmark_figure_outside_the_generated_summary() -> None:
    """A figure typed by hand goes stale (the README once called 69,324 msg/s 'the table above'
    where the table said 81,960): msg/s, ms and ratios appear only in the generated part."""
    readme = (ROOT / "README.md").read_text()
    outside = readme.split(report.README_START)[0] + readme.split(report.README_END)[1]
    figures = re.findall(r"\d[\d,.]*\s*(?:k\s*)?(?:msg/s|ms\b|\u00d7|x the)|\d+(?:\.\d+)? ?%", prose(outside))
    assert figures == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_to_paste_are_ascii(path: Path) -> None:
    """Shell and Python blocks are pasted as they are: an ellipsis or a typographic quote in
    them fails (`Bearer …` did). Untagged blocks show output and may hold anything."""
    bad = [
        line
        for language, body in code_blocks(path.read_text())
        if language in {"sh", "bash", "shell", "python", "py", "toml", "json", "nginx"}
        for line in body.splitlines()
        if not line.isascii()
    ]
    assert bad == []


def readme_curl_session() -> str:
    section = (ROOT / "docs" / "curl.md").read_text().split("# A session with curl", 1)[1]
    ((language, body),) = code_blocks(section)
    assert language == "sh" and body.startswith("URL=http://127.0.0.1:8000/acp\n")
    return body


def test_readme_curl_session_runs_against_the_demo(demo_server: DaphneServer | Cluster, tmp_path: Path) -> None:
    script = readme_curl_session().replace("URL=http://127.0.0.1:8000/acp", f"URL={demo_server.url}", 1)
    result = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    connection_id = re.search(r"^connection: (\S+)$", out, re.M)
    assert connection_id is not None, out
    assert '"result":{"protocolVersion":1' in result.stderr  # the initialize reply's body
    assert re.search(r"^session: \S+$", out, re.M), out
    for line in ("session/new: 202", "session/prompt: 202", "DELETE: 202"):
        assert re.search(rf"^{re.escape(line)}$", out, re.M), out
    events = [json.loads(line.removeprefix("data: ")) for line in out.splitlines() if line.startswith("data: ")]
    chunks = [e["params"]["update"] for e in events if e.get("method") == "session/update"]
    assert [c["sessionUpdate"] for c in chunks] == ["agent_message_chunk"] * 3
    assert [c["content"]["text"] for c in chunks] == [f"{i}:{'x' * 14}" for i in range(3)]
    assert {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}} in events
    assert out.index("session/prompt: 202") < out.index("DELETE: 202")
