"""Host any ACP agent program that speaks newline-delimited JSON-RPC on stdin/stdout.

One process per ACP connection. The agent owns JSON-RPC semantics; this adapter only frames and
routes: each client frame becomes one stdin line (its text as it came, so ids, batches and unknown
methods reach the agent byte for byte), and each stdout line becomes one frame, relayed unchanged.

Process hygiene:
- every agent runs in its own session and process group, with `ACP_CHANNELS_CONNECTION_ID` (and,
  started from the setting, `ACP_CHANNELS_PRINCIPAL_KIND`/`_ID`) in its environment; on Linux it
  also dies with the server thread that started it (PR_SET_PDEATHSIG);
- stopping it (close(), or its stdout ending): close stdin, wait `shutdown_grace` seconds, SIGTERM
  to the group, wait again, SIGKILL; asyncio reaps it, so no zombie is left; once the agent is
  gone, whatever is left of its group gets SIGTERM, then SIGKILL after the grace;
- stderr is read all the time into the `acp_channels.agent` logger (long lines truncated, floods
  rate-limited), so a chatty agent never blocks on it;
- an agent that exits on its own first has all its output relayed, then every client request it
  left unanswered gets a -32603 error naming the exit status, then receive() ends; one log line
  tells the exit status;
- at interpreter exit, agents still running get the same stop sequence (an atexit hook).

Backpressure: receive() hands over one line at a time and nothing reads stdout ahead of it beyond
a small buffer, so when the host stops asking (its readers are slow), the pipe fills and the agent
blocks on its own writes. Memory per agent stays bounded by about `max_line_bytes`.

The parts, each importing only those after it: `channel` (`StdioAgentChannel`: frames in and
out, and the requests left unanswered), `setting` (the AGENT setting's command form, checked and
configured per connection, and the agent's environment), `process` (`AgentProcess`: start, stop,
its group, the atexit hook) and `pipes` (the bytes on stdin, stdout and stderr).
"""

from __future__ import annotations

from acp_channels._agents.stdio.channel import StdioAgentChannel
from acp_channels._agents.stdio.pipes import LINE_HEADROOM, READ_CHUNK, STDERR_LINE_MAX, STDERR_LINES_PER_SECOND
from acp_channels._agents.stdio.process import DEFAULT_SHUTDOWN_GRACE, AgentProcess, describe_status, stop_all_at_exit
from acp_channels._agents.stdio.setting import (
    CONFIGURE_KEYS,
    CONNECTION_ENV,
    DEFAULT_ENV_PASSTHROUGH,
    PRINCIPAL_ID_ENV,
    PRINCIPAL_KIND_ENV,
    SETTING_KEYS,
    AgentConfigurationError,
    agent_environment,
    configure_problem,
    configured_setting,
    resolve_program,
    setting_problems,
)

__all__ = [
    "CONFIGURE_KEYS",
    "CONNECTION_ENV",
    "DEFAULT_ENV_PASSTHROUGH",
    "DEFAULT_SHUTDOWN_GRACE",
    "LINE_HEADROOM",
    "PRINCIPAL_ID_ENV",
    "PRINCIPAL_KIND_ENV",
    "READ_CHUNK",
    "SETTING_KEYS",
    "STDERR_LINES_PER_SECOND",
    "STDERR_LINE_MAX",
    "AgentConfigurationError",
    "AgentProcess",
    "StdioAgentChannel",
    "agent_environment",
    "configure_problem",
    "configured_setting",
    "describe_status",
    "resolve_program",
    "setting_problems",
    "stop_all_at_exit",
]
