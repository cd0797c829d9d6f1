"""`include("acp_channels.urls")`: the endpoint is exactly `acp` (no slash, so APPEND_SLASH never
redirects it); the view is CSRF-exempt. Next to it: `acp/sessions` (the session directory,
docs/shared-sessions.md), `acp/tickets` (WebSocket tickets, docs/authentication.md), `health`
(liveness), `ready` (readiness) and `metrics` (Prometheus; 404 unless ACP_CHANNELS["METRICS"] is on)."""

from django.urls import path

from acp_channels import _probes as probes
from acp_channels import oauth
from acp_channels._cors import ENDPOINT_URL_NAME
from acp_channels._directory import sessions_endpoint
from acp_channels._tickets import URL_NAME as TICKETS_URL_NAME
from acp_channels._tickets import tickets_endpoint
from acp_channels._views import acp_endpoint, health

urlpatterns = [
    path("acp", acp_endpoint, name=ENDPOINT_URL_NAME),
    path("acp/sessions", sessions_endpoint, name="acp-sessions"),
    path("acp/tickets", tickets_endpoint, name=TICKETS_URL_NAME),
    # RFC 9728 metadata (acp_channels.oauth; 404 unless OAuth is configured).
    path(".well-known/oauth-protected-resource", oauth.metadata, name=oauth.METADATA_URL_NAME),
    path(".well-known/oauth-protected-resource/<path:suffix>", oauth.metadata),
    path("health", health, name="acp-health"),
    path("ready", probes.ready, name="acp-ready"),
    path("metrics", probes.metrics, name="acp-metrics"),
]
