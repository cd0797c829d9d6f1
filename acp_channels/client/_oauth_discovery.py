"""Where a server's users sign in: `WWW-Authenticate` challenges, RFC 9728 protected resource
metadata and RFC 8414 authorization server metadata, read and checked for `acp-client login`.

From the endpoint URL to the authorization server: an unauthenticated GET of the endpoint
answers 401 with `Bearer ... resource_metadata="<url>"`; the document there names the resource
and its `authorization_servers`; the first one's issuer gives the RFC 8414 document (the
well-known path inserted before the issuer's path, RFC 8414 §3.1; OpenID discovery as a
fallback). Both documents are checked as the RFCs require: the resource must be the URL asked
for (RFC 9728 §3.3), the issuer the one named (RFC 8414 §3.3), and every endpoint https unless
it is on loopback (RFC 6749 §3.1 and RFC 6749 §3.2).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import httpx

from ._errors import AcpClientError, ClientUsageError
from ._http_client import resolve_endpoint

__all__ = [
    "AuthorizationServer",
    "Challenge",
    "LoginError",
    "ProtectedResource",
    "authorization_server_metadata_urls",
    "canonical_url",
    "discover",
    "parse_challenges",
    "protected_resource_metadata_urls",
    "resource_for",
]

PROTECTED_RESOURCE_WELL_KNOWN: Final = "/.well-known/oauth-protected-resource"
AUTHORIZATION_SERVER_WELL_KNOWN: Final = "/.well-known/oauth-authorization-server"
OPENID_WELL_KNOWN: Final = "/.well-known/openid-configuration"
#: The endpoints of RFC 8414 metadata that `acp-client login` uses.
ENDPOINTS: Final = ("token_endpoint", "authorization_endpoint", "device_authorization_endpoint", "revocation_endpoint")
#: A metadata document larger than this is not one (a page of HTML, a mistake).
MAX_DOCUMENT: Final = 256 * 1024

_TOKEN: Final = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_CHALLENGE_PART: Final = re.compile(
    rf"""\s*(?:
        (?P<name>{_TOKEN})\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>{_TOKEN}))  # auth-param
      | (?P<token68>[A-Za-z0-9\-._~+/]+=*)(?=\s*(?:,|$))                              # token68
      | (?P<scheme>{_TOKEN})                                                          # a new challenge
    )\s*,?""",
    re.VERBOSE,
)


class LoginError(AcpClientError):
    """Signing in failed: discovery, the authorization server's answer, the browser's or the
    user's. The message says what and where, never a token."""


@dataclass(frozen=True)
class Challenge:
    """One challenge of a `WWW-Authenticate` header: the scheme (lower case) and its parameters
    (names lower case)."""

    scheme: str
    params: Mapping[str, str] = field(default_factory=dict)


