from __future__ import annotations

from django.apps import AppConfig


class TokensConfig(AppConfig):
    name = "acp_channels.tokens"
    label = "acp_tokens"
    verbose_name = "ACP tokens"
    default_auto_field = "django.db.models.BigAutoField"
