from django.apps import AppConfig


class AcpChannelsConfig(AppConfig):
    name = "acp_channels"
    verbose_name = "ACP Channels"

    def ready(self) -> None:
        # checks and startup register their system checks; cluster_admin registers its ops on
        # the worker bus, metrics_collector its scrape-time gauges on prometheus_client's
        # registry. daphne's patches are not installed here (every manage.py command runs this):
        # only when daphne serves (acp_channels._patches, "When").
        from acp_channels import _checks as checks  # noqa: F401
        from acp_channels import _directory  # noqa: F401  (answers _acp-channels/sessions/list)
        from acp_channels._oauth_checks import check_oauth  # noqa: F401  (the OAuth settings' system checks)
        from acp_channels._tickets import check_tickets  # noqa: F401  (WebSocket tickets' system checks)

        _skip_database_request_hooks()
        from acp_channels import _logs as logs

        logs.install()  # refusals a client caused: INFO, not WARNING or ERROR
        _import_the_agent()
        from acp_channels._cors import enable_cors_for_acp

        try:
            from corsheaders.signals import check_request_enabled
        except ImportError:  # _checks.py reports it when CORS is configured
            return
        check_request_enabled.connect(enable_cors_for_acp, dispatch_uid="acp_channels._cors")


def _import_the_agent() -> None:
    """Import the agent's code now, not at the first connection: importing an SDK agent (the
    `acp` SDK, pydantic models) takes seconds on a busy core, and a burst of WebSocket upgrades
    waiting behind it outlives daphne's handshake timeout (5 s by default: 403, or a reset).
    The SDK adapter comes too when the agent's code uses the SDK; a stdio or frame-level agent
    does without it (0.7 s of CPU and its memory saved per process). A setting that does not
    import is left to the system checks."""
    import contextlib
    import sys

    from django.utils.module_loading import import_string

    from acp_channels._conf import acp_settings

    agent = acp_settings.AGENT
    with contextlib.suppress(Exception):
        if isinstance(agent, str) and agent:
            import_string(agent)
        if "acp" in sys.modules:
            import acp_channels._agents.sdk  # noqa: F401


def _skip_database_request_hooks() -> None:
    """Without databases, django.db's request_started/finished receivers have nothing to do, yet
    under ASGI each sync receiver call hops to a thread of the request's ThreadSensitiveContext,
    and that thread then lives as long as the response: every open SSE stream would hold an OS
    thread. Disconnect them when no database is configured."""
    from django.conf import settings

    # Django turns an empty DATABASES into one "dummy" backend before apps are ready.
    engines = {database.get("ENGINE") for database in settings.DATABASES.values()}
    if engines - {"django.db.backends.dummy"}:
        return
    from django.core import signals
    from django.db import close_old_connections, reset_queries

    signals.request_started.disconnect(reset_queries)
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
