"""TLS and HTTP/2 choices shared by the HTTP and WebSocket transports."""

from __future__ import annotations

import importlib.util
import ssl

from ._errors import ClientUsageError


def tls_context(verify: ssl.SSLContext | str | bool) -> ssl.SSLContext:
    """The context checking a server's certificate: `True` the system's CAs, a string a CA file
    (a self-signed certificate trusted as its own CA), `False` no check at all (tests only:
    anyone on the path can then read and change the traffic), or a context as given."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    if verify is True:
        return ssl.create_default_context()
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if isinstance(verify, str):
        try:
            return ssl.create_default_context(cafile=verify)
        except (OSError, ssl.SSLError) as exc:
            raise ClientUsageError(f"verify: cannot load the CA file {verify!r}: {exc}") from exc
    raise ClientUsageError("verify is True, False, a CA file path or an ssl.SSLContext")


def h2_available() -> bool:
    """Whether the `h2` package (the http2 extra) is installed: httpx needs it for HTTP/2."""
    return importlib.util.find_spec("h2") is not None
