"""Client requests a connection forwarded to its agent and the agent has not answered yet.

How many (MAX_PENDING_REQUESTS), what bytes they hold while the agent works on them
(MAX_BODY_BYTES per connection, MAX_WORKER_BUFFERED_BYTES summed over the worker), and where
each reply goes: over HTTP the stream recorded at POST time, pinning that session's stream until
the reply; over WebSocket there is one stream, so only the ids are counted.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Literal

from acp_channels import _protocol as protocol
from acp_channels._conf import acp_settings
from acp_channels._host.budget import WorkerBudget
from acp_channels._protocol import Batch, Frame, Single, StreamKey
from acp_channels.errors import TooManyRequests


class PendingRequests:
    """The ledger of one connection's requests in flight."""

    def __init__(self, worker: WorkerBudget | None) -> None:
        self.count = 0
        self.bytes = 0
        self._worker = worker
        # The size charged to each pending request, by id key, in order.
        self._charges: dict[str, deque[int]] = {}
        # HTTP: where each pending request's reply goes, by id; pinning their session streams.
        self._routes: dict[str, deque[StreamKey]] = {}
        self.pins: dict[str, int] = {}
        # WebSocket: ids forwarded and not yet answered.
        self._socket_ids: dict[str, int] = {}

    def admit(self, frame: Frame, requests: int) -> int:
        """The size of a frame carrying `requests` requests, or TooManyRequests: at most
        MAX_PENDING_REQUESTS at once; their bytes at most one body's worth (MAX_BODY_BYTES; a
        frame always fits when none is pending), every connection's together at most
        MAX_WORKER_BUFFERED_BYTES (the same)."""
        limit = acp_settings.MAX_PENDING_REQUESTS
        if self.count + requests > limit:
            raise TooManyRequests(limit)
        size = len(protocol.serialize_frame(frame))
        connection_limit = acp_settings.MAX_BODY_BYTES
        if self.bytes and self.bytes + size > connection_limit:
            raise TooManyRequests(connection_limit, "bytes")
        worker = self._worker
        if worker is not None:
            worker_limit = acp_settings.MAX_WORKER_BUFFERED_BYTES
            if worker.requests_used and worker.requests_used + size > worker_limit:
                raise TooManyRequests(worker_limit, "bytes")
        return size

    def add_routes(self, routes: list[tuple[str, StreamKey]], size: int) -> None:
        """HTTP requests admitted with `size` bytes, each with the stream its reply goes to."""
        for key, route in routes:
            self._routes.setdefault(key, deque()).append(route)
            if route is not None:
                self.pins[route] = self.pins.get(route, 0) + 1
        self._charge(size, [key for key, _ in routes])

    def add_socket_ids(self, keys: list[str], size: int) -> None:
        """WebSocket requests admitted with `size` bytes, by id key."""
        for key in keys:
            self._socket_ids[key] = self._socket_ids.get(key, 0) + 1
        self._charge(size, keys)

    def _charge(self, size: int, keys: list[str]) -> None:
        if not keys:
            return
        self.count += len(keys)
        self.bytes += size
        if self._worker is not None:
            self._worker.requests_used += size
        share, extra = divmod(size, len(keys))
        for index, key in enumerate(keys):
            self._charges.setdefault(key, deque()).append(share + (extra if index == 0 else 0))

    def pop_route(self, key: str, unpinned: list[str]) -> StreamKey | Literal[False]:
        """An HTTP reply to `key`: the stream its oldest request recorded (False: none pending).
        A session stream no longer pinned is added to `unpinned`."""
        routes = self._routes.get(key)
        if not routes:
            return False
        route = routes.popleft()
        if not routes:
            del self._routes[key]
        self._answered(key)
        if route is not None:
            pins = self.pins[route] - 1
            if pins:
                self.pins[route] = pins
            else:
                del self.pins[route]
                unpinned.append(route)
        return route

    def answer_socket(self, key: str) -> None:
        """A WebSocket reply to `key`: one request of that id is answered, if one is pending."""
        count = self._socket_ids.get(key, 0)
        if not count:
            return
        if count == 1:
            del self._socket_ids[key]
        else:
            self._socket_ids[key] = count - 1
        self._answered(key)

    def _answered(self, key: str) -> None:
        self.count -= 1
        charges = self._charges.get(key)
        if not charges:
            return
        size = charges.popleft()
        if not charges:
            del self._charges[key]
        self.bytes -= size
        if self._worker is not None:
            self._worker.requests_used -= size

    def clear(self) -> None:
        """The connection ended: no reply will come."""
        if self._worker is not None:
            self._worker.requests_used -= self.bytes
        self.count = self.bytes = 0
        self._charges.clear()
        self._routes.clear()
        self.pins.clear()
        self._socket_ids.clear()


def too_many_requests_reply(frame: Frame, ids: list[Any], refusal: TooManyRequests) -> Frame:
    """The error replies a refused WebSocket frame gets (acp_channels.errors): one per request,
    a batch for a batch."""
    errors = [refusal.rpc_error(request_id) for request_id in ids]
    return Batch(list[protocol.BatchEntry](errors)) if isinstance(frame, Batch) else Single(errors[0])
