"""Durations and offsets in the words a person reads. Pure functions, no I/O.

Every command and every message shows a duration the same way (``1 d 0 h``, ``1 min 44 s``) and a
reminder offset both as the ISO 8601 duration the configuration uses and in words
(``-P7D, 7 days before``), never as raw seconds or microseconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from functools import lru_cache

# Between a correction's "deadline moved from … to …" and why it moved when the rule did not change
# (a zone-data or calendar upgrade): the message shows the part after it as "Why: …".
MOVE_CAUSE = "; cause: "

_UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def human_duration(seconds: float | timedelta | None) -> str:
    """``seconds`` as its two most significant units: ``86400`` → ``"1 d 0 h"``, ``104`` →
    ``"1 min 44 s"``, ``7`` → ``"7 s"``, ``0.25`` → ``"0.25 s"``, ``None`` → ``"-"``.

    Negative values keep their sign (``-90`` → ``"-1 min 30 s"``). Units: d, h, min, s (SI/ISO 80000
    symbols), so columns stay short and a reader never counts digits of a seconds value.
    """
    if seconds is None:
        return "-"
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    sign = "-" if seconds < 0 else ""
    left = abs(float(seconds))
    if left < 60:
        # Sub-second figures (a send took 0.25 s) matter; above a minute they are noise.
        shown = f"{left:.2f}".rstrip("0").rstrip(".") if left < 10 and left != int(left) else f"{int(left)}"
        return f"{sign}{shown} s"
    whole = int(left)
    for i, (unit, size) in enumerate(_UNITS[:-1]):
        if whole >= size:
            nxt_unit, nxt_size = _UNITS[i + 1]
            return f"{sign}{whole // size} {unit} {(whole % size) // nxt_size} {nxt_unit}"
    return f"{sign}{whole} s"  # pragma: no cover - unreachable (whole >= 60 here)


# Cached: a sweep words the same few configured offsets for every alert. typed=True keeps 3600 and
# 3600.0 apart, so a cached answer is always the one the call itself would compute.
@lru_cache(maxsize=1024, typed=True)
def iso_duration(seconds: int) -> str:
    """An offset in seconds as the ISO 8601 duration the configuration accepts: ``-604800`` →
    ``"-P7D"``, ``-5400`` → ``"-PT1H30M"``, ``0`` → ``"PT0S"``, ``-93600`` → ``"-P1DT2H"``."""
    sign = "-" if seconds < 0 else ""
    days, rest = divmod(abs(int(seconds)), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = "P" + (f"{days}D" if days else "")
    clock = "".join(f"{v}{u}" for v, u in ((hours, "H"), (minutes, "M"), (secs, "S")) if v)
    if clock:
        text += "T" + clock
    if text == "P":
        return "PT0S"
    return sign + text


def _plural(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


def duration_words(seconds: int) -> str:
    """A non-negative length in words, at most two units: ``604800`` → ``"7 days"``, ``5400`` →
    ``"1 hour 30 minutes"``, ``30`` → ``"30 seconds"``, ``0`` → ``""``."""
    left = abs(int(seconds))
    days, rest = divmod(left, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [_plural(v, u) for v, u in ((days, "day"), (hours, "hour"), (minutes, "minute")) if v]
    if not parts and secs:
        return _plural(secs, "second")
    return " ".join(parts[:2])


@lru_cache(maxsize=1024, typed=True)
def offset_words(seconds: int) -> str:
    """Which reminder an offset is: ``-604800`` → ``"7 days before"``, ``0`` → ``"at the deadline"``,
    ``3600`` → ``"1 hour after"``."""
    if int(seconds) == 0:
        return "at the deadline"
    return f"{duration_words(seconds)} {'before' if seconds < 0 else 'after'}"


def offset_text(seconds: int) -> str:
    """An offset as ISO 8601 and in words: ``-604800`` → ``"-P7D, 7 days before"``."""
    return f"{iso_duration(seconds)}, {offset_words(seconds)}"


def shorten(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in ``…`` when cut."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


#: How close a misspelt name must be to a known one to be named as meant (difflib's ratio: twice the
#: matching characters over both lengths). 0.75 catches one dropped, doubled or swapped letter in a
#: word of six or more (``rrul``, ``RRLUE``, ``submision``) and leaves unrelated names alone.
NEAR_NAME_CUTOFF = 0.75


def near_name(name: str, candidates: Iterable[str], cutoff: float = NEAR_NAME_CUTOFF) -> str | None:
    """The one of ``candidates`` closest to ``name`` with a :mod:`difflib` ratio ≥ ``cutoff`` (0-1),
    else None: ``near_name("rrul", ["rrule"])`` → ``"rrule"``. The one test of "a misspelling of a
    name this reader knows" behind every "did you mean …?" (configuration keys, kinds, CSV columns,
    ai-deadlines keys, ICS properties): a name misspelt is otherwise ignored, and what it held is never
    planned while ``validate`` says OK."""
    import difflib

    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=cutoff)
    return close[0] if close else None
