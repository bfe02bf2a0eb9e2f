"""Paths and URLs of a configuration: environment variables expanded, relative paths made absolute."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlparse


class UnsetVariable(ValueError):
    """A ``${VAR}`` or ``$VAR`` in a configured path or URL whose variable is unset or empty. The
    message names the variable and which of the two it is (e.g. ``environment variable FEED_DIR is
    not set``)."""


def expand_path(path: str, base: Path) -> str:
    """``path`` (a file path or URL from the configuration) with ``${VAR}`` and ``$VAR`` replaced by
    the environment's values (``DEADLINE_HOME`` defaults to the store's home folder). A URL is
    returned expanded, each substituted value registered as a secret; a path is returned absolute,
    ``~`` expanded and a relative one resolved against the folder ``base`` (the configuration
    file's).

    Raises :class:`UnsetVariable` for a variable that is unset or empty. Both used to pass: an unset
    one was left as written (mail went to a folder literally named ``${MAIL_DIR}``), and an empty
    ``${MAIL_DIR}/maildir`` became ``/maildir``, a folder at the file-system root.
    """
    from deadline_pipeline.store.db import deadline_home

    env = dict(os.environ)
    env.setdefault("DEADLINE_HOME", str(deadline_home()))
    used: list[str] = []

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        value = env.get(name)
        if not value:
            state = "not set" if value is None else "empty"
            raise UnsetVariable(f"environment variable {name} is {state} (in {path!r}); set it, or write the "
                                "value itself")
        used.append(value)
        return value

    expanded = re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, path)
    if len(urlparse(expanded).scheme) > 1:  # a URL (an unsupported scheme is refused by validation)
        from deadline_pipeline.security.redact import register_secret

        # A variable inside a URL is how a private feed's token stays out of the file: never print it.
        for value in used:
            register_secret(value)
        return expanded
    p = Path(expanded).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())
