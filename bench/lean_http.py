"""A lean HTTP/1.1 client for the benchmarks' writers: keep-alive
connections, one request at a time on each, JSON in and out.

The writers used ``httpx``, whose own CPU is ~2-4 ms a request on these two
cores (measured against the reference service: ``{ __typename }`` p50
6.0-9.7 ms with it, 2.0-2.6 ms with this client, the same server), more than
the service's own HTTP floor; on a 2-core machine that is time taken from
the server and counted in every latency. This client sends the same request
(``POST``, ``Content-Type: application/json``, ``Content-Length``, the
headers given) and parses the answer with ``httptools`` (uvicorn's parser,
already installed), so the figures measure the service.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httptools


class HttpError(Exception):
    """The connection closed before a whole answer arrived."""


class _Answer:
    __slots__ = ("body", "done", "keep_alive", "parser", "status")

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.body: list[bytes] = []
        self.done = done
        self.parser: httptools.HttpResponseParser | None = None
        self.keep_alive = False
        self.status = 0

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        # Read while the message is the parser's: once it completes, the
        # parser is reset and says "close" for every answer.
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()
        self.status = self.parser.get_status_code()
        self.done.set_result(None)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def post(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        self.writer.write(head + body)
        answer = _Answer(asyncio.get_running_loop().create_future())
        parser = answer.parser = httptools.HttpResponseParser(answer)
        while not answer.done.done():
            data = await self.reader.read(65536)
            if not data:
                raise HttpError("the server closed the connection")
            parser.feed_data(data)
        if not answer.keep_alive:
            self.close()
        return answer.status, b"".join(answer.body)

    @property
    def closed(self) -> bool:
        return self.writer.is_closing()

    @property
    def stale(self) -> bool:
        """Closed by either side, or at its end (the server closed it)."""
        return self.closed or self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class LeanClient:
    """Up to ``max_connections`` keep-alive connections to ``addr``
    (``host:port``); a request takes an idle one, opens one, or waits."""

    def __init__(self, addr: str, max_connections: int = 64) -> None:
        self.host, port = addr.rsplit(":", 1)
        self.port = int(port)
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)

    async def post_json(self, path: str, payload: Any, headers: dict[str, str]) -> tuple[int, Any]:
        """POST ``payload`` as JSON; the status and the decoded answer."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
            + "\r\n"
        ).encode()
        async with self._slots:
            conn = None
            while self._idle and conn is None:
                conn = self._idle.pop()
                if conn.stale:  # the server closed it while it was idle (its keep-alive timeout)
                    conn.close()
                    conn = None
            if conn is None:
                conn = _Connection(*await asyncio.open_connection(self.host, self.port))
            try:
                status, text = await conn.post(head, body)
            except BaseException:
                conn.close()
                raise
            if not conn.closed:
                self._idle.append(conn)
        return status, json.loads(text)

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
