"""ASGI wiring: the WebSocket routes, and a one-call application for a project's asgi.py."""

from __future__ import annotations

from typing import Any

from django.urls import path, re_path

from acp_channels._consumers import AcpWebsocketConsumer
from acp_channels._limits import BodyLimit

#: Mount next to `include("acp_channels.urls")` at the same prefix.
websocket_urlpatterns = [path("acp", AcpWebsocketConsumer.as_asgi())]


async def refuse_websocket(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An upgrade to a path nothing serves: refused before accept (the server answers 403).
    Without it channels' URLRouter raises, and the client gets a 500."""
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close"})


def build_asgi_application(*, websocket_prefix: str = "", http_application: Any = None, checks: bool = True) -> Any:
    """HTTP through Django (POST/SSE/DELETE), WebSocket upgrades on the same path to our consumer.

    Call it after `os.environ.setdefault("DJANGO_SETTINGS_MODULE", ...)`; `websocket_prefix`
    matches the prefix under which `acp_channels.urls` is included (e.g. "agents/"). The HTTP
    application is wrapped in `limits.BodyLimit`: the ACP endpoint refuses an over-limit body
    (413) before Django spools it, whatever the server.

    The default HTTP application is Django's, through `acp_channels._handler.AcpASGIHandler`
    (requests start an OS thread only when one of their calls needs it).

    A site with Django sessions and logged-in users (`auth.session_auth_configured()`) gets
    channels' AuthMiddlewareStack on WebSocket upgrades, so `scope["user"]` is the session's
    user (the Django-user authenticator needs it). A site without (token auth, no database,
    like the demo) does not: no session lookup per upgrade.

    It fails at startup, not per request: the system checks run here (servers do not run them),
    those that reach the channel layer and the database too, and an error raises
    ImproperlyConfigured with the checks' text (`startup.run_startup_checks`; `checks=False`
    skips them). Under daphne, it has daphne's patches installed as daphne starts serving
    (`daphne_compat.install`; acp_channels._patches lists them).
    """
    import django
    from channels.routing import ProtocolTypeRouter, URLRouter
    from django.apps import apps
    from django.urls import include

    from acp_channels import _daphne_compat as daphne_compat
    from acp_channels._handler import AcpASGIHandler
    from acp_channels.auth import session_auth_configured

    if http_application is None or not apps.ready:
        django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application does
    if http_application is None:
        http_application = AcpASGIHandler()
    if checks:
        from acp_channels._startup import run_startup_checks

        run_startup_checks()
    daphne_compat.install()
    http: Any = http_application
    routes = [path(websocket_prefix, include(websocket_urlpatterns))] if websocket_prefix else [*websocket_urlpatterns]
    routes.append(re_path(r"", refuse_websocket))  # type: ignore[arg-type]  # an ASGI app, as channels routes take
    websocket: Any = URLRouter(routes)
    if session_auth_configured():
        from channels.auth import AuthMiddlewareStack

        websocket = AuthMiddlewareStack(websocket)
    return ProtocolTypeRouter({"http": BodyLimit(http), "websocket": websocket})
