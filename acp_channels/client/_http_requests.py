"""Requests to the endpoint and their answers, for the HTTP transport: an exchange read whole
(a busy server's Retry-After honoured, the caller told), a POST with the connection's headers,
the DELETE that ends a connection, and the error for an unexpected status."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import httpx

from acp_channels import _protocol as protocol
from acp_channels._protocol import CONNECTION_HEADER

from ._base import FrameValue
from ._errors import HttpStatusError, NetworkError, ReconnectGaveUpError, TransportError, TransportTimeoutError
from ._reconnect import ReconnectEvent, ReconnectingTransport, StreamDrop
from ._retry import RetryAfter, RetryCallback, RetryEvent, retry_after_seconds
from ._shared_sessions import resend_safe

__all__ = ["JSON", "HttpRequests", "is_2xx", "post_body"]

logger = logging.getLogger("acp_channels.client")

JSON: Final = "application/json"
_ERROR_BODY_LIMIT: Final = 2000


def is_2xx(response: httpx.Response) -> bool:
    return 200 <= response.status_code < 300


def post_body(value: FrameValue, raw: str | None) -> bytes:
    """The POST body: the caller's exact text when it gave one (a relay), else `value` as JSON."""
    return (raw if raw is not None else protocol.dumps(value)).encode()


@dataclass
class _LostAnswers:
    """A request safe to send again, and the answers to it lost so far."""

    what: str
    session_id: str | None
    attempts: int = 0
    lost_at: float = 0.0


