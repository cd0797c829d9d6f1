"""HttpClient's HTTP/2 options, without a server: what is refused, what is chosen by default,
and that the fair HTTP/2 transport stands aside when httpcore is not what it expects."""

from __future__ import annotations

import ssl

import httpx
import pytest

from acp_channels.client import HttpClient
from acp_channels.client import _h2_transport as h2_transport
from acp_channels.client import _transport_http as transport_http
from acp_channels.client._errors import ClientUsageError
from acp_channels.client._tls import h2_available, tls_context


def pool_of(client: HttpClient) -> httpx.AsyncBaseTransport:
    transport = client.transport
    assert isinstance(transport, transport_http.HttpTransport)
    return transport.http._transport


def test_h2_is_offered_by_default_when_the_h2_package_is_installed() -> None:
    assert h2_available()
    client = HttpClient("https://127.0.0.1:1/acp")
    assert h2_transport.is_fair(pool_of(client))
    assert client.http_version is None  # nothing answered yet


def test_http2_false_uses_the_plain_transport() -> None:
    assert not h2_transport.is_fair(pool_of(HttpClient("https://127.0.0.1:1/acp", http2=False)))


def test_http2_true_without_the_h2_package_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_http, "h2_available", lambda: False)
    with pytest.raises(ClientUsageError, match=r"acp-channels\[http2\]"):
        HttpClient("https://127.0.0.1:1/acp", http2=True)
    # The default then is HTTP/1.1, not an error.
    assert not h2_transport.is_fair(pool_of(HttpClient("https://127.0.0.1:1/acp")))


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("ws://127.0.0.1:1/acp", {"http2": True}),
        ("https://127.0.0.1:1/acp", {"http2": True, "http_client": "given"}),
        ("https://127.0.0.1:1/acp", {"verify": False, "http_client": "given"}),
        ("https://127.0.0.1:1/acp", {"verify": "/nonexistent/ca.pem"}),
        ("https://127.0.0.1:1/acp", {"verify": 3}),
    ],
)
def test_options_that_cannot_apply_are_refused(url: str, options: dict[str, object]) -> None:
    if options.get("http_client") == "given":
        options = {**options, "http_client": httpx.AsyncClient()}
    with pytest.raises(ClientUsageError):
        HttpClient(url, **options)  # type: ignore[arg-type]


def test_tls_context_choices(tmp_path: object) -> None:
    assert tls_context(True).verify_mode == ssl.CERT_REQUIRED
    insecure = tls_context(False)
    assert (insecure.verify_mode, insecure.check_hostname) == (ssl.CERT_NONE, False)
    given = ssl.create_default_context()
    assert tls_context(given) is given


def test_fair_transport_stands_aside_when_httpcore_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(h2_transport, "_compatible", lambda: False)
    transport = h2_transport.fair_h2_transport(http2=True)
    assert isinstance(transport, httpx.AsyncHTTPTransport)
    assert not h2_transport.is_fair(transport)
