"""One redaction function for everything the product writes: log lines, error texts, stored errors,
Dagster metadata and events.

What is masked (by :func:`redact`):

* **URLs found in the text**, each through :func:`redact_url`: the user name and password
  (``https://***@host/``), every query value (``?token=***``), the fragment (``#***``), and the
  whole path of URLs whose path is itself the credential (Slack, Discord and Mattermost incoming
  webhooks, Microsoft Teams / Power Automate workflow URLs).
* **Registered secret values**: every value the product reads from an environment variable named
  by a ``*_env`` key (SMTP password, signing secret, a Slack URL, a source's token…) is registered
  with :func:`register_secret` when it is read, and any later occurrence of it in any text is
  replaced by ``***`` - whatever the library that printed it.
* **Authorization values**: ``Bearer …`` / ``Basic …`` tokens.

Incident this comes from: an incoming-webhook URL (the credential itself) printed by httpx's INFO
request log, and ``?token=`` webhook URLs copied into ``alerts.last_error`` and the Dagster event log.

:func:`install` wires it into Python logging for the whole process (a log-record factory, so every
handler - the CLI's, Dagster's compute-log capture, a daemon's - sees only redacted text) and sets
the third-party loggers that print request URLs to WARNING.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from urllib.parse import quote, quote_plus, urlsplit, urlunsplit

MASK = "***"

# Values shorter than this are not registered: masking "1" or "yes" everywhere would garble every
# message while protecting nothing a guesser could not find.
MIN_SECRET_LENGTH = 6

# Third-party loggers that print full request URLs at INFO/DEBUG (httpx: "HTTP Request: POST <url>").
URL_PRINTING_LOGGERS = ("httpx", "httpcore", "aiohttp", "aiohttp.client", "aiohttp.access",
                        "urllib3", "urllib3.connectionpool", "requests", "hpack")

# Hosts whose URL path is the credential: knowing the URL is enough to post.
_PATH_IS_SECRET_HOSTS = (
    re.compile(r"^hooks\.slack\.com$"),
    re.compile(r"^(?:[\w-]+\.)?(?:discord|discordapp)\.com$"),  # /api/webhooks/<id>/<token>
    re.compile(r"\.webhook\.office\.com$"),
    re.compile(r"\.logic\.azure\.com$"),
    re.compile(r"^chat\.googleapis\.com$"),
    re.compile(r"^hc-ping\.com$"),  # healthchecks.io: the check's UUID is the credential
)
_PATH_IS_SECRET_PATHS = re.compile(r"^/(?:hooks|services|api/webhooks)/", re.IGNORECASE)  # Mattermost & co.

# A URL inside free text: scheme://… up to white space or a quote/bracket that ends it in prose.
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]{1,20}://[^\s'\"<>`]+")
_AUTH_VALUE = re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=\-]{6,}", re.IGNORECASE)

_secrets: set[str] = set()
_sorted: list[str] = []
# Values whose forms are all registered already: a webhook send re-reads its variables every time
# (a changed value must take effect), and re-deriving the percent-encoded forms of an unchanged value
# was a measurable share of the sweep's per-alert CPU. Only ever grows, like _secrets.
_registered_values: set[str] = set()
_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Remember ``value`` as a secret: :func:`redact` masks it from now on, in this process.

    Also registers its percent-encoded forms (how it appears inside a URL). Values shorter than
    :data:`MIN_SECRET_LENGTH` characters and ``None`` are ignored. Thread-safe; never raises.
    """
    if not value or len(value) < MIN_SECRET_LENGTH or value in _registered_values:
        return
    # surrogateescape: a variable set in another encoding than UTF-8 (a Latin-1 "contraseña") holds
    # lone surrogates (PEP 383), and strict quoting raised UnicodeEncodeError from load_config, a
    # crash naming a character of the secret instead of the check that names its variable. Escaped,
    # each such byte is percent-encoded as it would appear in a URL.
    forms = {value, value.strip(), quote(value, safe="", errors="surrogateescape"),
             quote_plus(value, errors="surrogateescape")}
    with _lock:
        new = forms - _secrets
        if new:
            _secrets.update(f for f in new if len(f) >= MIN_SECRET_LENGTH)
            # Longest first, so a secret containing another is masked whole.
            _sorted[:] = sorted(_secrets, key=len, reverse=True)
        # Added last, under the lock: a reader that finds the value here finds all its forms masked.
        _registered_values.add(value)


def secret_from_env(variable: str) -> str | None:
    """The value of environment variable ``variable`` (``None`` when unset), registered as secret.

    Every ``*_env`` configuration key is read through here, so its value can never be printed.
    """
    value = os.environ.get(variable)
    register_secret(value)
    return value


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_secret_refs(text: str) -> str:
    """``text`` with every ``${VAR}`` replaced by the environment variable's value, each value
    registered as secret (a webhook URL ``https://h/hook?token=${HOOK_TOKEN}`` keeps the token out
    of the configuration and the store).

    Raises ``KeyError`` naming the first variable that is unset or empty.
    """
    if "${" not in text:  # the common case: nothing to expand (the regex needs "${" to match)
        return text

    def sub(m: re.Match) -> str:
        value = secret_from_env(m.group(1))
        if not value:
            raise KeyError(m.group(1))
        return value

    return _ENV_REF.sub(sub, text)


