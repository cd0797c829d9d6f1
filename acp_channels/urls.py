"""`include("acp_channels.urls")`: the endpoint is exactly `acp` (no slash, so APPEND_SLASH never
redirects it); the view is CSRF-exempt."""

from django.urls import path

from acp_channels.cors import ENDPOINT_URL_NAME
from acp_channels.views import acp_endpoint, health

urlpatterns = [
    path("acp", acp_endpoint, name=ENDPOINT_URL_NAME),
    path("health", health, name="acp-health"),
]
