"""The IANA time-zone database every instant is computed with: chosen on purpose, the same in every
process, and named by its version so each obligation says which rules planned it.

Why: :mod:`zoneinfo` reads the machine's zoneinfo folder first and the ``tzdata`` package only for
keys the folder lacks. On a machine whose folder is older than the package the project depends on
(Debian's 2025b against ``tzdata`` 2026f), ``DTSTART;TZID=America/Vancouver:20261116T090000`` was
planned at 17:00Z, though 2026f puts British Columbia on UTC-7 all year from 2026-11-01 (16:00Z): a
``PT0S`` reminder arrived an hour after the deadline, and nothing recorded which rules planned it.
A planner and a sweeper on two machines could also read two versions without anybody noticing.

The choice (:func:`choose`), from ``$DEADLINE_ZONE_DATA``:

* ``newest`` (the default): the newer of the ``tzdata`` package and the system folder, by IANA
  version (``2025b`` < ``2026f``); the package when they are equal or the folder's version is
  unreadable (an unversioned folder cannot be compared, so it is never preferred);
* ``package``: the ``tzdata`` package alone;
* ``system``: the system folder (the first folder of ``$PYTHONTZPATH``, else Python's default
  search path, that holds a versioned database), for a site whose operating system is kept newer
  than its Python packages. Refused with :class:`ZoneDataError` when no such folder exists.

:func:`activate` (run when the package is imported) points :mod:`zoneinfo` at the choice and
empties its cache, so every ``ZoneInfo(key)`` in the process, the libraries' included (icalendar,
Dagster's schedules), reads the same database. The version in force is recorded with each planning
run, each obligation and each heartbeat; a change of version is a revision (see ``plan``), and
processes that disagree turn the ``time_data_agrees`` check red.
"""

from __future__ import annotations

import logging
import os
import re
import sysconfig
import zoneinfo
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "DEADLINE_ZONE_DATA"
POLICIES = ("newest", "package", "system")
_VERSION = re.compile(r"^(?P<year>\d{4})(?P<letter>[a-z]*)$")


class ZoneDataError(ValueError):
    """A zone-data setting that cannot be honoured; the message names the setting and the value."""


@dataclass(frozen=True)
class ZoneData:
    """One zone database: ``source`` ``"package"`` or ``"system"``, its IANA ``version`` (``"2026f"``),
    ``folder`` (the system folder read, ``None`` for the package), ``policy`` (the setting that chose
    it) and ``other`` (the version of the database not chosen, ``None`` when there is none)."""

    source: str
    version: str
    folder: str | None = None
    policy: str = "newest"
    other: str | None = None

    def describe(self) -> str:
        """``IANA 2026f (tzdata package)`` or ``IANA 2025b (system folder /usr/share/zoneinfo)``."""
        where = "tzdata package" if self.source == "package" else f"system folder {self.folder}"
        return f"IANA {self.version} ({where})"


def version_key(version: str) -> tuple[int, str]:
    """``"2026f"`` → ``(2026, "f")``, ordered as IANA releases are (``2025b`` < ``2025aa`` is not a
    real case: letters run a–z within a year). Raises :class:`ZoneDataError` on anything else."""
    m = _VERSION.match(version or "")
    if not m:
        raise ZoneDataError(f"zone data version {version!r} is not an IANA release name such as 2026f")
    return int(m.group("year")), m.group("letter").rjust(2, " ")


_PACKAGE_VERSION = re.compile(r'^IANA_VERSION\s*=\s*["\'](?P<version>[^"\']+)["\']', re.MULTILINE)


def package_version() -> str:
    """The IANA version of the installed ``tzdata`` package (a dependency), e.g. ``"2026f"``: read
    from the package's files as they are now, not from the module imported at start, so that a
    package upgraded under a running process is seen (:func:`refresh`)."""
    from importlib.resources import files

    import tzdata

    try:
        m = _PACKAGE_VERSION.search(files("tzdata").joinpath("__init__.py").read_text(encoding="utf-8"))
    except OSError:
        m = None
    return m.group("version") if m else tzdata.IANA_VERSION


