"""The command form of the `AGENT` setting: what is wrong with it (system checks), what it
becomes for one connection (its `configure` callable laid over it), and the agent's environment.
"""

from __future__ import annotations

import inspect
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from acp_channels._identity import AgentContext

#: Set in every agent's environment: the connection it serves (for its logs, and to find it).
CONNECTION_ENV: Final = "ACP_CHANNELS_CONNECTION_ID"
#: Set in the environment of every agent started from the setting: whom it serves, as the
#: principal's kind and id (stable identifiers; the display name is neither unique nor safe).
PRINCIPAL_KIND_ENV: Final = "ACP_CHANNELS_PRINCIPAL_KIND"
PRINCIPAL_ID_ENV: Final = "ACP_CHANNELS_PRINCIPAL_ID"
#: Variables passed through from the server's environment when the setting names none.
DEFAULT_ENV_PASSTHROUGH: Final = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TMPDIR",
    "TZ",
)
SETTING_KEYS: Final = ("command", "cwd", "env_passthrough", "env", "configure")
#: What a `configure` callable may return, each replacing (`env`: merged over) the setting's.
CONFIGURE_KEYS: Final = ("command", "cwd", "env")


class AgentConfigurationError(Exception):
    """The `configure` callable of a stdio agent failed or returned something unusable: the
    connection is refused (nothing was started)."""

    __module__ = "acp_channels._agents.stdio"  # its public name, as tracebacks and logs print it


def setting_problems(spec: Mapping[str, Any]) -> list[str]:
    """What is wrong with a command-form AGENT setting (empty when it can be started)."""
    problems = [f"unknown key {key!r} (known: {', '.join(SETTING_KEYS)})" for key in spec if key not in SETTING_KEYS]
    command = spec.get("command")
    command_ok = isinstance(command, list | tuple) and all(isinstance(arg, str) for arg in command)
    program: str = command[0] if command_ok and command else ""
    if not program:
        problems.append("'command' must be a non-empty list of strings (the program and its arguments)")
    cwd = spec.get("cwd")
    if cwd is not None and not (isinstance(cwd, str | Path) and Path(cwd).is_dir()):
        problems.append(f"'cwd' must be None or an existing directory, not {cwd!r}")
        cwd = None
    passthrough = spec.get("env_passthrough", DEFAULT_ENV_PASSTHROUGH)
    if not (isinstance(passthrough, list | tuple) and all(isinstance(name, str) for name in passthrough)):
        problems.append("'env_passthrough' must be a list of environment variable names")
    extra = spec.get("env", {})
    if not _string_mapping(extra):
        problems.append("'env' must be a dict of strings to strings")
    if spec.get("configure") is not None and (problem := configure_problem(spec["configure"])):
        problems.append(problem)
    if program and not problems:
        if resolve_program(program, cwd, agent_environment(spec)) is None:
            where = "as a file" if os.sep in program else "on the agent's PATH"
            problems.append(f"the program {program!r} was not found {where} (or is not executable)")
    return problems


def configure_problem(path: object) -> str | None:
    """What is wrong with the `configure` key: it must name a sync callable taking the context."""
    if not isinstance(path, str) or not path:
        return f"'configure' must be the dotted path of a callable, not {path!r}"
    from django.utils.module_loading import import_string

    try:
        configure = import_string(path)
    except Exception as error:  # ImportError, or the module itself failing to import
        return f"'configure' = {path!r} cannot be imported: {error}"
    if not callable(configure):
        return f"'configure' = {path!r} is not callable"
    if inspect.iscoroutinefunction(configure):
        return f"'configure' = {path!r} is async: it is called synchronously, as the connection is created"
    try:
        signature = inspect.signature(configure)
    except (TypeError, ValueError):
        return None  # no signature to read: trusted
    try:
        signature.bind(None)
    except TypeError:
        return f"'configure' = {path!r} must take exactly one argument, the connection's AgentContext"
    return None


def configured_setting(spec: Mapping[str, Any], context: AgentContext) -> dict[str, Any]:
    """The command form for one connection: the setting with what its `configure` callable
    returned for `context` laid over it (`command` and `cwd` replaced, `env` merged over).

    AgentConfigurationError when `configure` raises or returns something that cannot be started
    (checked as the setting is, program included), before any process exists.
    """
    setting = {key: value for key, value in spec.items() if key != "configure"}
    path = spec.get("configure")
    if path is None:
        return setting
    from django.utils.module_loading import import_string

    where = f"the stdio agent's 'configure' {path!r}, for connection {context.connection_id} ({context.principal}),"
    try:
        configured = import_string(path)(context)
    except Exception as error:
        raise AgentConfigurationError(f"{where} failed: {error!r}") from error
    if not isinstance(configured, Mapping):
        raise AgentConfigurationError(
            f"{where} returned {type(configured).__name__}, not a mapping of {', '.join(CONFIGURE_KEYS)}"
        )
    problems = [
        f"unknown key {key!r} (known: {', '.join(CONFIGURE_KEYS)})" for key in configured if key not in CONFIGURE_KEYS
    ]
    env = configured.get("env", {})
    if not _string_mapping(env):
        problems.append("'env' must be a dict of strings to strings")
    if not problems:
        setting.update((key, configured[key]) for key in ("command", "cwd") if key in configured)
        setting["env"] = {**(setting.get("env") or {}), **env}
        problems = setting_problems(setting)
    if problems:
        raise AgentConfigurationError(f"{where} returned an unusable configuration: {'; '.join(problems)}")
    return setting


def agent_environment(spec: Mapping[str, Any], context: AgentContext | None = None) -> dict[str, str]:
    """The agent's whole environment: the allowlisted server variables, then `env`, then ours
    (the connection and its principal, last so that nothing configured can forge them)."""
    passthrough = spec.get("env_passthrough", DEFAULT_ENV_PASSTHROUGH)
    env = {name: os.environ[name] for name in passthrough if name in os.environ}
    env.update(spec.get("env") or {})
    if context is not None:
        env[CONNECTION_ENV] = context.connection_id
        env[PRINCIPAL_KIND_ENV] = context.principal.kind
        env[PRINCIPAL_ID_ENV] = context.principal.id
    return env


def _string_mapping(value: object) -> bool:
    return isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def resolve_program(program: str, cwd: str | Path | None, env: Mapping[str, str]) -> str | None:
    """Where the program is, as the child will look for it: a path relative to `cwd`, or a name
    searched on the child's PATH."""
    if os.sep in program:
        path = Path(cwd or ".") / program
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which(program, path=env.get("PATH", os.defpath))
