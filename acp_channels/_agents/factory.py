"""The agent named by the `AGENT` setting: how a factory is called, and the channel it makes.

An agent factory (the dotted-path form of `AGENT`) learns whom it serves: it is called with the
connection's `AgentContext` when it takes one (see `factory_call`), and with no arguments
otherwise, so factories written before contexts existed keep working. A command (a dict) starts a
stdio agent process per connection instead. The adapters are imported when a connection needs
them, so importing this module (and the package) starts nothing and imports no SDK.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Literal

from acp_channels._agents.channel import AgentChannel
from acp_channels._identity import AgentContext


class FactorySignatureError(TypeError):
    """An agent factory that cannot be called with a connection's context, nor without one."""


#: How a factory is called: `factory(context)`, `factory(context=context)`, or `factory()`.
FactoryCall = Literal["positional", "keyword", "none"]

_CONTEXT_PARAMETER = "context"
_CONTRACT = (
    "an agent factory is called with the connection's AgentContext (its one required positional "
    "argument, or a parameter named 'context') or with no arguments"
)


def factory_call(factory: Callable[..., Any]) -> FactoryCall:
    """How to call an agent factory, from its signature (cached per factory).

    - a parameter named `context` (keyword, or positional) gets the AgentContext by that name;
    - otherwise a required first positional parameter (`lambda context: ...`, `def f(ctx)`) gets
      it positionally;
    - otherwise (no parameters, only optional ones, only `*args`/`**kwargs`, or no signature to
      read) the factory is called with no arguments, exactly as before contexts existed: an
      optional parameter with another name was not written for a context.

    Raises FactorySignatureError when the factory needs other arguments too, or is async (the
    registry creates connections synchronously; an agent can start async work itself).
    """
    try:
        return _cached_factory_call(factory)
    except TypeError as error:
        if isinstance(error, FactorySignatureError):
            raise
        return _factory_call(factory)  # not hashable: inspected each time


def factory_problem(factory: object) -> str | None:
    """Why `factory` cannot serve as an agent factory, for system checks (None: it can)."""
    if not callable(factory):
        return "is not callable"
    try:
        factory_call(factory)
    except FactorySignatureError as error:
        return str(error)
    return None


def call_agent_factory(factory: Callable[..., Any], context: AgentContext) -> Any:
    """The factory's agent for this connection: it is called exactly once, as `factory_call` says."""
    how = factory_call(factory)
    if how == "positional":
        agent = factory(context)
    elif how == "keyword":
        agent = factory(**{_CONTEXT_PARAMETER: context})
    else:
        agent = factory()
    if inspect.isawaitable(agent):  # async __call__ or a wrapper hiding a coroutine function
        if inspect.iscoroutine(agent):
            agent.close()  # never awaited, on purpose: no "was never awaited" warning
        raise FactorySignatureError(f"the agent factory {factory!r} returned an awaitable: {_SYNC_ONLY}")
    return agent


_SYNC_ONLY = "agent factories are called synchronously (start async work inside the agent)"


@functools.lru_cache(maxsize=256)
def _cached_factory_call(factory: Callable[..., Any]) -> FactoryCall:
    return _factory_call(factory)


def _factory_call(factory: Callable[..., Any]) -> FactoryCall:
    if inspect.iscoroutinefunction(factory) or inspect.isasyncgenfunction(factory):
        raise FactorySignatureError(f"is async: {_SYNC_ONLY}")
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return "none"  # no signature to read (some builtins): called as before contexts existed
    parameters = list(signature.parameters.values())
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    named = signature.parameters.get(_CONTEXT_PARAMETER)
    how: FactoryCall
    if named is not None and named.kind in (named.KEYWORD_ONLY, named.POSITIONAL_OR_KEYWORD):
        how, takes = "keyword", named
    elif positional and (positional[0].default is positional[0].empty or positional[0] is named):
        how, takes = "positional", positional[0]
    else:
        how, takes = "none", None
    others = [
        p.name
        for p in parameters
        if p is not takes and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if others:
        listed = ", ".join(repr(name) for name in others)
        raise FactorySignatureError(f"needs the argument(s) {listed}: {_CONTRACT}")
    return how


def create_agent_channel(context: AgentContext) -> AgentChannel:
    """A new agent for one connection, from the `AGENT` setting.

    A command (a dict) starts its own agent process (its `configure` callable, if any, shapes
    the command, directory and environment for this context). A dotted path names a factory
    (called with the context, see `factory_call`) that returns an agent written with the `acp`
    SDK, or an object that already speaks frames (an AgentChannel: it has `send`, `receive` and
    `close`), used as it is.
    """
    from django.utils.module_loading import import_string

    from acp_channels._agents.sdk import SdkAgentChannel
    from acp_channels._conf import acp_settings

    setting = acp_settings.AGENT
    if isinstance(setting, Mapping):
        from acp_channels._agents.stdio import LINE_HEADROOM, StdioAgentChannel

        return StdioAgentChannel.from_setting(
            setting,
            context,
            shutdown_grace=acp_settings.AGENT_SHUTDOWN_GRACE,
            max_line_bytes=acp_settings.MAX_BODY_BYTES + LINE_HEADROOM,
        )
    if setting is None:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured('ACP_CHANNELS["AGENT"] is not set (system check acp_channels.E001)')
    agent = call_agent_factory(import_string(setting), context)
    if all(callable(getattr(agent, name, None)) for name in ("send", "receive", "close")):
        return agent  # type: ignore[no-any-return]
    return SdkAgentChannel(agent)
