"""The version of the reader: the code and libraries that turn a snapshot's bytes into rules.

A snapshot's rules depend on three inputs: its bytes, the source's settings (``format``,
``timezone``) and the reader. Ingest parses the latest snapshot again when the settings it was
parsed with differ from the configuration's (:func:`~deadline_pipeline.ingest.service.parse_settings`);
the reader is one of those settings, so a release that changes how a format is read (a fixed
parser, a new icalendar) re-reads every source once, instead of keeping the old reading of an
unchanged file in force for as long as its bytes stay the same. Before, a parser fix — an ICS
``DTSTART;TZID=…;VALUE=DATE`` read as a date, an ai-deadlines date under a key the reader does not
read made a skipped record — reached only the sources whose files changed afterwards: the others
kept the instants (or the silence) of the old reader, with every check green. A re-read that finds
the same rules writes nothing.
"""

from __future__ import annotations

import ast
import hashlib
import logging
from functools import cache
from importlib import metadata
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGE = "deadline_pipeline"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
# Where reading starts: every module of this package is read, and every module of ours they import.
READERS = f"{PACKAGE}.ingest.parsers"
# The libraries the readers read with (distribution names): a new version may read the same bytes
# differently (icalendar's property parsing, pandas' CSV dialect, PyYAML's scalars).
LIBRARIES = ("icalendar", "python-dateutil", "pandas", "PyYAML")


def _module_file(name: str) -> Path | None:
    """The source file of module ``name`` of this package (a package's ``__init__.py``), or None."""
    path = PACKAGE_DIR.joinpath(*name.split(".")[1:])
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imported(name: str, path: Path) -> set[str]:
    """The modules of this package that module ``name`` (source at ``path``) imports, at any depth of
    its code (imports inside functions count: they read too)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                parts = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] != PACKAGE:
                continue
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return {m for m in found if _module_file(m) is not None}


def reader_modules() -> dict[str, Path]:
    """Module name → source file of every module of this package that reading a snapshot can run:
    the modules of :data:`READERS` and, transitively, every module of ours they import."""
    root = _module_file(READERS)
    if root is None:
        raise FileNotFoundError(f"the source of {READERS} is not installed beside {__file__}")
    todo = [READERS] + [f"{READERS}.{p.stem}" for p in sorted(root.parent.glob("*.py")) if p.stem != "__init__"]
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if name in seen or path is None:
            continue
        seen[name] = path
        todo.extend(_imported(name, path) - set(seen))
    return seen


@cache
def reader_version() -> str:
    """A short digest (12 hex digits) of the reader: the source of :func:`reader_modules` and the
    versions of :data:`LIBRARIES`. Computed once per process (about 30 files read). Without the
    sources (an install that ships only bytecode) the package's version stands in, logged as a
    warning: a re-read then follows each release instead of each change of the reader."""
    digest = hashlib.sha256()
    try:
        for name, path in sorted(reader_modules().items()):
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    except (OSError, SyntaxError) as exc:
        log.warning("reader version: the readers' sources cannot be read (%s); the package version stands in", exc)
        digest.update(f"{PACKAGE}={_version(PACKAGE)}".encode())
    for library in LIBRARIES:
        digest.update(f"{library}={_version(library)}\0".encode())
    return digest.hexdigest()[:12]


def _version(distribution: str) -> str:
    """The installed version of ``distribution``, or ``"absent"``."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"
