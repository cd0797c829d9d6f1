"""A configuration that cannot serve fails daphne's start, with the system check's id and text
on its stderr, instead of starting and answering every request with a 500
(acp_channels._startup, run by `build_asgi_application` as daphne imports the demo's asgi module):
a channel layer whose backend does not import (the Redis layer without the `redis` extra among
them), a Redis that cannot be reached, an authenticator or a token lookup that does not import,
and a REQUIRED_PERMISSION that does not exist. The demo and a permission only the database
holds still start.

Each start is a real `daphne` process, awaited until it exits or logs that it listens (an
event: its stderr's lines as they come, never a sleep)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster import RedisServer
from tests.live import LISTENING, ROOT

#: daphne's CLI, run as `python -m daphne` is (the prelude first, where a test needs one).
DAPHNE = "{prelude}\nfrom daphne.cli import CommandLineInterface\nCommandLineInterface.entrypoint()\n"
#: An interpreter without redis-py and msgpack, as a site that did not install the `redis` extra.
WITHOUT_THE_REDIS_EXTRA = """
import sys
class WithoutTheRedisExtra:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("redis", "msgpack"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, WithoutTheRedisExtra())
"""
#: How long a refused start may take: the imports of a busy machine, nothing waited for.
QUICKLY = 30.0


@dataclass
class Start:
    served: bool
    returncode: int | None
    log: str
    seconds: float


def start(env: dict[str, str], prelude: str = "") -> Start:
    """daphne on the demo's asgi module with `env`, until it exits, or it listens (then it is
    stopped at once: `served`)."""
    environment = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "demo_project.settings",
        **env,
    }
    argv = [
        sys.executable, "-c", DAPHNE.format(prelude=prelude),
        "-e", "tcp:port=0:interface=127.0.0.1",
        "demo_project.asgi:application",
    ]  # fmt: skip
    began = time.monotonic()
    process = subprocess.Popen(
        argv, cwd=ROOT, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stderr is not None
    lines: list[str] = []
    served = False
    for line in process.stderr:
        lines.append(line)
        if LISTENING.search(line):
            served = True
            process.terminate()
            break
    returncode = process.wait(30)
    process.stderr.close()
    return Start(served, None if served else returncode, "".join(lines), time.monotonic() - began)


def assert_refused(started: Start, *texts: str) -> None:
    assert not started.served, started.log
    assert started.returncode not in (None, 0), started.log
    assert started.seconds < QUICKLY, started.seconds
    assert "acp_channels: the system checks found errors; fix them before serving:" in started.log, started.log
    missing = [text for text in texts if text not in started.log]
    assert missing == [], started.log


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    server = RedisServer.shared_or_private()
    yield server
    server.stop()


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound but never listening: a connection to it is refused at once."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]


# -- what still starts --------------------------------------------------------------------------


def test_the_demo_starts() -> None:
    assert start({}).served


def test_the_demo_on_redis_starts(redis: RedisServer) -> None:
    """The layer's probe reaches it (E037 not raised) and the start goes on."""
    assert start({"REDIS_URL": redis.url}).served


# -- the channel layer --------------------------------------------------------------------------


def test_a_layer_backend_that_does_not_import(database: Path) -> None:
    started = start(startup_site(database, ACP_TEST_LAYER_BACKEND="tests.nowhere.ChannelLayer"))
    assert_refused(
        started,
        "(acp_channels.E036) CHANNEL_LAYERS['default']['BACKEND'] = 'tests.nowhere.ChannelLayer' cannot be imported: "
        "No module named 'tests.nowhere'",
        "HINT: BACKEND must be the dotted path of a channel layer class that imports.",
    )


def test_the_redis_layer_without_the_redis_extra(redis: RedisServer) -> None:
    """The issue's case: the demo's Redis layer configured, the redis extra not installed."""
    started = start({"REDIS_URL": redis.url}, prelude=WITHOUT_THE_REDIS_EXTRA)
    assert_refused(
        started,
        "(acp_channels.E036) CHANNEL_LAYERS['default']['BACKEND'] = 'acp_channels.layers.RedisChannelLayer' cannot "
        "be imported: No module named 'msgpack'",
        'HINT: Install the redis extra: pip install "acp-channels[redis]" (redis-py and msgpack).',
    )


def test_a_redis_that_cannot_be_reached(closed_port: int) -> None:
    started = start({"REDIS_URL": f"redis://127.0.0.1:{closed_port}/0"})
    assert_refused(
        started,
        "(acp_channels.E037) The channel layer CHANNEL_LAYERS['default'] (acp_channels.layers.RedisChannelLayer) "
        "cannot be reached: ConnectionError",
        f"127.0.0.1:{closed_port}",
    )


# -- authentication -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "text"),
    [
        (
            {"ACP_AUTHENTICATE": "tests.nowhere.authenticate"},
            "(acp_channels.E021) ACP_CHANNELS['AUTHENTICATE'] = 'tests.nowhere.authenticate' cannot be imported",
        ),
        (
            {"ACP_AUTHENTICATE": "acp_channels.auth.bearer_token", "ACP_TOKEN_LOOKUP": "tests.nowhere.lookup"},
            "(acp_channels.E022) ACP_CHANNELS['TOKEN_LOOKUP'] = 'tests.nowhere.lookup' cannot be imported",
        ),
    ],
    ids=["authenticator", "token-lookup"],
)
def test_an_authenticator_or_token_lookup_that_does_not_import(env: dict[str, str], text: str) -> None:
    assert_refused(start(env), text)


# -- REQUIRED_PERMISSION ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests.startup_site's database, migrated, with `auth.use_agent` as a row of its own."""
    path = tmp_path_factory.mktemp("startup") / "db.sqlite3"
    subprocess.run(
        [sys.executable, "-m", "tests.startup_site"],
        cwd=ROOT,
        env={**os.environ, **startup_site(path, ACP_TEST_REQUIRED_PERMISSION="auth.use_agent")},
        check=True,
        timeout=120,
    )
    return path


def startup_site(database: Path, **env: str) -> dict[str, str]:
    return {
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.startup_site",
        "ACP_TEST_DATABASE": str(database),
        **env,
    }


def test_a_permission_of_no_installed_app(database: Path) -> None:
    started = start(startup_site(database, ACP_TEST_REQUIRED_PERMISSION="nosuchapp.use_agent"))
    assert_refused(
        started,
        "(acp_channels.E035) ACP_CHANNELS['REQUIRED_PERMISSION'] = 'nosuchapp.use_agent' is not a permission: "
        "no installed app has the label 'nosuchapp'.",
    )


def test_a_permission_no_model_declares_and_the_database_has_not(database: Path) -> None:
    started = start(startup_site(database, ACP_TEST_REQUIRED_PERMISSION="auth.use_agnet"))
    assert_refused(
        started,
        "(acp_channels.E035) ACP_CHANNELS['REQUIRED_PERMISSION'] = 'auth.use_agnet' is not a permission: no model "
        "of the app 'auth' declares 'use_agnet', and the database 'default' has no such permission.",
    )


def test_a_permission_only_the_database_holds_starts(database: Path) -> None:
    assert start(startup_site(database, ACP_TEST_REQUIRED_PERMISSION="auth.use_agent")).served


def test_a_declared_permission_starts(database: Path) -> None:
    assert start(startup_site(database)).served  # auth.view_user
