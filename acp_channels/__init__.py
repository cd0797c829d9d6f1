"""acp-channels: serve Agent Client Protocol agents over HTTP+SSE and WebSocket from Django.

The public names of the server side are importable from here (docs/api.md lists them with what
they promise); the client is `acp_channels.client`. Modules whose names start with an underscore
are internal. Names load on first use, so importing this package (in settings, say) imports
nothing of Django's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_PUBLIC = {
    "ANONYMOUS": "acp_channels._identity",
    "AgentContext": "acp_channels._identity",
    "Principal": "acp_channels._identity",
    "TransportKind": "acp_channels._identity",
    "RequestContext": "acp_channels.auth",
    "Refused": "acp_channels.auth",
    "bearer_token": "acp_channels.auth",
    "django_user": "acp_channels.auth",
    "settings_tokens": "acp_channels.auth",
    "AgentChannel": "acp_channels._agents.channel",
    "AgentClosed": "acp_channels._agents.channel",
    "CONNECTION_ENV": "acp_channels._agents.stdio",
    "PRINCIPAL_ID_ENV": "acp_channels._agents.stdio",
    "PRINCIPAL_KIND_ENV": "acp_channels._agents.stdio",
    "build_asgi_application": "acp_channels._routing",
    "websocket_urlpatterns": "acp_channels._routing",
    "ACP_ALLOW_HEADERS": "acp_channels._cors",
    "ACP_ALLOW_METHODS": "acp_channels._cors",
    "ACP_EXPOSE_HEADERS": "acp_channels._cors",
    "cors_allow_headers": "acp_channels._cors",
    "RedisChannelLayer": "acp_channels.layers",
    "AcpASGIHandler": "acp_channels._handler",
    "BodyLimit": "acp_channels._limits",
    "settings_from_environment": "acp_channels._conf",
}

__all__ = [
    "ACP_ALLOW_HEADERS",
    "ACP_ALLOW_METHODS",
    "ACP_EXPOSE_HEADERS",
    "ANONYMOUS",
    "CONNECTION_ENV",
    "PRINCIPAL_ID_ENV",
    "PRINCIPAL_KIND_ENV",
    "AcpASGIHandler",
    "AgentChannel",
    "AgentClosed",
    "AgentContext",
    "BodyLimit",
    "Principal",
    "RedisChannelLayer",
    "Refused",
    "RequestContext",
    "TransportKind",
    "__version__",
    "bearer_token",
    "build_asgi_application",
    "cors_allow_headers",
    "django_user",
    "settings_from_environment",
    "settings_tokens",
    "websocket_urlpatterns",
]

if TYPE_CHECKING:
    from acp_channels._agents.channel import AgentChannel, AgentClosed
    from acp_channels._agents.stdio import CONNECTION_ENV, PRINCIPAL_ID_ENV, PRINCIPAL_KIND_ENV
    from acp_channels._conf import settings_from_environment
    from acp_channels._cors import ACP_ALLOW_HEADERS, ACP_ALLOW_METHODS, ACP_EXPOSE_HEADERS, cors_allow_headers
    from acp_channels._handler import AcpASGIHandler
    from acp_channels._identity import ANONYMOUS, AgentContext, Principal, TransportKind
    from acp_channels._limits import BodyLimit
    from acp_channels._routing import build_asgi_application, websocket_urlpatterns
    from acp_channels.auth import Refused, RequestContext, bearer_token, django_user, settings_tokens
    from acp_channels.layers import RedisChannelLayer


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'acp_channels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
