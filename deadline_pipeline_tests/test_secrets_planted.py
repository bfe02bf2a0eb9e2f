"""Planted secrets: run the product for real and grep everything it wrote for them.

One `deadline-pipeline -v run` (a subprocess, INFO logging on) through real Dagster runs in a
persistent DAGSTER_HOME, with the store on SQLite and on PostgreSQL, against loopback receivers that
fail on purpose so that errors are logged, stored and escalated:

* a source behind HTTP Basic (``username_env`` / ``password_env``) and a second one answering 503;
* a webhook whose URL carries a token (``?token=${VAR}``), signed with a Standard Webhooks secret,
  answering 500 (retry, error stored);
* a Slack incoming webhook (the URL is the secret) answering 404 (permanent, escalated);
* SMTP with a login the server refuses (permanent, escalated);
* an Apprise ``json://`` service URL carrying a token in its path, answering 500 (unknown outcome,
  retried, error stored);
* escalation notices to a maildir.

Everything written is then searched, raw and in its URL-encoded and base64 forms: the CLI's output,
every file under the test folder (store file, Dagster home with its event log and compute logs,
maildirs) and, on PostgreSQL, every row of every table.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult
from sqlalchemy import MetaData, create_engine, select

from deadline_pipeline.store.db import normalise_url
from deadline_pipeline_tests.conftest import SmtpRecorder
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK, free_port, ics, write_config

REPO = Path(__file__).resolve().parents[1]
AS_OF = "2027-01-14T12:00:00Z"  # an hour after the one-day reminder of the 2027-01-15 12:00 Berlin deadline


def _planted() -> dict[str, str]:
    tag = uuid.uuid4().hex[:10]
    return {
        "slack_url_path": f"slackplanted{tag}",
        "webhook_token": f"hooktokenplanted{tag}",
        "source_password": f"srcpwplanted{tag}",
        "smtp_password": f"smtppwplanted{tag}",
        "apprise_token": f"apprisetokenplanted{tag}",
        "signing_secret": base64.b64encode(f"signingplanted{tag}-key".encode()).decode(),
    }


class _Receivers:
    """The loopback HTTP receiver of every route: source feed, broken source, webhook, Slack."""

    def __init__(self, secrets: dict[str, str]) -> None:
        self.seen: list[tuple[str, str, dict]] = []
        owner = self
        basic = "Basic " + base64.b64encode(f"reader:{secrets['source_password']}".encode()).decode()
        feed = ics(dict(uid="report@planted", tzid="Europe/Berlin", dtstart="20270115T120000",
                        summary="Quarterly report")).encode()

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                owner.seen.append(("GET", self.path, dict(self.headers)))
                if self.headers.get("Authorization") != basic:
                    self._answer(401, b"who are you")
                elif self.path == "/feed.ics":
                    self._answer(200, feed)
                else:
                    self._answer(503, b"down for maintenance")

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                owner.seen.append(("POST", self.path, dict(self.headers)))
                if self.path.startswith("/services/"):
                    self._answer(404, b"no_service")
                else:
                    self._answer(500, b"receiver crashed")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _forms(value: str) -> set[str]:
    """How a secret could appear: as is, URL-encoded, base64 (alone and as the password of user 'reader')."""
    return {value, quote(value, safe=""), base64.b64encode(value.encode()).decode().rstrip("="),
            base64.b64encode(f"reader:{value}".encode()).decode().rstrip("=")}


def _dump_tables(db_url: str) -> str:
    engine = create_engine(normalise_url(db_url))
    meta = MetaData()
    meta.reflect(engine)
    out = []
    with engine.connect() as conn:
        for table in meta.sorted_tables:
            for row in conn.execute(select(table)):
                out.append(repr(tuple(row)))
    engine.dispose()
    return "\n".join(out)


def test_planted_secrets_appear_nowhere_a_run_writes(tmp_path, db_url):
    secrets = _planted()
    receivers = _Receivers(secrets)

    def authenticate(server, session, envelope, mechanism, auth_data):
        return AuthResult(success=False, handled=False)  # 535: a permanent login failure

    smtp = Controller(SmtpRecorder(), hostname="127.0.0.1", port=free_port(), authenticator=authenticate,
                      auth_require_tls=False)
    smtp.start()
    work = tmp_path / "work"
    work.mkdir()
    try:
        config = write_config(
            work,
            sources=[{"name": "feed", "format": "ics", "location": f"{receivers.base}/feed.ics", "tenant": "t1",
                      "username_env": "DP_PLANT_SRC_USER", "password_env": "DP_PLANT_SRC_PASSWORD"},
                     {"name": "broken", "format": "ics", "location": f"{receivers.base}/broken.ics", "tenant": "t1",
                      "username_env": "DP_PLANT_SRC_USER", "password_env": "DP_PLANT_SRC_PASSWORD"}],
            subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/Berlin",
                          "webhook_url": f"{receivers.base}/hook?token=${{DP_PLANT_HOOK_TOKEN}}"}],
            subscriptions=[{"name": "all", "sources": ["feed", "broken"], "offsets": ["-P1D"],
                            "channels": ["mail", "hook", "chat", "push", "box"]}],
            channels={"mail": {"type": "smtp", "host": "127.0.0.1", "port": smtp.port, "timeout_seconds": 5,
                               "username_env": "DP_PLANT_SMTP_USER", "password_env": "DP_PLANT_SMTP_PASSWORD"},
                      "hook": {"type": "webhook", "timeout_seconds": 5, "secret_env": "DP_PLANT_SIGNING"},
                      "chat": {"type": "slack", "url_env": "DP_PLANT_SLACK_URL", "timeout_seconds": 5},
                      "push": {"type": "apprise", "url_env": "DP_PLANT_APPRISE_URL", "timeout_seconds": 5},
                      "box": {"type": "maildir", "path": str(work / "maildir")},
                      "ops": {"type": "maildir", "path": str(work / "ops-maildir")}},
            escalation={"channels": ["ops"], "email": "ops@example.org"},
            network=LOOPBACK_NETWORK,
        )
        env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
        env.update(
            PYTHONPATH=str(REPO), DEADLINE_HOME=str(work),
            DP_PLANT_SRC_USER="reader", DP_PLANT_SRC_PASSWORD=secrets["source_password"],
            DP_PLANT_HOOK_TOKEN=secrets["webhook_token"], DP_PLANT_SIGNING="whsec_" + secrets["signing_secret"],
            DP_PLANT_SLACK_URL=f"{receivers.base}/services/T0PLANT/B0PLANT/{secrets['slack_url_path']}",
            DP_PLANT_SMTP_USER="mailer", DP_PLANT_SMTP_PASSWORD=secrets["smtp_password"],
            DP_PLANT_APPRISE_URL=f"json://{receivers.base.partition('://')[2]}/apprise/{secrets['apprise_token']}",
        )
        home = tmp_path / "dagster_home"
        res = subprocess.run(
            [sys.executable, "-m", "deadline_pipeline.cli", "-v", "run", "--config", str(config), "--as-of", AS_OF,
             "--db-url", db_url, "--dagster-home", str(home)],
            cwd=work, env=env, capture_output=True, text=True, timeout=600,
        )
    finally:
        smtp.stop()
        receivers.close()
    cli_output = res.stdout + res.stderr
    assert res.returncode in (0, 1), cli_output  # 1: red checks (a source is down), as intended

    # The run really used every secret and really failed where planted to fail.
    paths = [p for _m, p, _h in receivers.seen]
    assert f"/hook?token={secrets['webhook_token']}" in paths, paths
    assert any(p.endswith(secrets["slack_url_path"]) for p in paths), paths
    assert any(p.startswith(f"/apprise/{secrets['apprise_token']}") for p in paths), paths
    assert any(h.get("webhook-signature", "").startswith("v1,") for _m, _p, h in receivers.seen)
    assert "/broken.ics" in paths and "/feed.ics" in paths
    stored = _dump_tables(db_url)
    for expected in ("receiver crashed", "no_service", "login refused", "HTTP 503",
                     "(apprise JSON $DP_PLANT_APPRISE_URL)"):
        assert expected in stored, f"{expected!r} not stored: the failure paths were not exercised"
    assert "INFO" in cli_output, "the run was not verbose"

    # Everything written: CLI output, the PostgreSQL rows, and every file under the test folder
    # (SQLite store, Dagster home: event log, run storage, compute logs; both maildirs; the config).
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".db" for p in files if home in p.parents), "no Dagster event log was written"
    assert any("compute_logs" in p.parts for p in files), "no Dagster compute log was written"
    assert list((work / "ops-maildir" / "new").iterdir()), "no escalation notice was written"
    haystacks = {"CLI output": cli_output.encode(), "store rows": stored.encode()}
    haystacks.update({str(p.relative_to(tmp_path)): p.read_bytes() for p in files})
    found = [(name, key) for key, value in secrets.items() for form in _forms(value)
             for name, data in haystacks.items() if form.encode() in data]
    print(f"secrets planted: {len(secrets)}, found: {len({k for _, k in found})}; "
          f"searched {len(files)} files, {len(cli_output)} characters of CLI output, {len(stored)} of store rows")
    assert found == []
