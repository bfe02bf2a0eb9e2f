"""A real Radicale CalDAV server for tests, started on a free loopback port, and an independent
CalDAV client (the ``caldav`` library) to read what the server holds."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import caldav

from deadline_pipeline_tests.factories import free_port

USER, PASSWORD = "alice", "s3cret-pass"


class Radicale:
    """``python -m radicale`` in a child process with HTTP Basic users from a plain htpasswd file and
    its collections under ``folder``; :meth:`stop` ends that process (and only it)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        users = folder / "users"
        users.write_text(f"{USER}:{PASSWORD}\n")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = folder / "radicale.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "radicale", "--config", "", "--server-hosts", f"127.0.0.1:{self.port}",
             "--storage-filesystem-folder", str(folder / "collections"), "--auth-type", "htpasswd",
             "--auth-htpasswd-filename", str(users), "--auth-htpasswd-encryption", "plain",
             "--rights-type", "owner_only", "--logging-level", "warning"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"radicale did not start: {self.log.read_text()}") from None
                time.sleep(0.1)
        self.client = caldav.DAVClient(url=self.base, username=USER, password=PASSWORD)

    def make_calendar(self, name: str | None = None) -> str:
        """Create a calendar collection for the test user; returns its URL (trailing ``/``)."""
        name = name or f"cal-{uuid.uuid4().hex[:8]}"
        cal = self.client.principal().make_calendar(name=name, cal_id=name)
        return str(cal.url).rstrip("/") + "/"

    def events(self, url: str) -> list:
        """Every VEVENT (``icalendar.Event``) the calendar at ``url`` holds, read by the caldav library."""
        return [e.icalendar_component for e in self.client.calendar(url=url).events()]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
