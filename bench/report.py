"""Turn bench/results.json into bench/RESULTS.md (tables, ratios) and bench/results.png (chart).

    .venv/bin/python -m bench.report [results.json]

bench/PROFILE.md (the hand-written profile findings) is appended to RESULTS.md when present.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OURS = ["ours-daphne", "ours-uvicorn", "ours-3w-redis"]
PEERS = ["ts-sdk", "py-sdk-uvicorn", "py-sdk-daphne"]
TARGETS = {  # the earlier measurement of the peers (bench issue), same method
    ("ts-sdk", "http", "stream"): 59700, ("ts-sdk", "ws", "stream"): 64900,
    ("ts-sdk", "http", "rtt"): 1.02, ("ts-sdk", "ws", "rtt"): 0.26,
    ("py-sdk-uvicorn", "http", "stream"): 11350,
    ("py-sdk-uvicorn", "http", "rtt"): 0.50, ("py-sdk-uvicorn", "ws", "rtt"): 0.39,
    ("py-sdk-daphne", "http", "stream"): 5000, ("py-sdk-daphne", "http", "rtt"): 1.65,
    ("inprocess", "-", "stream"): 50000,
}


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def get(results: dict[str, Any], key: str, transport: str, metric: str, field: str = "p50") -> float | None:
    if key in ("inprocess-sdk", "inprocess-host"):
        entry = results.get("inprocess", {}).get(key.split("-")[1], {})
    else:
        entry = results["servers"].get(key, {}).get(transport, {})
    if not entry or "error" in entry or metric not in entry:
        return None
    value = entry[metric]
    return med(value) if metric == "stream" else value[field]


def fanout_level(results: dict[str, Any], key: str, transport: str, clients: int) -> dict[str, Any] | None:
    fan = results["servers"].get(key, {}).get("fanout", {})
    for level in fan.get(transport, []) if isinstance(fan, dict) else []:
        if level["clients"] == clients:
            return level
    return None


def fmt(value: float | None, digits: int = 2, thousands: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if thousands else f"{value:.{digits}f}"


def ratio(ours: float | None, peer: float | None, higher_is_better: bool) -> str:
    if not ours or not peer:
        return "—"
    value = ours / peer if higher_is_better else peer / ours
    return f"{value:.2f}×"


def label(results: dict[str, Any], key: str) -> str:
    if key == "inprocess-sdk":
        return "in-process limit (Python SDK agent, memory)"
    if key == "inprocess-host":
        return "ours, host only in-process (no HTTP)"
    return str(results["servers"].get(key, {}).get("label", key))


def write(results: dict[str, Any], out: Path = HERE) -> None:
    (out / "RESULTS.md").write_text(markdown(results))
    try:
        chart(results, out / "results.png")
    except Exception as error:  # the tables matter more than the picture
        print(f"chart failed: {error}", file=sys.stderr)
    print(f"wrote {out / 'RESULTS.md'} and {out / 'results.png'}")


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    sizes = meta["sizes"]
    servers = [key for key in [*OURS, *PEERS] if key in results["servers"]]
    lines = ["## Benchmarks", ""]
    lines += [
        f"Measured {meta['date']} on {meta['machine']['nproc']} × {meta['machine']['cpu']} "
        f"({meta['machine']['memory']}, Linux {meta['machine']['kernel']}), {meta['pinning']}"
        f"{' — QUICK run, not for publication' if meta['quick'] else ''}. "
        f"Reproduce with `.venv/bin/python -m bench.run` (about {max(1, round(meta.get('duration_s', 0) / 60))} "
        "minutes; `--quick` for a short run); method and options in `bench/README.md`.",
        "",
        "Every server hosts an agent with the same commands (demo_project.agent for ours and the Python SDK "
        "server; the TS peer's agent for the TypeScript SDK server). Each (server, transport): a warm-up stream "
        f"of {sizes['warmup']:,} messages, then {sizes['reps']} repetitions on one connection, medians reported: "
        f"**stream** one prompt streaming {sizes['stream']:,} `agent_message_chunk` updates of 64 characters "
        f"(messages/s, prompt sent → reply received); **rtt** {sizes['rtt']:,} sequential `echo` prompts (prompt "
        f"sent → reply received, and the POST's 202 over HTTP); **permission** {sizes['permission']} prompts "
        "that each ask `session/request_permission` and get `allow` (whole turn: 2 client messages, 3 agent "
        f"messages); **fanout** {', '.join(map(str, sizes['fanout']))} clients at once, each: initialize → "
        f"streams → session/new → {sizes['fanout_prompts']} prompts streaming {sizes['fanout_chunks']} chunks → "
        "DELETE (WebSocket: connect, initialize, session/new, prompts, close). Every scenario checks each "
        "message: all chunk indices once and in order, the reply after the last chunk, echoed texts, the "
        "permission outcome; a run with any loss or reordering counts as failed.",
        "",
    ]
    if "calibration" in results:
        cal = results["calibration"]
        lines += [
            f"Load generator ceiling (bench.rawserver, a server that only sends prebuilt events): "
            f"{med(cal['http']):,.0f} msg/s over SSE, {med(cal['ws']):,.0f} msg/s over WebSocket, with the same "
            "parsing and checks: well above every server below, so the numbers are the servers'.",
            "",
        ]
    # main table
    lines += ["### Results", "",
              "| server | stream HTTP msg/s | stream WS msg/s | rtt HTTP p50 / p90 / p99 ms | "
              "rtt WS p50 / p90 / p99 ms | permission HTTP p50 / p99 ms | permission WS p50 / p99 ms |",
              "|---|--:|--:|--:|--:|--:|--:|"]
    for key in [*servers, "inprocess-sdk", "inprocess-host"]:
        if key.startswith("inprocess") and key.split("-")[1] not in results.get("inprocess", {}):
            continue
        cells = [label(results, key)]
        transports = ["-", "-"] if key.startswith("inprocess") else ["http", "ws"]
        if key.startswith("inprocess"):
            s = get(results, key, "-", "stream")
            cells += [f"{fmt(s, thousands=True)} (no transport)", ""]
            r = [get(results, key, "-", "rtt", f) for f in ("p50", "p90", "p99")]
            cells += [" / ".join(fmt(v, 3) for v in r), ""]
            p = [get(results, key, "-", "permission", f) for f in ("p50", "p99")]
            cells += [" / ".join(fmt(v, 3) for v in p), ""]
        else:
            for transport in transports:
                cells.append(fmt(get(results, key, transport, "stream"), thousands=True))
            for transport in transports:
                cells.append(" / ".join(fmt(get(results, key, transport, "rtt", f)) for f in ("p50", "p90", "p99")))
            for transport in transports:
                cells.append(" / ".join(fmt(get(results, key, transport, "permission", f)) for f in ("p50", "p99")))
        lines.append("| " + " | ".join(cells) + " |")
    errors = [(key, t, results["servers"][key][t]["error"]) for key in servers for t in ("http", "ws")
              if isinstance(results["servers"][key].get(t), dict) and "error" in results["servers"][key][t]]
    for key, transport, error in errors:
        lines.append(f"\n{label(results, key)}, {'HTTP' if transport == 'http' else 'WebSocket'}: failed "
                     f"(`{error}`), see the profile findings below.")
    lines.append("")
    # fanout
    levels = sizes["fanout"]
    lines += ["### Fanout", "",
              "Completed clients (all checks passed) / clients, wall time, peak RSS of the server process(es) "
              "(sum over the cluster's workers, balancer and Redis), each transport on a freshly started server.",
              "",
              "| server | " + " | ".join(f"HTTP {n}" for n in levels) + " | " + " | ".join(f"WS {n}" for n in levels)
              + " |",
              "|---|" + "--:|" * (2 * len(levels))]
    for key in servers:
        cells = [label(results, key)]
        for transport in ("http", "ws"):
            for n in levels:
                level = fanout_level(results, key, transport, n)
                cells.append("—" if level is None else
                             f"{level['completed']}/{n}, {level['seconds']:.1f} s, {level['peak_rss_mb']:.0f} MB")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    # ratios
    top = max(levels)
    lines += ["### Ratios to each peer", "",
              "Speed of ours relative to the peer: ours ÷ peer for messages/s, peer ÷ ours for latencies and "
              "wall times, so **above 1× means ours is faster**.", ""]
    metrics = [("stream HTTP", "http", "stream", "p50", True), ("stream WS", "ws", "stream", "p50", True),
               ("rtt p50 HTTP", "http", "rtt", "p50", False), ("rtt p50 WS", "ws", "rtt", "p50", False),
               ("rtt p99 HTTP", "http", "rtt", "p99", False), ("permission p50 HTTP", "http", "permission", "p50",
                                                                False),
               (f"fanout {top} HTTP time", "http", "fanout", "", False),
               (f"fanout {top} WS time", "ws", "fanout", "", False)]
    peers = [key for key in PEERS if key in results["servers"]]
    if "sdk" in results.get("inprocess", {}):
        peers.append("inprocess-sdk")
    for ours in [key for key in OURS if key in results["servers"]]:
        lines += [f"**{label(results, ours)}** vs:", "",
                  "| metric | " + " | ".join(label(results, p) for p in peers) + " |",
                  "|---|" + "--:|" * len(peers)]
        for name, transport, metric, field, higher in metrics:
            cells = [name]
            for peer in peers:
                if metric == "fanout":
                    a, b = fanout_level(results, ours, transport, top), fanout_level(results, peer, transport, top)
                    ok = a and b and a["completed"] == top and b["completed"] == top
                    cells.append(ratio(a["seconds"], b["seconds"], False) if ok else "—")  # type: ignore[index]
                elif peer.startswith("inprocess"):
                    cells.append(ratio(get(results, ours, transport, metric, field),
                                       get(results, peer, "-", metric, field), higher))
                else:
                    cells.append(ratio(get(results, ours, transport, metric, field),
                                       get(results, peer, transport, metric, field), higher))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    # targets
    lines += ["### The peers against the earlier measurement (targets)", "",
              "| peer, metric | earlier | this run |", "|---|--:|--:|"]
    for (key, transport, metric), target in TARGETS.items():
        value = (get(results, "inprocess-sdk", "-", metric) if key == "inprocess"
                 else get(results, key, transport, metric))
        unit = "msg/s" if metric == "stream" else "ms p50"
        name = "in-process SDK agent" if key == "inprocess" else f"{key} {transport}"
        shown = fmt(value, thousands=metric == "stream")
        lines.append(f"| {name} {metric} ({unit}) | {fmt(target, thousands=metric == 'stream')} | {shown} |")
    ts_fan = fanout_level(results, "ts-sdk", "http", 1000)
    if ts_fan:
        lines.append(f"| ts-sdk http fanout 1000 (s, peak RSS) | 10.3 s, 232 MB | {ts_fan['seconds']:.1f} s, "
                     f"{ts_fan['peak_rss_mb']:.0f} MB |")
    lines.append("")
    # cluster
    layout = results.get("cluster_layout")
    if layout:
        lines += ["### One worker, three workers, and the cross-worker hop", "",
                  "HTTP. 1 worker: one daphne process, in-memory layer. 3 workers: three daphne processes, "
                  "channels-redis on a private Redis, all pinned to the server core. Through the balancer "
                  "(round robin per TCP connection, as a plain load balancer) the initialize POST, the connection "
                  "stream and the session stream land on different workers. The layouts bypass the balancer: "
                  "*same* sends everything to worker A (the same-process fast path); *cross* initializes on A, "
                  "reads both SSE streams through B and POSTs through C, so every POST and every event crosses "
                  "Redis.", "",
                  "| setup | stream msg/s | rtt p50 ms | rtt p99 ms | permission p50 ms | permission p99 ms |",
                  "|---|--:|--:|--:|--:|--:|"]
        rows = [("1 worker (ours, daphne)", results["servers"].get("ours-daphne", {}).get("http", {})),
                ("3 workers + Redis, through the balancer", results["servers"].get("ours-3w-redis", {}).get("http",
                                                                                                         {})),
                ("3 workers, all on worker A (same process)", layout.get("same", {})),
                ("3 workers, initialize A / SSE B / POST C (cross)", layout.get("cross", {}))]
        for name, entry in rows:
            if not entry or "error" in entry:
                lines.append(f"| {name} | {entry.get('error', '—') if entry else '—'} | | | | |")
                continue
            lines.append(f"| {name} | {med(entry['stream']):,.0f} | {entry['rtt']['p50']:.2f} | "
                         f"{entry['rtt']['p99']:.2f} | {entry['permission']['p50']:.2f} | "
                         f"{entry['permission']['p99']:.2f} |")
        same, cross = layout.get("same", {}), layout.get("cross", {})
        if same and cross and "error" not in same and "error" not in cross:
            hop = cross["rtt"]["p50"] - same["rtt"]["p50"]
            lines += ["", f"Cost of the hop: rtt p50 +{hop:.2f} ms per echo turn (one POST and two events cross), "
                          f"p99 +{cross['rtt']['p99'] - same['rtt']['p99']:.2f} ms; streaming "
                          f"{med(cross['stream']) / med(same['stream']):.2f}× the same-process rate."]
        lines.append("")
    lines += ["### Versions", "", "| component | version |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in meta["versions"].items()]
    lines += ["", "![benchmark chart](results.png)", ""]
    notes = HERE / "PROFILE.md"
    if notes.exists():
        lines += [notes.read_text().rstrip(), ""]
    return "\n".join(lines)


def chart(results: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "matplotlib"], check=True)
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = [key for key in [*OURS, *PEERS] if key in results["servers"]]
    names = [label(results, key).replace(", ", "\n", 1).replace(" + ", "\n+ ") for key in servers]
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    colors = {"http": "#3b75af", "ws": "#ef8636"}
    width = 0.38
    xs = range(len(servers))

    def bars(ax: Any, metric: str, field: str, title: str, ylabel: str) -> None:
        for offset, transport in ((-width / 2, "http"), (width / 2, "ws")):
            raw = [get(results, key, transport, metric, field) for key in servers]
            values = [v or 0 for v in raw]
            rects = ax.bar([x + offset for x in xs], values, width, label="HTTP+SSE" if transport == "http" else
                           "WebSocket", color=colors[transport])
            ax.bar_label(rects, labels=["failed" if v is None else f"{v:,.0f}" if metric == "stream" else f"{v:.2f}"
                                        for v in raw], fontsize=7, padding=2, color="black")
        ax.set_xticks(list(xs), names, fontsize=8)
        ax.set_ylim(top=ax.get_ylim()[1] * 1.12)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)

    bars(axes[0][0], "stream", "p50", "stream: messages/s (higher is better)", "messages/s")
    inproc = get(results, "inprocess-sdk", "-", "stream")
    if inproc:
        axes[0][0].set_ylim(top=max(axes[0][0].get_ylim()[1], inproc * 1.12))
        axes[0][0].axhline(inproc, color="grey", linestyle="--", linewidth=1)
        axes[0][0].text(-0.4, inproc, f"in-process limit: the Python SDK agent alone, {inproc:,.0f}", ha="left",
                        va="bottom", fontsize=8, color="grey")
    bars(axes[0][1], "rtt", "p50", "rtt: echo prompt p50, ms (lower is better)", "ms")
    bars(axes[1][0], "permission", "p50", "permission round trip p50, ms (lower is better)", "ms")
    ax = axes[1][1]
    top = max(results["meta"]["sizes"]["fanout"])
    for offset, transport in ((-width / 2, "http"), (width / 2, "ws")):
        levels = [fanout_level(results, key, transport, top) for key in servers]
        values = [level["seconds"] if level else 0 for level in levels]
        rects = ax.bar([x + offset for x in xs], values, width, color=colors[transport],
                       label="HTTP+SSE" if transport == "http" else "WebSocket")
        for rect, level in zip(rects, levels, strict=True):
            if level and level["completed"] != top:  # failed clients: hatched, count in the label
                rect.set_hatch("///")
                rect.set_alpha(0.5)
        ax.bar_label(rects, labels=[f"{level['seconds']:.1f}s\n{level['peak_rss_mb']:.0f}MB"
                                    + ("" if level["completed"] == top else f"\n{level['completed']}/{top} ok")
                                    if level else "" for level in levels], fontsize=7, padding=2)
    ax.set_xticks(list(xs), names, fontsize=8)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.15)
    ax.set_title(f"fanout: {top} concurrent clients, wall time s and peak RSS (lower is better)")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8)
    meta = results["meta"]
    fig.suptitle(f"acp_channels vs the official ACP SDK servers — {meta['date']}, {meta['machine']['nproc']} × "
                 f"{meta['machine']['cpu']}, server and load generator on one core each", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results.json"
    write(json.loads(source.read_text()), HERE)
