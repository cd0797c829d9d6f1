from django.apps import AppConfig


class AcpChannelsConfig(AppConfig):
    name = "acp_channels"
    verbose_name = "ACP Channels"

    def ready(self) -> None:
        from acp_channels import checks, daphne_compat  # noqa: F401  (checks register themselves)

        daphne_compat.install()
        from acp_channels.cors import enable_cors_for_acp

        try:
            from corsheaders.signals import check_request_enabled
        except ImportError:  # checks.py reports it when CORS is configured
            return
        check_request_enabled.connect(enable_cors_for_acp, dispatch_uid="acp_channels.cors")
