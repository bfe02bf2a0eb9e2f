"""Paths and URLs of a configuration: environment variables expanded, relative paths made absolute."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlparse


def expand_path(path: str, base: Path) -> str:
    """``path`` (a file path or URL from the configuration) with ``${VAR}`` and ``$VAR`` replaced by
    the environment's values (``DEADLINE_HOME`` defaults to the store's home folder; an unset
    variable is left as written). A URL is returned expanded, each substituted value registered as a
    secret; a path is returned absolute, ``~`` expanded and a relative one resolved against the
    folder ``base`` (the configuration file's). Never raises for an unset variable."""
    from deadline_pipeline.store.db import deadline_home

    env = dict(os.environ)
    env.setdefault("DEADLINE_HOME", str(deadline_home()))
    used: list[str] = []

    def sub(m: re.Match) -> str:
        value = env.get(m.group(1) or m.group(2), m.group(0))
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
