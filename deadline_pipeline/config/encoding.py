"""Decoding a configuration or subscriber file as UTF-8, with the line and column of a bad byte."""

from __future__ import annotations

from pathlib import Path

from deadline_pipeline.config.errors import ConfigError
from deadline_pipeline.unicode_forms import other_unicode


def first_non_utf8(data: bytes, path: Path) -> tuple[UnicodeDecodeError, int, int] | None:
    """``None`` when the file ``data`` is UTF-8 (a byte order mark allowed); else ``(error, line,
    offset of that line's start)`` for its first byte that is not, ``error.start`` being that byte's
    offset in ``data``. Raises :class:`ConfigError` naming ``path`` when the whole file is in another
    encoding, not one bad byte: it starts with a UTF-16 or UTF-32 byte order mark, or its first line
    is UTF-16 without one (:func:`~deadline_pipeline.unicode_forms.other_unicode`)."""
    found = other_unicode(data)
    if found is not None:
        name, has_mark = found
        if has_mark:
            raise ConfigError(f"{path}: the file is {name} (it starts with a {name} byte order mark); save it "
                              "as UTF-8")
        raise ConfigError(f"{path}: line 1: the file looks like {name} without a byte order mark (a NUL byte "
                          "beside every character); save it as UTF-8")
    try:
        # "utf-8", not "utf-8-sig": a byte order mark is UTF-8 too, and the -sig codec counts the
        # error's position from after it, one column off on the first line.
        data.decode("utf-8")
        return None
    except UnicodeDecodeError as exc:
        bad = exc
    return bad, data.count(b"\n", 0, bad.start) + 1, data.rfind(b"\n", 0, bad.start) + 1


def not_utf8(path: Path, data: bytes, bad: UnicodeDecodeError, where: str) -> ConfigError:
    """The :class:`ConfigError` (returned, for the caller to raise) for the byte at ``bad.start`` of
    ``data`` that is not UTF-8, at ``where`` (``line 4, column 2``) in the file ``path``."""
    return ConfigError(f"{path}: {where}: byte 0x{data[bad.start]:02x} is not UTF-8 ({bad.reason}); save the "
                       "file as UTF-8")


def utf8_text(data: bytes, path: Path) -> str:
    """The configuration file ``data`` decoded as UTF-8 (a byte order mark is dropped); raises
    :class:`ConfigError` naming ``path``, the line and column of the first byte that is not UTF-8 and
    the fix (:func:`first_non_utf8`). Python's own message gave a byte offset from the start of the
    file, which no editor shows."""
    found = first_non_utf8(data, path)
    if found is None:
        return data.decode("utf-8-sig")
    bad, line, start = found
    column = len(data[start:bad.start].decode("utf-8-sig", "replace")) + 1
    raise not_utf8(path, data, bad, f"line {line}, column {column}") from None
