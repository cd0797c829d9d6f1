"""SSE events are pure ASCII: non-ASCII characters travel as JSON \\u escapes (same JSON value)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from acp_channels._protocol import ascii_json, sse_event


def test_non_ascii_is_escaped_and_json_equal() -> None:
    text = json.dumps({"text": "héllo 😀 中"}, ensure_ascii=False)
    event = sse_event(text)
    assert event.isascii()
    assert event == b'data: {"text": "h\\u00e9llo \\ud83d\\ude00 \\u4e2d"}\n\n'
    assert json.loads(event[len(b"data: ") : -2]) == {"text": "héllo 😀 中"}


def test_ascii_text_is_unchanged() -> None:
    text = '{"jsonrpc":"2.0","id":1,"result":{}}'
    assert ascii_json(text) is text


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda children: st.lists(children) | st.dictionaries(st.text(), children),
        max_leaves=20,
    )
)
def test_escaping_keeps_every_json_value(value: object) -> None:
    text = json.dumps(value, ensure_ascii=False)
    escaped = ascii_json(text)
    assert escaped.isascii()
    assert json.loads(escaped) == value
