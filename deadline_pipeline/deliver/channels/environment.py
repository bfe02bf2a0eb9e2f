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
    ``password_env``), and every ``${VAR}`` in a subscriber's or the escalation's ``webhook_url``
    whose variable is unset or empty (when a webhook channel is configured). Empty list = every
    credential resolves. Raises nothing."""
    env = os.environ if environ is None else environ
    problems: list[EnvProblem] = []
    for name, ch in sorted(cfg.channels.items()):
        named = env_keys(ch)
        for key, var in sorted(named.items()):
            if not env.get(var):
                problems.append(EnvProblem(name, key, var, f"environment variable {var} is not set "
                                           f"(channel {name!r}, {ch.type})"))
        if getattr(ch, "type", None) == "smtp" and len({"username_env", "password_env"} & set(named)) == 1:
            missing = "password_env" if "username_env" in named else "username_env"
            problems.append(EnvProblem(name, missing, None, f"channel {name!r} (smtp) names only one of "
                                       "username_env / password_env; login needs both"))
    problems += _unresolved_url_refs(cfg, env)
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
