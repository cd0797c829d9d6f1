"""`acp-bridge --attach SESSION_ID`: hand the editor a live session started elsewhere
(docs/bridge.md, "Attaching to a running session"; the server side: docs/shared-sessions.md).

The attaching itself is the client's (`HttpClient(url, attach=SESSION_ID, role=...)`,
docs/client.md): the editor's `initialize` opens the attachment, its result is checked to be
one (`client.attachment`), and over HTTP the session's stream opens right after it. Here is
what a stdio agent owes its editor on top of that. The editor asks for a session; the bridge
gives it the attached one without asking the remote:

* the first `session/new` is answered `{"sessionId": SESSION_ID}`; a later one is refused (the
  bridge carries that one session);
* `session/load` (or `session/resume`) of SESSION_ID is answered `null` (`{}`); of any other
  session refused;
* any other message naming SESSION_ID is relayed (the editor knew the id already).

Until the editor has the session (the first of these), what the remote sends about it (its
notifications and requests: what the session retained, then live) is held back, then written in
the order it came: an editor drops updates for a session it does not know. Responses are never
held.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Final

from acp_channels import _protocol as protocol
from acp_channels.client import Attachment as ClientAttachment
from acp_channels.client import AttachRole, HttpStatusError, ProtocolViolationError, TransportError
from acp_channels.client._base import FrameValue
from acp_channels.client._shared_sessions import ATTACH_ROLES, TERMINATED_METHOD

__all__ = [
    "HELD_BYTES_LIMIT",
    "ROLES",
    "Attachment",
    "LocalAnswer",
    "check_session_id",
]

logger = logging.getLogger("acp_channels.bridge")

ROLES: Final[tuple[AttachRole, ...]] = ATTACH_ROLES

#: Statuses of the initialize (or the upgrade) that refuse the attachment itself: no such
#: session (or not the caller's to attach to), a token without the scope, a bad role, too many
#: clients on the session.
_REFUSALS: Final = {
    404: "the server has no such session that these credentials may attach to",
    403: "these credentials may not attach to it (a token needs the scope acp:session:control, "
    "or acp:session:observe for an observer)",
    400: "the server refused the attach request",
    429: "too many clients are attached to it already",
}
#: Bytes held for the editor before it has the session; beyond this the remote is not read.
HELD_BYTES_LIMIT: Final = 64 * 1024 * 1024


def check_session_id(session_id: str) -> None:
    """A session id travels in a header: printable ASCII, not empty (ValueError otherwise)."""
    if not session_id or not all("\x21" <= char <= "\x7e" for char in session_id):
        raise ValueError("--attach takes a session id: printable ASCII without spaces")


@dataclass(frozen=True, slots=True)
class LocalAnswer:
    """What the bridge answers an editor's request with itself, once the attachment is open
    (and the editor then has the session). `request_id` is None for a handover alone: a message
    naming the session is relayed right after it."""

    request_id: Any
    result: Any = None
    handover_only: bool = False


class Attachment:
    """The state of one `--attach` as the editor sees it: the initialize that opens it, what is
    held for the editor, and the local answers."""

    def __init__(self, session_id: str, role: AttachRole = "controller") -> None:
        check_session_id(session_id)
        self.session_id = session_id
        self.role: AttachRole = role
        #: The editor's initialize request (its id), once one was relayed.
        self.initialize_sent = False
        self._initialize_id: Any = None
        #: Set when the initialize is answered: `attached` says whether it opened the attachment.
        self.settled = asyncio.Event()
        self.attached = False
        #: Why the server's initialize answer is not an attachment (its error, or no attachment).
        self.refusal: str | None = None
        #: The answer was a result without the attachment: the bridge ends.
        self._not_attached = False
        #: The editor was given the session (or named it): nothing is held any more.
        self.handed_over = asyncio.Event()
        #: The editor asked for the session (session/new answered, or to be): a second is refused.
        self._offered = False
        self.held: list[str] = []
        self.held_bytes = 0
        #: Around holding, and around handing over (answer, then what was held): keeps the order.
        self.lock = asyncio.Lock()

    # ------------------------------------------------------------------- editor -> remote

    def from_editor(self, frame: protocol.Frame) -> LocalAnswer | str | None:
        """What to do with a frame from the editor: None, relay it; a `LocalAnswer`, answer it
        locally (a handover alone: then relay it); a string, refuse it with that message."""
        if isinstance(frame, protocol.Single):
            message = frame.message
            method = message.get("method")
            if "id" in message and method == "initialize":
                self.initialize_sent = True
                self._initialize_id = message["id"]
                if not self.attached:  # again, after an error answer (HTTP: no connection was kept)
                    self.settled.clear()
                    self.refusal = None
                return None
            if "id" in message and method == "session/new":
                if self._offered:
                    return self._only_this("a new session")
                self._offered = True
                return LocalAnswer(message["id"], {"sessionId": self.session_id})
            if "id" in message and method in ("session/load", "session/resume"):
                params = message.get("params")
                named = params.get("sessionId") if isinstance(params, dict) else None
                if named != self.session_id:
                    return self._only_this(f"session {named!r}")
                self._offered = True
                return LocalAnswer(message["id"], None if method == "session/load" else {})
        if not self._offered and any(
            protocol.message_session_id(message) == self.session_id for message in protocol.frame_messages(frame)
        ):
            self._offered = True
            return LocalAnswer(None, handover_only=True)
        return None

    def _only_this(self, what: str) -> str:
        return f"acp-bridge: attached to session {self.session_id!r}: it carries that session only, not {what}"

    # ------------------------------------------------------------------- remote -> editor

    def is_initialize_reply(self, value: FrameValue) -> bool:
        """Is `value` the answer to the editor's initialize (the first one)?"""
        return (
            self.initialize_sent
            and not self.settled.is_set()
            and isinstance(value, dict)
            and "method" not in value
            and value.get("id") == self._initialize_id
        )

    def initialize_reply(self, value: dict[str, Any], attachment: ClientAttachment | None) -> str | None:
        """Note the answer to the editor's initialize, given what the client attached to (the
        caller sets `settled` once the editor has it); returns the message of the error the
        editor gets instead when the answer is a result that opened no attachment (the client
        fails the connection first, as a server that does not attach broke the contract)."""
        if "error" in value:
            error = value["error"]
            self.refusal = str(error.get("message")) if isinstance(error, dict) else "initialize failed"
            return None
        if attachment is None or attachment.session_id != self.session_id:
            self.refusal = (
                "the server did not attach: its initialize result has no _meta['acp-channels/attachment'] "
                "for it (a server without shared sessions?)"
            )
            self._not_attached = True
            return f"acp-bridge: could not attach to session {self.session_id!r}: {self.refusal}"
        self.attached = True
        running = "a turn is running" if attachment.turn_running else "no turn is running"
        logger.info(
            "attached to session %s as %s (its connection: %s; %s)",
            self.session_id,
            attachment.role,
            attachment.connection_id,
            running,
        )
        return None

    def holds(self, value: FrameValue) -> bool:
        """Is this frame held until the editor has the session? Anything but responses."""
        if self.handed_over.is_set():
            return False
        messages = value if isinstance(value, list) else [value]
        return any(isinstance(message, dict) and "method" in message for message in messages)

    def hold(self, text: str) -> None:
        self.held.append(text)
        self.held_bytes += len(text)

    def take_held(self) -> list[str]:
        held, self.held, self.held_bytes = self.held, [], 0
        return held

    def terminated(self, value: FrameValue) -> str | None:
        """The reason to end, when `value` says the session was terminated."""
        if isinstance(value, dict) and value.get("method") == TERMINATED_METHOD:
            params = value.get("params")
            if isinstance(params, dict) and params.get("sessionId") == self.session_id:
                return (
                    f"session {self.session_id!r} was terminated "
                    f"(its connection {params.get('connectionId', '?')} ended)"
                )
        return None

    def refused_message(self, error: TransportError | None, connected: bool) -> str | None:
        """The editor's message when the attachment was refused (no such session, too many
        clients, a server that does not attach); None for any other failure."""
        if self._not_attached:
            return f"acp-bridge: could not attach to session {self.session_id!r}: {self.refusal}"
        if connected:
            return None
        if isinstance(error, ProtocolViolationError) and self.initialize_sent and not self.settled.is_set():
            # The client refused the initialize's answer (a result that is no attachment, for one).
            return f"acp-bridge: could not attach to session {self.session_id!r}: {error}"
        if not isinstance(error, HttpStatusError) or error.status_code not in _REFUSALS:
            return None
        return f"acp-bridge: could not attach to session {self.session_id!r}: {_REFUSALS[error.status_code]} ({error})"
