"""Experiment, not a recommended deployment: the demo application as it was before resumable
streams, as near as configuration gets: no `id:` line on SSE events and no replay window.

`views.sse_body` names each event through `event_id(tag, seq)`, looked up in the views module
at call time; returning None there makes `protocol.sse_event` write no id line. The window
settings are 0 (the variant's environment sets them too). What stays: the per-stream counters
(one integer per batch), which resumption needs and this module cannot remove.
`python -m bench.resume_cost` compares this with the default and with ids but no window.
"""

from __future__ import annotations

import os

os.environ["ACP_REPLAY_WINDOW_EVENTS"] = "0"
os.environ["ACP_REPLAY_WINDOW_BYTES"] = "0"

from acp_channels import _views as views
from acp_channels._conf import acp_settings
from demo_project.asgi import application


def no_event_id(tag: str, seq: int) -> None:
    """In place of `protocol.event_id`: no id, so no `id:` line."""
    return None


views.event_id = no_event_id  # type: ignore[assignment]

if acp_settings.REPLAY_WINDOW_EVENTS or acp_settings.REPLAY_WINDOW_BYTES:
    raise RuntimeError("the replay window settings were read before this module set them to 0")

__all__ = ["application"]