def folder_version(folder: str | os.PathLike) -> str | None:
    """The IANA version of the zoneinfo folder ``folder``, from its ``tzdata.zi`` first line
    (``# version 2025b``) or a ``+VERSION`` file; ``None`` when it has neither (or is no folder)."""
    root = Path(folder)
    try:
        with open(root / "tzdata.zi", encoding="ascii", errors="replace") as fh:
            first = fh.readline().split()
        if len(first) == 3 and first[:2] == ["#", "version"]:
            return first[2]
    except OSError:
        pass
    try:
        text = (root / "+VERSION").read_text(encoding="ascii", errors="replace").strip()
        return text or None
    except OSError:
        return None


def system_folders() -> list[str]:
    """The folders :mod:`zoneinfo` searches by default: ``$PYTHONTZPATH`` (``os.pathsep``-separated,
    absolute paths only, as :mod:`zoneinfo` reads it) or Python's compiled-in ``TZPATH``."""
    env = os.environ.get("PYTHONTZPATH")
    raw = env if env is not None else (sysconfig.get_config_var("TZPATH") or "")
    return [p for p in raw.split(os.pathsep) if p and os.path.isabs(p)]


def _system() -> tuple[str, str] | None:
    """(folder, version) of the first default folder that holds a versioned zone database."""
    for folder in system_folders():
        version = folder_version(folder)
        if version is not None:
            try:
                version_key(version)
            except ZoneDataError:
                log.warning("zone data: folder %s has an unreadable version %r; not used", folder, version)
                continue
            return folder, version
    return None


def choose(policy: str | None = None) -> ZoneData:
    """The zone database ``policy`` (default ``$DEADLINE_ZONE_DATA``, else ``newest``) selects; see the
    module docstring. Deterministic: the same installation and setting give the same answer in every
    process. Raises :class:`ZoneDataError` naming the setting for an unknown policy, or for
    ``system`` without a versioned system folder."""
    policy = (policy if policy is not None else os.environ.get(ENV, "newest")).strip() or "newest"
    if policy not in POLICIES:
        raise ZoneDataError(f"{ENV}={policy!r}: expected one of {', '.join(POLICIES)}")
    package = package_version()
    system = _system()
    if policy == "system":
        if system is None:
            searched = system_folders() or "the search path"
            raise ZoneDataError(f"{ENV}=system: no versioned zoneinfo folder in {searched}")
        return ZoneData("system", system[1], system[0], policy, other=package)
    if policy == "newest" and system is not None and version_key(system[1]) > version_key(package):
        return ZoneData("system", system[1], system[0], policy, other=package)
    return ZoneData("package", package, None, policy, other=system[1] if system else None)


_in_force: ZoneData | None = None


def activate(choice: ZoneData | None = None) -> ZoneData:
    """Make ``choice`` (default :func:`choose`) the database of every ``ZoneInfo`` in this process:
    :func:`zoneinfo.reset_tzpath` to its folder (none for the package, so only ``tzdata`` is read)
    and :meth:`zoneinfo.ZoneInfo.clear_cache` (a zone built before would keep the old rules).
    Returns the choice, logged when it is not the package the project depends on."""
    global _in_force
    choice = choice or choose()
    zoneinfo.reset_tzpath(to=[choice.folder] if choice.folder else [])
    zoneinfo.ZoneInfo.clear_cache()
    # Caches of zone lookups built on the database before (the project's name → tzinfo cache).
    for clear in _on_change:
        clear()
    _in_force = choice
    if choice.other and choice.other != choice.version:
        log.info("zone data: %s in force (policy %s; the other database is IANA %s)",
                 choice.describe(), choice.policy, choice.other)
    return choice


_on_change: list = []


def on_change(clear) -> None:
    """Register ``clear()`` (a cache's clear method) to run whenever :func:`activate` switches."""
    _on_change.append(clear)