def parse_challenges(header: str | None) -> list[Challenge]:
    """The challenges of a `WWW-Authenticate` value (several headers joined with commas, as
    httpx joins them, read as one). Lenient: what cannot be read ends the parse."""
    challenges: list[tuple[str, dict[str, str]]] = []
    text = header or ""
    position = 0
    while position < len(text):
        match = _CHALLENGE_PART.match(text, position)
        if match is None or match.end() == position:
            break
        position = match.end()
        if match.group("scheme") is not None:
            challenges.append((match.group("scheme").lower(), {}))
        elif challenges and match.group("name") is not None:
            quoted = match.group("quoted")
            value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else match.group("bare")
            challenges[-1][1].setdefault(match.group("name").lower(), value)
        elif challenges and match.group("token68") is not None:
            challenges[-1][1].setdefault("", match.group("token68"))
    return [Challenge(scheme, params) for scheme, params in challenges]


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def canonical_url(url: str) -> str:
    """`url` in the form RFC 9728 compares: ws(s):// as http(s)://, scheme and host in lower
    case, no default port, no fragment (ClientUsageError when it is no http(s) or ws(s) URL)."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme.lower(), parts.scheme.lower())
    if scheme not in ("http", "https") or not parts.hostname:
        raise ClientUsageError(f"not an http(s):// or ws(s):// URL: {url!r}")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    netloc = host if port is None or port == {"http": 80, "https": 443}[scheme] else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))


def resource_for(url: str) -> str:
    """The resource identifier of the server at `url` as `acp-client` takes it (`/acp`
    appended unless the path ends with it), canonical: the key of a stored login."""
    endpoint, _ = resolve_endpoint(url)
    return canonical_url(endpoint)


def protected_resource_metadata_urls(resource: str) -> list[str]:
    """Where RFC 9728 §3.1 puts a resource's metadata: the well-known path inserted between
    the host and the resource's path, then (for a server that serves it only there) at the
    root of the host."""
    parts = urlsplit(resource)
    path = parts.path.rstrip("/")
    inserted = urlunsplit((parts.scheme, parts.netloc, PROTECTED_RESOURCE_WELL_KNOWN + path, parts.query, ""))
    root = urlunsplit((parts.scheme, parts.netloc, PROTECTED_RESOURCE_WELL_KNOWN, "", ""))
    return list(dict.fromkeys([inserted, root]))


def authorization_server_metadata_urls(issuer: str) -> list[str]:
    """Where an issuer's metadata is: RFC 8414 §3.1 (the well-known path inserted before the
    issuer's path), then OpenID Connect discovery (appended to the issuer, and RFC 8414 §5's
    inserted form of it)."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")
    return list(
        dict.fromkeys(
            [
                urlunsplit((parts.scheme, parts.netloc, AUTHORIZATION_SERVER_WELL_KNOWN + path, "", "")),
                urlunsplit((parts.scheme, parts.netloc, path + OPENID_WELL_KNOWN, "", "")),
                urlunsplit((parts.scheme, parts.netloc, OPENID_WELL_KNOWN + path, "", "")),
            ]
        )
    )


@dataclass(frozen=True)
class ProtectedResource:
    """RFC 9728 metadata of the ACP endpoint."""

    resource: str
    authorization_servers: tuple[str, ...]
    scopes_supported: tuple[str, ...]
    metadata_url: str


@dataclass(frozen=True)
class AuthorizationServer:
    """What `acp-client login` needs of RFC 8414 metadata."""

    issuer: str
    token_endpoint: str
    authorization_endpoint: str | None = None
    device_authorization_endpoint: str | None = None
    revocation_endpoint: str | None = None
    code_challenge_methods: tuple[str, ...] = ()
    metadata_url: str = ""

    @classmethod
    def from_document(cls, document: Any, *, issuer: str, metadata_url: str) -> AuthorizationServer:
        """Check RFC 8414 metadata for `issuer` (LoginError when it does not fit)."""
        if not isinstance(document, dict):
            raise LoginError(f"{metadata_url}: not a JSON object")
        if document.get("issuer") != issuer:
            raise LoginError(
                f"{metadata_url}: its issuer is {document.get('issuer')!r}, not {issuer!r} as the resource "
                "named it (RFC 8414 §3.3): refused"
            )
        endpoints: dict[str, str | None] = {}
        for name in ENDPOINTS:
            value = document.get(name)
            if value is not None:
                _check_url(value, f"{metadata_url}: {name}")
            endpoints[name] = value
        token_endpoint = endpoints["token_endpoint"]
        if token_endpoint is None:
            raise LoginError(f"{metadata_url}: no token_endpoint")
        methods = document.get("code_challenge_methods_supported") or []
        return cls(
            issuer=issuer,
            token_endpoint=token_endpoint,
            authorization_endpoint=endpoints["authorization_endpoint"],
            device_authorization_endpoint=endpoints["device_authorization_endpoint"],
            revocation_endpoint=endpoints["revocation_endpoint"],
            code_challenge_methods=tuple(str(method) for method in methods if isinstance(method, str)),
            metadata_url=metadata_url,
        )


def _check_url(value: Any, what: str) -> str:
    """An absolute https URL, or http on loopback: tokens and codes travel there (RFC 6749 §3.1)."""
    if not isinstance(value, str):
        raise LoginError(f"{what} is not a URL")
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise LoginError(f"{what} is not an http(s) URL: {value!r}")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise LoginError(f"{what} is plain http on another machine ({value}): tokens must travel over https")
    return value


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(item for item in value if isinstance(item, str)) if isinstance(value, list) else ()


