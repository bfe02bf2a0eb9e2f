"""What the benchmarks and the production tests that drive real Dagster processes need around them:
a throwaway PostgreSQL database, a ``DAGSTER_HOME`` with the production ``dagster.yaml``, and a
process group that is stopped whole. Benchmarks import only the package and this folder, never the
test suite; the production tests import these from here (``test_production_daemon`` re-exports them).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from deadline_pipeline.store.db import normalise_url

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The console scripts (``dagster``, ``dagster-daemon``) of the interpreter running the benchmark.
BIN = Path(sys.executable).parent
WORKSPACE = REPO_ROOT / "workspace.yaml"


@contextmanager
def throwaway_database(admin_url: str, prefix: str) -> Iterator[str]:
    """A fresh PostgreSQL database next to ``admin_url``; yields its URL (psycopg 3 driver), drops it after."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(normalise_url(admin_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(normalise_url(admin_url)).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            # FORCE: a run worker stopped with the daemon may still hold a connection.
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def instance_env(dagster_db_url: str) -> dict[str, str]:
    """The ``DAGSTER_PG_*`` variables the production ``dagster.yaml`` reads, for one database URL."""
    url = make_url(dagster_db_url)
    return {
        "DAGSTER_PG_USERNAME": url.username or "postgres",
        "DAGSTER_PG_PASSWORD": url.password or "",
        "DAGSTER_PG_HOST": url.host or "127.0.0.1",
        "DAGSTER_PG_PORT": str(url.port or 5432),
        "DAGSTER_PG_DB": url.database or "",
    }


def make_dagster_home(folder: Path, yaml_path: Path = REPO_ROOT / "dagster.yaml") -> Path:
    """A ``DAGSTER_HOME`` (absolute, existing) holding a copy of ``yaml_path`` (default: the
    production ``dagster.yaml``)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(yaml_path, folder / "dagster.yaml")
    return folder.resolve()


@contextmanager
def process_group(args: list[str], env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen]:
    """Start a console script of this interpreter in its own process group, output to ``log_path``;
    on exit stop the whole group (the daemon's code server and run workers too, which would
    otherwise go on holding database connections)."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(BIN / args[0]), *args[1:]], cwd=REPO_ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            stop_process_group(proc)


def stop_process_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the group, then SIGKILL whatever is left (SIGTERM alone does not always stop a
    ``dagster`` process tree); returns once no live process of it remains. Raises ``RuntimeError``
    when the group survives SIGKILL: its processes would go on holding database connections and
    writing mail after the run that started them."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader so it does not linger as a zombie member of the group
            if not group_alive(proc.pid):
                return
            time.sleep(0.2)
    proc.poll()
    if group_alive(proc.pid):
        raise RuntimeError(f"process group {proc.pid} survived SIGKILL")


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` other than a zombie remains (``killpg(…, 0)`` counts zombies)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
