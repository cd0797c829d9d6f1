"""The demo logs in UTC, whatever the machine's time zone: served by daphne with TZ set to
UTC+05:45, its lines (ours, ISO 8601 with a Z, and daphne's own) carry the UTC time. Before,
they carried the time of Django's default TIME_ZONE, America/Chicago, with no zone marker."""

from __future__ import annotations

import logging
import re
import subprocess
import time
from datetime import UTC, datetime, timedelta

import httpx

from demo_project.settings import LOGGING, UtcFormatter
from tests.live import DaphneServer

#: UTC+05:45 (Nepal) in POSIX form: no tz database needed, and no whole-hour offset to hide in.
ZONE = "NPT-5:45"
OURS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) INFO +acp_channels\.audit connection opened ")
DAPHNE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d{3} INFO +Listening on TCP address ")
SLACK = timedelta(seconds=5)


def test_the_demo_formatter_writes_utc_with_a_z() -> None:
    assert LOGGING["formatters"]["plain"]["()"] is UtcFormatter
    record = logging.LogRecord("acp_channels", logging.INFO, __file__, 1, "hello", None, None)
    record.created, record.msecs = 86400 + 3723.25, 250.0  # 1970-01-02 01:02:03.250 UTC
    formatter = UtcFormatter(fmt=LOGGING["formatters"]["plain"]["fmt"])
    assert formatter.format(record) == "1970-01-02T01:02:03.250Z INFO     acp_channels hello"


def test_the_demo_logs_in_utc_under_another_time_zone() -> None:
    offset = subprocess.run(["date", "+%z"], env={"TZ": ZONE}, capture_output=True, text=True, check=True)
    assert offset.stdout.strip() == "+0545"  # the zone the server runs in is not UTC
    started = datetime.now(UTC)
    server = DaphneServer(env={"TZ": ZONE}).start()
    try:
        reply = httpx.post(
            server.url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
        )
        assert reply.status_code == 200, reply.text
        deadline = time.monotonic() + 10
        while not any(OURS.match(line) for line in server.log) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.stop()
    ended = datetime.now(UTC)
    ours = [match.group(1) for line in server.log if (match := OURS.match(line))]
    daphne = [match.group(1) for line in server.log if (match := DAPHNE.match(line))]
    assert ours and daphne, "".join(server.log)
    for stamp in (
        datetime.strptime(ours[0], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC),
        datetime.strptime(daphne[0], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC),
    ):
        assert started - SLACK <= stamp <= ended + SLACK, (stamp, started, ended)
