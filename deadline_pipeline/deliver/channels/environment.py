"""Start-up resolution of the environment variables a configuration names (``*_env`` keys, and
``${VAR}`` references in ``webhook_url``).

Credentials never live in the configuration file: a channel names the variable that holds them
(``username_env``/``password_env`` for SMTP, ``secret_env`` for webhooks, ``url_env`` for Slack).
A variable that is unset was, before this check, found only at send time, and every due alert on
that channel was escalated as a permanent failure: a configuration mistake turned into a page per
alert. Resolving every named variable before anything is sent stops the run instead, with one
message naming the variable and the channel, and leaves the alerts untouched for the next run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvProblem:
    """One unusable ``*_env`` entry: ``channel`` (its key in ``channels``), ``key`` (e.g.
    ``secret_env``), ``variable`` (the name it gives, or ``None`` when the key is missing)."""

    channel: str
    key: str
    variable: str | None
    reason: str
    #: Where the variable is named when it is not a channel key: ``subscribers (ana).webhook_url``.
    where: str | None = None

    def __str__(self) -> str:
        return f"{self.where or f'channels.{self.channel}.{self.key}'}: {self.reason}"


def env_keys(channel_cfg) -> dict[str, str | None]:
    """``*_env`` key → variable name for one channel configuration (any pydantic channel model);
    keys left unset (``None``) are left out."""
    fields = type(channel_cfg).model_fields
    return {k: getattr(channel_cfg, k) for k in fields if k.endswith("_env") and getattr(channel_cfg, k) is not None}


def unresolved_env(cfg, environ: Mapping[str, str] | None = None) -> list[EnvProblem]:
    """Every ``*_env`` variable named by ``cfg.channels`` that is unset or empty in ``environ``
    (default ``os.environ``), an SMTP login configured by half (only one of ``username_env`` /
    ``password_env``) or holding a value SMTP AUTH cannot send (:func:`login_text_problem`), and
    every ``${VAR}`` in a subscriber's or the escalation's ``webhook_url`` whose variable is unset or
    empty (when a webhook channel is configured). Empty list = every credential resolves. Raises
    nothing."""
    env = os.environ if environ is None else environ
    problems: list[EnvProblem] = []
    for name, ch in sorted(cfg.channels.items()):
        named = env_keys(ch)
        for key, var in sorted(named.items()):
            if not env.get(var):
                problems.append(EnvProblem(name, key, var, f"environment variable {var} is not set "
                                           f"(channel {name!r}, {ch.type})"))
        if getattr(ch, "type", None) == "smtp":
            problems += _smtp_login_problems(name, named, env)
    problems += _unresolved_url_refs(cfg, env)
    return problems


def login_text_problem(value: str) -> str | None:
    """Why ``value`` (a user name or password read from the environment) cannot be sent in SMTP
    AUTH, or ``None`` when it can.

    Every mechanism the smtp channel uses carries any Unicode text as UTF-8: PLAIN by RFC 4616 §2,
    LOGIN as the base64 of the bytes (RFC 4954 §4), CRAM-MD5 as the HMAC key (RFC 2195 §2, see
    :meth:`~deadline_pipeline.deliver.channels.smtp._BoundedSMTP.auth_cram_md5`). What none can
    carry is a value that is not text: bytes set in another encoding (``contrase\\xf1a`` in Latin-1)
    reach Python as lone surrogates (PEP 383), which have no UTF-8 form. The problem never quotes
    the value: it is a secret.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"is not valid UTF-8 text (a byte at position {exc.start} of its value is not UTF-8: was it "
                "set in another encoding, e.g. Latin-1?); SMTP AUTH sends user names and passwords as UTF-8 "
                "(RFC 4616 §2, RFC 4954 §4)")
    return None


def _smtp_login_problems(name: str, named: dict[str, str], env: Mapping[str, str]) -> list[EnvProblem]:
    """The problems of an smtp channel's login: only one of ``username_env`` / ``password_env``
    named, or a set value that SMTP AUTH cannot carry (:func:`login_text_problem`). Found at send
    time, the second failed every alert of the channel (it was reported as a non-ASCII address)."""
    problems = []
    if len({"username_env", "password_env"} & set(named)) == 1:
        missing = "password_env" if "username_env" in named else "username_env"
        problems.append(EnvProblem(name, missing, None, f"channel {name!r} (smtp) names only one of "
                                   "username_env / password_env; login needs both"))
    for key in ("username_env", "password_env"):
        var = named.get(key)
        problem = login_text_problem(env.get(var) or "") if var else None
        if problem:
            problems.append(EnvProblem(name, key, var, f"environment variable {var} {problem} "
                                       f"(channel {name!r}, smtp)"))
    return problems


def _unresolved_url_refs(cfg, env: Mapping[str, str]) -> list[EnvProblem]:
    """``${VAR}`` references in the ``webhook_url`` of subscribers and of ``escalation`` whose variable
    is unset or empty, when a webhook channel is configured (the only sender that expands them). Found
    at send time, each was a permanent failure: every alert to that subscriber escalated."""
    from deadline_pipeline.security.redact import _ENV_REF  # the pattern the webhook sender expands

    webhook = sorted(name for name, ch in cfg.channels.items() if getattr(ch, "type", None) == "webhook")
    if not webhook:
        return []
    owners = [(f"subscribers ({s.id}).webhook_url", s.webhook_url) for s in cfg.subscribers]
    owners.append(("escalation.webhook_url", cfg.escalation.webhook_url))
    problems = []
    for where, url in owners:
        for var in dict.fromkeys(_ENV_REF.findall(url or "")):
            if not env.get(var):
                problems.append(EnvProblem(webhook[0], "webhook_url", var, f"environment variable {var} "
                                           f"(referenced in webhook_url) is not set", where=where))
    return problems


def require_env(cfg, environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`~deadline_pipeline.config.ConfigError` listing every problem of
    :func:`unresolved_env`; return quietly when there is none."""
    problems = unresolved_env(cfg, environ)
    if problems:
        from deadline_pipeline.config import ConfigError

        raise ConfigError("\n".join(str(p) for p in problems) +
                          "\nnothing was sent: set the variable(s) and run again")
