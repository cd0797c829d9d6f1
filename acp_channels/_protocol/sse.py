"""Header values (§3.1), the POST media type, and the SSE encoding with its event ids (§6.6).
Section numbers (§N) refer to docs/wire-contract.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

# --------------------------------------------------------------------------------------------
# Header values and SSE (§3.1, §6.6)


def header_value(values: Iterable[str] | str | None) -> str | None:
    """The first value of a header, or None when absent or not visible ASCII (§3.1)."""
    if values is None:
        return None
    value = values if isinstance(values, str) else next(iter(values), None)
    if value is None or _VISIBLE_ASCII.fullmatch(value) is None:
        return None
    return value


_VISIBLE_ASCII: Final = re.compile(r"[\t -~]*")


_TOKEN: Final = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_MEDIA_TYPE = re.compile(rf"({_TOKEN})/({_TOKEN})")
#: One `; name=value` of a media type (RFC 9110 §8.3.1); a parameter may be empty (`;;`).
_MEDIA_PARAMETER = re.compile(rf'[ \t]*;[ \t]*(?:({_TOKEN})=({_TOKEN}|"(?:[^"\\]|\\.)*"))?')


def is_json_content_type(value: str | None) -> bool:
    """A POST's Content-Type: `application/json` in any case, with optional parameters; a
    `charset`, if given, must be utf-8 (quoted or not, any case). Anything else is 415."""
    if value is None:
        return False
    value = value.strip(" \t")
    match = _MEDIA_TYPE.match(value)
    if match is None or match[1].lower() != "application" or match[2].lower() != "json":
        return False
    position = match.end()
    while position < len(value):
        parameter = _MEDIA_PARAMETER.match(value, position)
        if parameter is None:
            return False
        name, raw = parameter[1], parameter[2]
        if name is not None and name.lower() == "charset":
            charset = re.sub(r"\\(.)", r"\1", raw[1:-1]) if raw.startswith('"') else raw
            if charset.lower() != "utf-8":
                return False
        position = parameter.end()
    return True


SSE_OPENING: Final = b": \n\n"
SSE_KEEPALIVE: Final = b": \n\n"
#: The last line of a stream closed because its connection's credential expired (a comment: an
#: SSE parser skips it); the connection lives, a new credential resumes the stream.
SSE_EXPIRED: Final = b": credential expired\n\n"


def event_id(tag: str, seq: int) -> str:
    """The SSE id of a stream's `seq`-th event (opaque to clients)."""
    return f"{tag}-{seq}"


def parse_event_id(value: str) -> tuple[str, int] | None:
    """(tag, seq) of an id made by `event_id`; None for anything else."""
    tag, dash, seq = value.strip().rpartition("-")
    if not dash or not tag or not seq.isdigit() or len(seq) > 18:
        return None
    return tag, int(seq)


_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def _json_escape(match: re.Match[str]) -> str:
    units = match.group().encode("utf-16-be")
    return "".join(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))


def ascii_json(text: str) -> str:
    """The same JSON with non-ASCII characters as \\u escapes.

    The Python SDK client decodes each network chunk as UTF-8 on its own, so a character split
    across two reads would kill its stream; pure ASCII events cannot be split that way.
    """
    return text if text.isascii() else _NON_ASCII.sub(_json_escape, text)


def sse_event(payload: str, event_id: str | None = None) -> bytes:
    """One SSE event, with an `id:` line when given; text with line breaks (relayed malformed
    output) becomes several data lines."""
    payload = ascii_json(payload)
    head = b"id: " + event_id.encode() + b"\n" if event_id is not None else b""
    if "\n" not in payload and "\r" not in payload:
        return head + b"data: " + payload.encode() + b"\n\n"
    lines = payload.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return head + "".join(f"data: {line}\n" for line in lines).encode() + b"\n"
