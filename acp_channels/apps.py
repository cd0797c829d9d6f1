from django.apps import AppConfig


class AcpChannelsConfig(AppConfig):
    name = "acp_channels"
    verbose_name = "ACP Channels"

    def ready(self) -> None:
        # checks register themselves; cluster_admin registers its ops on the worker bus,
        # metrics_collector its scrape-time gauges on prometheus_client's registry
        from acp_channels import checks, cluster_admin, daphne_compat, metrics_collector  # noqa: F401

        daphne_compat.install()
        _skip_database_request_hooks()
        from acp_channels.cors import enable_cors_for_acp

        try:
            from corsheaders.signals import check_request_enabled
        except ImportError:  # checks.py reports it when CORS is configured
            return
        check_request_enabled.connect(enable_cors_for_acp, dispatch_uid="acp_channels.cors")


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
