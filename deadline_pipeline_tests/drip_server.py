"""Loopback receivers that drip their answer a byte at a time, for the channels' time limits.

Each byte comes well within any read timeout, so a client bounding each read only (httpx's and
aiohttp's per-phase timeouts, smtplib's socket timeout) waits for the whole answer; only a bound on
the request as a whole ends it in time.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Self

# 30 bytes, one every 0.2 s: a whole answer takes 6 s, several times the tests' 1 s timeout.
DRIP_BYTES = 30
DRIP_EVERY = 0.2


class LoopbackDripServer:
    """Accepts any number of connections on ``127.0.0.1`` and answers each in a thread of its own with
    :meth:`_answer` (a subclass's), which drips with :meth:`_drip`. ``port``: the listening port;
    ``every``: seconds between dripped bytes. Use as a context manager; :meth:`close` stops every drip.
    """

    def __init__(self, every: float = DRIP_EVERY) -> None:
        self.every = every
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            worker = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            self._threads.append(worker)
            worker.start()

    def _answer(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _drip(self, conn: socket.socket, data: bytes) -> bool:
        """Send ``data``: its first ``DRIP_BYTES`` bytes one every ``every`` seconds, the rest at once.
        False when :meth:`close` stopped the drip; raises ``OSError`` when the client is gone."""
        for i in range(min(DRIP_BYTES, len(data))):
            if self._stop.wait(self.every):
                return False
            conn.sendall(data[i:i + 1])
        conn.sendall(data[DRIP_BYTES:])
        return True

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DripServer(LoopbackDripServer):
    """An HTTP receiver: on each connection, reads the request and answers ``200 OK`` with a JSON body,
    dripping one byte every ``every`` seconds either in the header block (``where="headers"``: a long
    header line) or in the body (``where="body"``). Answers completely when not given up on, so a
    client without a total bound succeeds after ``DRIP_BYTES * every`` s.

    ``requests``: how many requests arrived (the receiver got the request: the outcome is unknown).
    ``url``: ``http://127.0.0.1:<port>``.
    """

    def __init__(self, where: str, every: float = DRIP_EVERY) -> None:
        if where not in ("headers", "body"):
            raise ValueError(f"where must be 'headers' or 'body', not {where!r}")
        self.where = where
        self.requests = 0
        super().__init__(every)
        self.url = f"http://127.0.0.1:{self.port}"

    def _answer(self, conn: socket.socket) -> None:
        body = b'{"id": "dripped"}'
        if self.where == "headers":
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Drip: "
            dripped = b"x" * DRIP_BYTES + f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        else:
            body = body + b" " * DRIP_BYTES  # JSON allows trailing whitespace
            head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            dripped = body
        with conn:
            conn.settimeout(5)
            try:
                if not conn.recv(65536):
                    return
                with self._lock:
                    self.requests += 1
                conn.sendall(head)
                if not self._drip(conn, dripped):
                    return
                time.sleep(0.5)  # let the client read the end before the connection closes
            except OSError:
                return  # the client gave up, as it should