def refresh() -> ZoneData:
    """The zone database in force, activated again (logged as a warning) when its files now hold
    another IANA version than the one this process activated: the ``tzdata`` package's
    (:func:`package_version`, read from its files) or the system folder's (:func:`folder_version`).
    Run where a stage starts (planning), so a long-lived process computes and records one database.
    Which database is in force does not change here (``newest`` is decided at start).

    Why: :mod:`zoneinfo` reads a zone's file when the zone is first built, so after ``tzdata`` was
    upgraded under a running process (a Celery worker runs planning steps in-process), a zone built
    before kept the old rules, one built after read the new ones, and both were recorded under the
    version imported at start: America/Vancouver planned with 2026g's rules and recorded as 2026f,
    and the checks, run in the same worker, green."""
    current = in_force()
    now = package_version() if current.folder is None else folder_version(current.folder)
    if now is None or now == current.version:
        return current
    log.warning("zone data changed under this process: %s is now IANA %s; computing with it",
                current.describe(), now)
    return activate(ZoneData(current.source, now, current.folder, current.policy, current.other))


def in_force() -> ZoneData:
    """The zone database this process computes with (activated on first use)."""
    return _in_force if _in_force is not None else activate()


def _links(zi: str) -> dict[str, str]:
    """``{link name: the zone it names}`` from the text of a ``tzdata.zi`` (its ``L TARGET NAME`` lines;
    a link to a link is followed to the zone)."""
    links = {}
    for line in zi.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "L":
            links[parts[2]] = parts[1]
    for name in links:
        seen = {name}
        while links[name] in links and links[name] not in seen:  # a chain; a cycle is left as it is
            seen.add(links[name])
            links[name] = links[links[name]]
    return links


@lru_cache(maxsize=8)
def folder_links(folder: str) -> dict[str, str]:
    """The links of the zone database in ``folder`` (its ``tzdata.zi``), ``{}`` when it has none."""
    try:
        return _links((Path(folder) / "tzdata.zi").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return {}


@lru_cache(maxsize=1)
def package_links() -> dict[str, str]:
    """The links of the ``tzdata`` package's database (``US/Eastern`` → ``America/New_York``)."""
    from importlib.resources import files

    return _links(files("tzdata.zoneinfo").joinpath("tzdata.zi").read_text(encoding="utf-8"))


def key_in_force(key: str) -> str | None:
    """The key the database in force holds the IANA zone ``key`` (a name of the ``tzdata`` package's
    zone list) under: ``key`` itself, or the zone it links to where a system folder lacks the link's
    own file but its ``tzdata.zi`` names the link and the folder holds the zone; ``None`` when the
    folder holds neither.

    Why: :mod:`zoneinfo` reads a key its search path lacks from the ``tzdata`` package, so with a
    system folder in force such a key was computed with the package's rules under the folder's
    version. Debian 13 and Ubuntu 23.10 on move the ``backward`` names (``US/Eastern``,
    ``Canada/Pacific``) to ``tzdata-legacy``: without it, under a 2025b folder, ``Canada/Pacific`` was
    planned with 2026f (16:00Z) and ``America/Vancouver``, the same zone, with 2025b (17:00Z), both
    recorded as 2025b."""
    folder = in_force().folder
    if folder is None:
        return key
    root = Path(folder)
    if (root / key).is_file():
        return key
    target = folder_links(folder).get(key)
    return target if target is not None and (root / target).is_file() else None


def version() -> str:
    """The IANA version in force, e.g. ``"2026f"``: what obligations and heartbeats record."""
    return in_force().version


def time_data_text() -> str:
    """One line naming every versioned input of an instant besides the sources, for ``--version``,
    ``status`` and run summaries: ``zone data IANA 2026f (tzdata package; the system folder has
    2025b), calendars holidays 0.109, recurrence engine python-dateutil 2.9.0.post0``."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    zd = in_force()
    other = ""
    if zd.other and zd.other != zd.version:
        other = f"; the {'system folder' if zd.source == 'package' else 'tzdata package'} has {zd.other}"
    try:
        calendars = f"holidays {dist_version('holidays')}"
    except PackageNotFoundError:
        calendars = "holidays not installed"
    from deadline_pipeline.recurrence_engine import recurrence_engine_version

    return (f"zone data {zd.describe()[:-1]}{other}), calendars {calendars}, "
            f"recurrence engine {recurrence_engine_version()}")
