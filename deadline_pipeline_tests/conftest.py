"""Shared fixtures: the public data folder, and the store on SQLite and on a real PostgreSQL server.

``../shared`` (real public files) exists in the development workplace only; tests that read it skip
with a message when it is absent, and ``DEADLINE_REQUIRE_SHARED=1`` (set by ``.ci/run``) turns that
skip into a failure. Store tests run on SQLite and on PostgreSQL (``DEADLINE_TEST_PG_URL``, default
``postgresql://postgres@127.0.0.1:5432/postgres``); each test gets a throwaway database. When no
server answers they skip, unless ``DEADLINE_REQUIRE_PG=1`` (set by ``.ci/run``).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DEADLINE_SHARED_DIR", REPO_ROOT.parent / "shared"))
PG_URL = os.environ.get("DEADLINE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _require(flag: str) -> bool:
    return os.environ.get(flag, "") not in ("", "0", "false")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The ``../shared`` folder of real public files, or a skip (a failure under DEADLINE_REQUIRE_SHARED)."""
    if not (SHARED / "data").is_dir():
        msg = f"shared data folder {SHARED} is absent; set DEADLINE_SHARED_DIR to run these tests"
        if _require("DEADLINE_REQUIRE_SHARED"):
            pytest.fail(msg)
        pytest.skip(msg)
    return SHARED


def _pg_admin_engine():
    from sqlalchemy import create_engine

    from deadline_pipeline.store.db import normalise_url

    return create_engine(normalise_url(PG_URL), isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="session")
def pg_server():
    """The admin URL of a PostgreSQL server that answers, or a skip (a failure under DEADLINE_REQUIRE_PG)."""
    try:
        eng = _pg_admin_engine()
        with eng.connect() as conn:
            conn.exec_driver_sql("select 1")
        eng.dispose()
    except Exception as exc:  # any connection failure means "no server here"
        msg = f"no PostgreSQL server at {PG_URL}: {exc.__class__.__name__}: {exc}"
        if _require("DEADLINE_REQUIRE_PG"):
            pytest.fail(msg)
        pytest.skip(msg)
    return PG_URL


@pytest.fixture
def pg_url(pg_server):
    """A throwaway PostgreSQL database for one test, dropped afterwards."""
    from sqlalchemy.engine import make_url

    from deadline_pipeline.store.db import normalise_url

    name = f"dp_test_{uuid.uuid4().hex[:12]}"
    admin = _pg_admin_engine()
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = make_url(normalise_url(pg_server)).set(database=name).render_as_string(hide_password=False)
    yield url
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """The store URL, once on a SQLite file and once on a throwaway PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.sqlite3'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def engine(db_url):
    """A migrated engine on :func:`db_url`."""
    from deadline_pipeline.store.db import make_engine, upgrade

    eng = make_engine(db_url)
    upgrade(eng)
    yield eng
    eng.dispose()


class SmtpRecorder:
    """An aiosmtpd handler that accepts every message and keeps (recipients, raw bytes)."""

    def __init__(self):
        self.messages: list[tuple[list[str], bytes]] = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append((list(envelope.rcpt_tos), envelope.content))
        return "250 OK"

    @property
    def subjects(self) -> list[str]:
        """Subjects unfolded (long ones are folded, RFC 5322 §2.2.3)."""
        from email import message_from_bytes

        return [" ".join(str(message_from_bytes(raw)["Subject"]).split()) for _, raw in self.messages]


@pytest.fixture
def smtp_server():
    """A real SMTP server on loopback: ``(controller, recorder)``. A test may stop it (an outage)."""
    from aiosmtpd.controller import Controller

    from deadline_pipeline_tests.factories import free_port

    handler = SmtpRecorder()
    controller = Controller(handler, hostname="127.0.0.1", port=free_port())
    controller.start()
    yield controller, handler
    if controller._thread is not None:
        controller.stop()


@pytest.fixture(autouse=True)
def _dagster_defs_state_storage_restored():
    """Dagster's current defs-state storage (a ContextVar that ``with DagsterInstance`` sets) as it
    was before the test. A test that evaluates a schedule tick and executes its run inside
    ``instance_for_test`` left the disposed test instance's storage set in this thread, and the next
    test that loaded Definitions failed with "Attempted to resolve undefined DagsterInstance weakref"
    (test_planning's pipeline run and the UI test, when they ran after test_plan_partitions)."""
    from dagster._core.storage.defs_state.base import _current_storage

    before = _current_storage.get()
    yield
    _current_storage.set(before)