def _path_is_secret(host: str, path: str) -> bool:
    return any(p.search(host) for p in _PATH_IS_SECRET_HOSTS) or bool(_PATH_IS_SECRET_PATHS.match(path))


def redact_url(url: str) -> str:
    """``url`` safe to show: user name and password, query values, fragment and credential paths
    masked (``https://u:p@h/x?token=t#f`` → ``https://***@h/x?token=***#***``).

    A text that is not a URL with a host is returned with only registered secrets masked; an
    unparseable URL containing ``@`` becomes ``<unparseable URL>``. Never raises.
    """
    try:
        parts = urlsplit(url)
        if not parts.scheme or not parts.netloc:
            return _mask_secrets(url)
        netloc = parts.netloc
        if "@" in netloc:
            netloc = MASK + "@" + netloc.rpartition("@")[2]
        host = (parts.hostname or "").lower()
        path = parts.path
        if path and _path_is_secret(host, path):
            path = "/" + MASK
        query = "&".join(
            (pair.partition("=")[0] + "=" + MASK) if pair else pair for pair in parts.query.split("&")
        ) if parts.query else ""
        fragment = MASK if parts.fragment else ""
        shown = urlunsplit((parts.scheme, netloc, path, query, fragment))
        return _mask_secrets(shown)
    except (ValueError, TypeError):
        return "<unparseable URL>" if "@" in str(url) else _mask_secrets(str(url))


def _mask_secrets(text: str) -> str:
    for secret in _sorted:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact(text: object) -> str:
    """``text`` (any object, shown with ``str``) with URLs, registered secrets and Authorization
    values masked (see the module docstring). ``None`` stays ``None``-like: returns ``""``. Never raises.

    The one function for every log line, error text, stored error, Dagster metadata value and event.
    """
    if text is None:
        return ""
    s = text if isinstance(text, str) else str(text)
    # Registered secrets first: a secret URL must be masked whole, before its parts are rewritten.
    s = _mask_secrets(s)
    s = _URL_IN_TEXT.sub(_redact_match, s)
    return _AUTH_VALUE.sub(lambda m: f"{m.group(1)} {MASK}", s)


def _redact_match(m: re.Match) -> str:
    url = m.group(0)
    # Prose punctuation after a URL ("see http://h/x?t=1).") is not part of it: keep it visible.
    core = url.rstrip(".,;:!?)]}")
    return redact_url(core) + url[len(core):]


def redact_optional(text: str | None) -> str | None:
    """:func:`redact` that keeps ``None`` (for nullable columns)."""
    return None if text is None else redact(text)


# --- logging -----------------------------------------------------------------------------------------

def _redacting_factory(base):
    def factory(*args, **kwargs) -> logging.LogRecord:
        record = base(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed format string: logging reports it itself, unredacted parts aside
            message = str(record.msg)
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            # Tracebacks quote exception messages (an httpx error may name the URL); format now, redacted.
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return record

    factory.deadline_redacting = True  # type: ignore[attr-defined]
    return factory


def install() -> None:
    """Redact every log record created in this process from now on, and quiet URL-printing loggers.

    Idempotent. Called by the CLI at start-up and when the Dagster definitions are built (code
    servers, run workers, the daemon), so no log line the product's processes write escapes it.
    """
    base = logging.getLogRecordFactory()
    if not getattr(base, "deadline_redacting", False):
        logging.setLogRecordFactory(_redacting_factory(base))
    for name in URL_PRINTING_LOGGERS:
        logger = logging.getLogger(name)
        # INFO of these is one line per request with the full URL; their warnings stay visible.
        if logger.getEffectiveLevel() < logging.WARNING or logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


def register_config_secrets(cfg) -> None:
    """Register the values of every environment variable a configuration names in a ``*_env`` key
    (channels' ``password_env``, ``secret_env``, ``url_env``; sources' ``password_env``, ``token_env``,
    ``headers_env`` …; not ``username_env``), so that whichever code reads them later, no text can
    show them.

    ``cfg``: a pydantic model (walked recursively through models, lists and dicts). Never raises.
    """
    for variable in secret_variables(cfg):
        secret_from_env(variable)


def secret_variables(node) -> list[str]:
    """The environment variable names held by the ``*_env`` keys under ``node`` (a pydantic model,
    list, tuple or dict, walked recursively), in field order; ``username_env`` excluded. A ``*_env``
    key holds one name (a string) or a mapping to names (``headers_env``: header → variable)."""
    from pydantic import BaseModel

    if isinstance(node, BaseModel):
        return [v for name in type(node).model_fields for v in _field_variables(name, getattr(node, name, None))]
    if isinstance(node, dict):
        node = list(node.values())
    if isinstance(node, list | tuple):
        return [v for item in node for v in secret_variables(item)]
    return []


def _field_variables(name: str, value) -> list[str]:
    """The variable names of one model field ``name`` = ``value``: its own when it is a ``*_env`` key,
    else those found under it."""
    if name == "username_env":
        # A user name is not secret, and masking a common word ("deadline", "reader")
        # everywhere would garble every message that contains it.
        return []
    if not name.endswith("_env"):
        return secret_variables(value)
    values = value.values() if isinstance(value, dict) else [value]
    return [v for v in values if isinstance(v, str)]