class HttpRequests(ReconnectingTransport):
    """The HTTP transport's requests (HttpTransport sets the attributes below). A 404 to a POST
    may mean the server forgot the connection: `_connection_gone` decides."""

    http: httpx.AsyncClient
    _retry_after: RetryAfter | None
    _on_retry: RetryCallback | None
    #: DELETEs sent (a connection is deleted once).
    deletes_sent: int
    #: The HTTP version of the last answer from the server ("HTTP/2", "HTTP/1.1"; None before).
    http_version: str | None

    @property
    def cookies(self) -> httpx.Cookies:
        return self.http.cookies

    def _post_headers(self) -> dict[str, str]:
        headers = {**self._headers, "Content-Type": JSON, "Accept": JSON}
        if self.connection_id is not None:
            headers["Acp-Connection-Id"] = self.connection_id
        return headers

    async def _post(self, value: FrameValue, headers: dict[str, str], what: str, raw: str | None) -> httpx.Response:
        # A POST whose every request names its operation is sent again when its answer is lost:
        # the server acknowledges the resend and runs it once.
        lost = _LostAnswers(what, headers.get("Acp-Session-Id")) if resend_safe(value) else None
        response = await self._exchange("POST", what, headers, post_body(value, raw), lost)
        logger.debug("%s: HTTP %d", what, response.status_code)
        if not is_2xx(response):
            error = self._response_error(what, response, response.text)
            gone = response.status_code == 404 and self._restart
            if gone and self._connection_gone(error, headers.get("Acp-Connection-Id")):
                return response  # a restart answers the request (an error: it was not delivered)
            raise self._fail(error)
        return response

    async def _post_initialize(
        self, message: FrameValue, raw: str | None, what: str, extra_headers: Mapping[str, str] | None = None
    ) -> tuple[httpx.Response, str | None]:
        """POST an `initialize` (no connection yet): its 2xx answer, and the connection id that
        answer names (kept as `connection_id` even on an error status, so that it is deleted).
        `extra_headers`: those of an attach."""
        headers = {**self._headers, **(extra_headers or {}), "Content-Type": JSON, "Accept": JSON}
        response = await self._exchange("POST", what, headers, post_body(message, raw))
        logger.debug("POST %s: HTTP %d", what, response.status_code)
        connection_id = protocol.header_value(response.headers.get_list(CONNECTION_HEADER)) or None
        if connection_id is not None:
            self.connection_id = connection_id
        if not is_2xx(response):
            raise self._fail(self._response_error(what, response, response.text))
        return response, connection_id

    def _connection_gone(self, error: HttpStatusError, connection_id: str | None, what: str = "") -> bool:
        """The server answered 404 for `connection_id`: start a restart when allowed (True),
        else fail with a `ResumeRefusedError` saying why (False)."""
        raise NotImplementedError

    def _response_error(self, what: str, response: httpx.Response, body: str) -> HttpStatusError:
        challenge = response.headers.get("www-authenticate")
        return self._status_error(what, response.status_code, body[:_ERROR_BODY_LIMIT], challenge)

    async def _exchange(
        self,
        method: str,
        what: str,
        headers: dict[str, str],
        content: bytes | None = None,
        lost: _LostAnswers | None = None,
    ) -> httpx.Response:
        """One request/response, read whole; a timeout or network failure is fatal, unless `lost`
        (a request safe to send again): then it is sent again while the reconnect policy allows.
        A 503 or 429 with Retry-After is sent again after the delay while the retry policy allows."""
        refused_at: float | None = None
        attempt = 0
        token_retried = False
        while True:
            answered = await self._exchange_once(method, what, headers, content, lost)
            if answered is None:
                continue  # its answer was lost: the same request again
            response, token = answered
            if lost is not None and lost.attempts:
                lost.attempts = 0
                self._tell(ReconnectEvent("resumed", what))
            if not token_retried and await self._token_replaced(
                response.status_code, response.headers.get("www-authenticate"), token
            ):
                # A 401 comes before anything else on the server: the request was not taken,
                # and goes once more with the new token (a POST is not run twice).
                token_retried = True
                logger.info("%s: HTTP 401 invalid_token; sending it again with the refreshed token", what)
                continue
            delay, refused_at = self._busy_delay(what, response, response.text, attempt, refused_at)
            if delay is None:
                return response
            attempt += 1
            await self._wait_retry(delay)

    async def _exchange_once(
        self, method: str, what: str, headers: dict[str, str], content: bytes | None, lost: _LostAnswers | None = None
    ) -> tuple[httpx.Response, str | None] | None:
        """The response and the token it was sent with; None when its answer was lost and the
        request is to be sent again (after the policy's delay, waited here)."""
        try:
            sent_headers, token = await self._authorized(headers)
        except TransportError as exc:
            raise self._fail(exc) from exc
        request = self.http.request(method, self.endpoint, headers=sent_headers, content=content, timeout=self._timeout)
        error: TransportError
        try:
            response = await self._unless_failed(request)
        except httpx.TimeoutException as exc:
            error = TransportTimeoutError(f"{what}: no answer within {self._timeout:g}s")
            cause: Exception = exc
        except httpx.HTTPError as exc:
            error = NetworkError(self.redact(f"{what}: {type(exc).__name__}: {exc}"))
            cause = exc
        else:
            self.http_version = response.http_version
            return response, token
        if lost is not None:
            if (delay := self._resend_delay(lost, error)) is not None:
                if delay > 0:
                    await self._wait_retry(delay)
                return None
            if self.error is not None:
                raise self.error from cause  # the policy gave up
        raise self._fail(error) from cause

    def _resend_delay(self, lost: _LostAnswers, error: TransportError) -> float | None:
        """Seconds before sending again a request whose answer was lost (told as "reconnecting"),
        or None: the reconnect policy gives up (then the transport fails)."""
        if self._reconnect is None or self.closed:
            return None
        now = asyncio.get_running_loop().time()
        if lost.attempts == 0:
            lost.lost_at = now
        lost.attempts += 1
        elapsed = now - lost.lost_at
        delay = self._policy_delay(StreamDrop(lost.session_id, lost.attempts, error, None, elapsed, lost.what))
        if delay is None and lost.attempts > 1:
            self._give_up(lost.what, ReconnectGaveUpError(lost.what, lost.attempts - 1, elapsed, error))
        return delay

    def _busy_delay(
        self, what: str, response: httpx.Response, body: str, attempt: int, refused_at: float | None
    ) -> tuple[float | None, float | None]:
        """(seconds before sending the request again, or None; when the first refusal came):
        a 503/429 with Retry-After within the retry policy's deadline. Tells the caller."""
        retry_after = retry_after_seconds(response.status_code, response.headers)
        if self._retry_after is None or retry_after is None:
            return None, refused_at
        now = asyncio.get_running_loop().time()
        refused_at = now if refused_at is None else refused_at
        delay = self._retry_after.delay(retry_after, now - refused_at)
        if delay is None:
            logger.warning("%s: HTTP %d for %.1fs; giving up", what, response.status_code, now - refused_at)
            return None, refused_at
        event = RetryEvent(what, response.status_code, delay, attempt + 1, now - refused_at, self.redact(body[:200]))
        logger.info("%s", event)
        if self._on_retry is not None:
            try:
                self._on_retry(event)
            except Exception:
                logger.exception("the on_retry callback failed")
        return delay, refused_at

    async def _wait_retry(self, delay: float) -> None:
        """The server's Retry-After delay; a close or a failure meanwhile ends the wait."""
        await self._unless_failed(asyncio.sleep(delay), self._closing)

    async def _delete(self, connection_id: str) -> None:
        headers = {**self._headers, "Acp-Connection-Id": connection_id}
        self.deletes_sent += 1
        try:
            for attempt in range(2):  # once more after a refused token was replaced
                sent_headers, token = await self._authorized(headers, ending=True)
                response = await self.http.request("DELETE", self.endpoint, headers=sent_headers, timeout=self._timeout)
                logger.debug("DELETE of connection %s: HTTP %d", connection_id, response.status_code)
                challenge = response.headers.get("www-authenticate")
                if attempt or not await self._token_replaced(response.status_code, challenge, token, ending=True):
                    return
        except (httpx.HTTPError, TransportError) as exc:
            logger.info("DELETE of connection %s failed: %s", connection_id, self.redact(str(exc)))
