"""A parser of the `text/event-stream` format (the WHATWG HTML standard's event stream interpretation)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

# The format ends lines with CRLF, LF or CR, and nothing else: str.splitlines (and so httpx's iter_lines)
# also splits at U+2028, U+0085, form feeds and more, which may stand unescaped inside an event's JSON data.
LINE_END = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One dispatched message. `id` is None when the message had no `id:` line of its own."""

    event: str = "message"
    data: str = ""
    id: str | None = None


@dataclass(slots=True)
class SSEParser:
    """Turns lines (without their line endings) into messages; remembers the last `retry:` value.

    A message is dispatched at a blank line only: one cut off by a dropped connection is never returned.
    """

    retry_ms: int | None = None
    _event: str = ""
    _data: list[str] | None = None
    _id: str | None = None
    _first: bool = True

    def feed(self, line: str) -> ServerSentEvent | None:
        """Take one line; return the message it completes, if any."""
        if self._first:
            self._first = False
            line = line.removeprefix("\ufeff")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment, e.g. the service's `: ping` heartbeat
        name, colon, value = line.partition(":")
        if colon:
            value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            if self._data is None:
                self._data = []
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)
        return None  # other field names are ignored, as the standard says

    def _dispatch(self) -> ServerSentEvent | None:
        event, data, id_ = self._event, self._data, self._id
        self._event, self._data, self._id = "", None, None
        if data is None:
            return None
        return ServerSentEvent(event=event or "message", data="\n".join(data), id=id_)


def parse_lines(lines: Iterable[str], parser: SSEParser | None = None) -> Iterator[ServerSentEvent]:
    """Every complete message in `lines` (each line without its ending: `\\n`, `\\r\\n` or `\\r`)."""
    parser = parser or SSEParser()
    for line in lines:
        message = parser.feed(line)
        if message is not None:
            yield message


def split_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The lines of a byte stream, without their endings, decoded as UTF-8; an unfinished last line is dropped."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        start = 0
        for match in LINE_END.finditer(pending):
            if match.group() == b"\r" and match.end() == len(pending):
                break  # perhaps the first half of a CRLF split across chunks: wait for the next one
            yield pending[start : match.start()].decode("utf-8", "replace")
            start = match.end()
        pending = pending[start:]
    if pending.endswith(b"\r"):
        yield pending[:-1].decode("utf-8", "replace")  # the stream ended: that CR was a whole line ending