async def _document(http: httpx.AsyncClient, url: str) -> tuple[int, Any]:
    """GET a JSON document: (status, the parsed JSON or None)."""
    try:
        response = await http.get(url, headers={"Accept": "application/json"})
    except httpx.HTTPError as exc:
        raise LoginError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200 or len(response.content) > MAX_DOCUMENT:
        return response.status_code, None
    try:
        return 200, response.json()
    except ValueError:
        return 200, None


async def metadata_url_from_challenge(http: httpx.AsyncClient, resource: str) -> str | None:
    """The `resource_metadata` of the endpoint's 401 challenge, when it answers an
    unauthenticated GET with one (a GET without a connection: it opens nothing)."""
    try:
        response = await http.get(resource, headers={"Accept": "text/event-stream"})
    except httpx.HTTPError as exc:
        raise LoginError(f"GET {resource}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 401:
        return None
    for challenge in parse_challenges(response.headers.get("www-authenticate")):
        if challenge.scheme == "bearer" and challenge.params.get("resource_metadata"):
            return challenge.params["resource_metadata"]
    return None


async def protected_resource(http: httpx.AsyncClient, url: str) -> ProtectedResource:
    """The endpoint's RFC 9728 metadata: from its challenge, else at the well-known URLs."""
    resource = resource_for(url)
    named = await metadata_url_from_challenge(http, resource)
    candidates = [named] if named is not None else protected_resource_metadata_urls(resource)
    for metadata_url in candidates:
        _check_url(metadata_url, "the resource metadata URL")
        status, document = await _document(http, metadata_url)
        if status == 404 and named is None:
            continue
        if not isinstance(document, dict):
            raise LoginError(f"GET {metadata_url}: HTTP {status}, not a JSON metadata document")
        if _canonical_or_none(document.get("resource")) != resource:
            raise LoginError(
                f"{metadata_url}: the metadata is for resource {document.get('resource')!r}, not {resource!r} "
                "(RFC 9728 §3.3): refused"
            )
        return ProtectedResource(
            resource=str(document["resource"]),
            authorization_servers=_strings(document.get("authorization_servers")),
            scopes_supported=_strings(document.get("scopes_supported")),
            metadata_url=metadata_url,
        )
    raise LoginError(
        f"{resource} names no OAuth metadata (no resource_metadata in its 401, nothing at "
        f"{PROTECTED_RESOURCE_WELL_KNOWN}): it does not sign users in with OAuth"
    )


def _canonical_or_none(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        return canonical_url(value)
    except (ClientUsageError, ValueError):
        return None


async def authorization_server(http: httpx.AsyncClient, issuer: str) -> AuthorizationServer:
    """The issuer's RFC 8414 metadata (or its OpenID discovery), checked."""
    _check_url(issuer, "the authorization server")
    tried: list[str] = []
    for metadata_url in authorization_server_metadata_urls(issuer):
        status, document = await _document(http, metadata_url)
        if document is None:
            tried.append(f"{metadata_url} (HTTP {status})")
            continue
        return AuthorizationServer.from_document(document, issuer=issuer, metadata_url=metadata_url)
    raise LoginError(f"no metadata for the authorization server {issuer}: tried {', '.join(tried)}")


async def discover(http: httpx.AsyncClient, url: str) -> tuple[ProtectedResource, AuthorizationServer]:
    """The resource's metadata and its first authorization server's."""
    resource = await protected_resource(http, url)
    if not resource.authorization_servers:
        raise LoginError(f"{resource.metadata_url} names no authorization_servers: nowhere to sign in")
    return resource, await authorization_server(http, resource.authorization_servers[0])


def default_scopes(resource: ProtectedResource, asked: Iterable[str] = ()) -> list[str]:
    """The scopes to ask for: those given (each may hold several, space-separated), else all
    the resource lists, else `acp:connect`."""
    given = [scope for value in asked for scope in value.split()]
    if given:
        return list(dict.fromkeys(given))
    return list(resource.scopes_supported) or ["acp:connect"]
