"""Telling a text in another Unicode encoding (UTF-16, UTF-32) from UTF-8 with a bad byte.

A leaf module: the configuration reads its own and the subscriber file with it, and the ingest
parsers their payloads, without the configuration importing the ingest stage.
"""

from __future__ import annotations

import codecs


def other_unicode(data: bytes) -> tuple[str, bool] | None:
    """``(encoding, has_mark)`` when ``data`` is text in another Unicode encoding than UTF-8, else ``None``.

    ``("UTF-32", True)`` / ``("UTF-16", True)`` when it starts with that encoding's byte order mark
    (the UTF-32 marks first: the little-endian one begins with UTF-16's); ``("UTF-16-LE", False)`` /
    ``("UTF-16-BE", False)`` when its first line (at most 4096 bytes) has a NUL byte in at least three
    quarters of every other position — after each byte for little-endian, before it for big-endian —
    and none in the others. ASCII text in UTF-16 is valid UTF-8 (a NUL is a character), so such a
    file passed the UTF-8 check and was refused for "unknown column 'i\\x00d\\x00'"; with a mark it
    was "not valid UTF-8 (byte 0xff)", which does not say what the file is. UTF-8 text holds no NUL.
    """
    for name, marks in (("UTF-32", (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)),
                        ("UTF-16", (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))):
        if data.startswith(marks):
            return name, True
    end = data.find(b"\n", 0, 4096)
    line = data[: end if end >= 0 else 4096]
    for name, nul_at in (("UTF-16-LE", 1), ("UTF-16-BE", 0)):
        nuls, others = line[nul_at::2], line[1 - nul_at::2]
        if len(line) >= 2 and b"\0" not in others and nuls.count(0) * 4 >= len(nuls) * 3:
            return name, False
    return None
