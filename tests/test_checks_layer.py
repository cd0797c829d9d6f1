"""The system check of the channel layer several workers share (acp_channels.W005, E034)."""

from __future__ import annotations

from typing import Any

import pytest

from acp_channels.checks import check_channel_layer

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
