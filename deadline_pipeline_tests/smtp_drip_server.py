"""A loopback SMTP server that drips one of its answers a byte at a time, for the SMTP channel's
time limit (smtplib's timeout bounds each socket call only, and each byte comes well within it)."""

from __future__ import annotations

import socket

from deadline_pipeline_tests.drip_server import DRIP_BYTES, DRIP_EVERY, LoopbackDripServer

GREETING = b"220 drip.test ESMTP " + b"." * DRIP_BYTES + b"\r\n"
DATA_REPLY = b"250 2.0.0 Ok: queued as " + b"d" * DRIP_BYTES + b"\r\n"
# A TLS handshake record header announcing 64 bytes, and the 64: what the client waits for while it drips.
TLS_RECORD = b"\x16\x03\x03\x00\x40" + b"\x00" * 64


class SmtpDripServer(LoopbackDripServer):
    """Speaks just enough SMTP (EHLO/HELO, MAIL, RCPT, DATA, QUIT, each answered 250/354/221) and
    drips, one byte every ``every`` seconds, the answer named by ``where``:

    * ``"greeting"``: the 220 greeting (nothing of the message has been sent: outcome failed);
    * ``"data"``: the 250 reply to the message data (the server has the message: outcome unknown);
    * ``"handshake"``: for SMTP over TLS, a TLS record in answer to the client's hello;
    * ``"cut"`` (no drip): the reply to the message data stops after ``25`` and the connection closes.

    Answers completely when not given up on, so a client without a total bound succeeds (or, for the
    handshake, fails) after ``DRIP_BYTES * every`` s. ``messages``: how many message data it received.
    """

    def __init__(self, where: str, every: float = DRIP_EVERY) -> None:
        if where not in ("greeting", "data", "handshake", "cut"):
            raise ValueError(f"where must be 'greeting', 'data', 'handshake' or 'cut', not {where!r}")
        self.where = where
        self.messages = 0
        super().__init__(every)

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                if self.where == "handshake":
                    if conn.recv(65536):  # the client's hello
                        self._drip(conn, TLS_RECORD)
                    return
                if not self._say(conn, GREETING, dripped=self.where == "greeting"):
                    return
                self._session(conn)
            except OSError:
                return  # the client gave up, as it should

    def _say(self, conn: socket.socket, reply: bytes, *, dripped: bool) -> bool:
        """Send ``reply``, dripped or at once; False when :meth:`close` stopped the drip."""
        if dripped:
            return self._drip(conn, reply)
        conn.sendall(reply)
        return True

    def _session(self, conn: socket.socket) -> None:
        lines = conn.makefile("rb")
        for line in lines:
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                conn.sendall(b"250 drip.test\r\n")
            elif verb in (b"MAIL", b"RCPT"):
                conn.sendall(b"250 2.1.0 Ok\r\n")
            elif verb == b"DATA":
                conn.sendall(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                for data_line in lines:
                    if data_line == b".\r\n":
                        break
                with self._lock:
                    self.messages += 1
                if self.where == "cut":
                    conn.sendall(b"25")
                    conn.shutdown(socket.SHUT_RDWR)
                    return
                if not self._say(conn, DATA_REPLY, dripped=self.where == "data"):
                    return
            elif verb == b"QUIT":
                conn.sendall(b"221 2.0.0 Bye\r\n")
                return
            else:
                conn.sendall(b"502 5.5.2 Command not recognised\r\n")
