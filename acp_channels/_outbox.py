"""Messages to another worker's inbox that are ready together travel as one layer message.

An echo turn through a runner is a call's answer and then the turn's output, both to the same
web worker a few event-loop steps apart; each layer message costs both ends a Redis command and
Redis a script. A send waits while the loop has other work that may add to it (up to
GATHER_STEPS steps, never past GATHER_SECONDS, and QUIET_STEPS once another message joined and
none followed), then everything queued for that inbox meanwhile goes as one `acp.batch` (a lone
message goes as itself). A call does not wait: its answer is what comes next. Messages keep
their order per inbox; each sender learns how its batch fared (sent, or the error), as if it had
sent alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

#: Loop steps a batch stays open for more messages: the answer to a prompt and the first output of
#: an in-process agent are this close (measured: bench/RUNNERS.md, Redis commands per echo turn).
GATHER_STEPS: Final = 12
#: Once company came, the batch goes after this many steps without more (an echo turn's output
#: joins its answer one step after it, whole).
QUIET_STEPS: Final = 2
#: Never longer than this (a busy loop's steps are long: its batches fill anyway).
GATHER_SECONDS: Final = 0.001
#: A batch closes at this many bytes of output: past it, company saves little, and a stream's
#: pushes (each waiting for its acknowledgement credit) must not wait for any.
GATHER_BYTES: Final = 16 * 1024

BATCH: Final = "acp.batch"


class _Batch:
    __slots__ = ("joined", "messages", "sent", "size", "step")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.messages: list[dict[str, Any]] = []
        self.sent: asyncio.Future[None] = loop.create_future()
        self.size = 0
        #: The loop steps the batch has waited, and the step at which its last message joined.
        self.step = self.joined = 0


def _size(message: dict[str, Any]) -> int:
    items = message.get("items")
    return sum(map(len, items)) if isinstance(items, list) else 0


class Outbox:
    """Open batches per inbox channel; `send_now` sends one layer message (with retries)."""

    def __init__(self, send_now: Callable[[str, dict[str, Any]], Awaitable[None]]) -> None:
        self._send_now = send_now
        self._open: dict[str, _Batch] = {}
        #: The last batch of each inbox: the next one goes only once it has (order per inbox).
        self._last: dict[str, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def send(self, channel: str, message: dict[str, Any], *, wait_for_company: bool = True) -> None:
        """Send `message` with the batch open for `channel`, or in a new one, which waits for more
        unless `wait_for_company` is False (a call: what comes next is its answer, from there)."""
        batch = self._open.get(channel)
        if batch is None:
            loop = asyncio.get_running_loop()
            batch = self._open[channel] = _Batch(loop)
            previous, self._last[channel] = self._last.get(channel), batch.sent
            steps = GATHER_STEPS if wait_for_company else 0
            task = loop.create_task(self._flush(channel, batch, previous, steps), name=f"acp-outbox {channel}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        batch.messages.append(message)
        batch.joined = batch.step
        batch.size += _size(message)
        if batch.size >= GATHER_BYTES and self._open.get(channel) is batch:
            del self._open[channel]  # closed: the next message starts another
        # Shielded: a sender that is cancelled stops waiting; its message still goes (as a lone
        # send did).
        await asyncio.shield(batch.sent)

    async def drain(self, timeout: float) -> None:
        """Wait, up to `timeout` seconds, until the batches opened so far are sent (or failed)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    async def _flush(self, channel: str, batch: _Batch, previous: asyncio.Future[None] | None, steps: int) -> None:
        loop = asyncio.get_running_loop()
        opened = loop.time()
        try:
            for batch.step in range(steps):
                if (
                    self._open.get(channel) is not batch
                    or loop.time() - opened >= GATHER_SECONDS
                    or (len(batch.messages) > 1 and batch.step - batch.joined > QUIET_STEPS)
                ):
                    break
                await asyncio.sleep(0)
            if self._open.get(channel) is batch:
                del self._open[channel]
            if previous is not None and not previous.done():
                await asyncio.wait([previous])
            messages = batch.messages
            await self._send_now(channel, messages[0] if len(messages) == 1 else {"type": BATCH, "messages": messages})
        except Exception as error:
            batch.sent.set_exception(error)
            batch.sent.exception()  # retrieved: senders that left do not make it "never retrieved"
        except BaseException:
            batch.sent.cancel()  # the loop is stopping
            raise
        else:
            batch.sent.set_result(None)
        finally:
            if self._open.get(channel) is batch:
                del self._open[channel]
            if self._last.get(channel) is batch.sent:
                del self._last[channel]


def unbatched(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages one layer message carries, in order."""
    if message.get("type") == BATCH:
        inner = message.get("messages")
        return [each for each in inner if isinstance(each, dict)] if isinstance(inner, list) else []
    return [message]
