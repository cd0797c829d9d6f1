"""The system checks of the channel layer several workers share: its backend imports (E036), it
can carry a burst (W005, E034), it answers (E037, run as a server starts)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from django.utils.module_loading import import_string

from acp_channels import _checks as checks
from acp_channels._checks import check_channel_layer
from acp_channels._startup import check_channel_layer_reachable

URL = "redis://127.0.0.1:6379/0"


def layer(backend: str, **config: Any) -> dict[str, Any]:
    return {"default": {"BACKEND": backend, "CONFIG": {"hosts": [URL], **config}}}


def test_in_memory_and_our_redis_layer_are_clean(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    assert check_channel_layer() == []
    settings.CHANNEL_LAYERS = layer("acp_channels.layers.RedisChannelLayer", pool_size=200, pool_timeout=None)
    assert check_channel_layer() == []
    settings.CHANNEL_LAYERS = {}
    assert check_channel_layer() == []


@pytest.mark.parametrize(
    "backend", ["channels_redis.core.RedisChannelLayer", "channels_redis.pubsub.RedisPubSubChannelLayer"]
)
def test_stock_channels_redis_is_warned_about(settings: Any, backend: str) -> None:
    settings.CHANNEL_LAYERS = layer(backend)
    messages = check_channel_layer()
    assert [m.id for m in messages] == ["acp_channels.W005"]
    assert "MaxConnectionsError" in messages[0].msg
    assert "acp_channels.layers.RedisChannelLayer" in (messages[0].hint or "")


@pytest.mark.parametrize(
    ("config", "count"),
    [
        ({"pool_size": 2}, 1),
        ({"pool_size": "100"}, 1),
        ({"pool_timeout": 0}, 1),
        ({"pool_size": True, "pool_timeout": "x"}, 2),
    ],
)
def test_a_pool_that_cannot_carry_the_inbox_and_calls_is_an_error(
    settings: Any, config: dict[str, Any], count: int
) -> None:
    settings.CHANNEL_LAYERS = layer("acp_channels.layers.RedisChannelLayer", **config)
    assert [m.id for m in check_channel_layer()] == ["acp_channels.E034"] * count


# -- E036: the backend imports ------------------------------------------------------------------


def test_a_backend_that_does_not_import_is_an_error(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "tests.nowhere.ChannelLayer"}}
    messages = check_channel_layer()
    assert [m.id for m in messages] == ["acp_channels.E036"]
    assert "'tests.nowhere.ChannelLayer' cannot be imported: No module named 'tests.nowhere'" in messages[0].msg
    assert "redis extra" not in (messages[0].hint or "")


def test_every_layer_needs_a_backend(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels.layers.InMemoryChannelLayer"},
        "other": {"CONFIG": {}},
    }
    messages = check_channel_layer()
    assert [(m.id, m.msg) for m in messages] == [("acp_channels.E036", "CHANNEL_LAYERS['other'] has no BACKEND.")]


@pytest.mark.parametrize("missing", ["redis", "redis.asyncio", "msgpack"])
def test_a_redis_layer_without_the_redis_extra_says_to_install_it(
    settings: Any, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    """The layer's module imports, but what the `redis` extra installs does not: the message
    names the missing module and the hint the extra (tests/test_startup_live.py starts daphne
    without redis-py and msgpack)."""

    def import_without_the_extra(path: str) -> Any:
        if path == "acp_channels.layers.RedisChannelLayer":
            raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)
        return import_string(path)

    monkeypatch.setattr(checks, "import_string", import_without_the_extra)
    settings.CHANNEL_LAYERS = layer("acp_channels.layers.RedisChannelLayer")
    messages = check_channel_layer()
    assert [m.id for m in messages] == ["acp_channels.E036"]
    assert f"No module named {missing!r}" in messages[0].msg
    assert messages[0].hint == 'Install the redis extra: pip install "acp-channels[redis]" (redis-py and msgpack).'


# -- E037: the default layer answers (a start's check) -----------------------------------------


def test_a_layer_in_this_process_is_not_probed(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    assert check_channel_layer_reachable() == []


def test_a_redis_that_answers_passes(settings: Any) -> None:
    settings.CHANNEL_LAYERS = layer("acp_channels.layers.RedisChannelLayer", prefix="acp-probe-test")
    assert check_channel_layer_reachable() == []


def test_a_redis_that_cannot_be_reached_is_an_error(settings: Any, closed_port: int) -> None:
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "acp_channels.layers.RedisChannelLayer",
            "CONFIG": {"hosts": [f"redis://127.0.0.1:{closed_port}/0"]},
        }
    }
    messages = check_channel_layer_reachable()
    assert [m.id for m in messages] == ["acp_channels.E037"]
    assert f"127.0.0.1:{closed_port}" in messages[0].msg
    assert "cannot be reached: ConnectionError" in messages[0].msg


def test_a_layer_whose_config_it_refuses_is_an_error(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "acp_channels.layers.RedisChannelLayer", "CONFIG": {"hosts": 5}}}
    assert [m.id for m in check_channel_layer_reachable()] == ["acp_channels.E037"]


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound but never listening: a connection to it is refused at once."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]
