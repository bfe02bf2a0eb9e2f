"""Loading a configuration file: read, expand, merge the subscriber file, validate, cross-check."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from deadline_pipeline.config.document import parse_yaml
from deadline_pipeline.config.encoding import utf8_text
from deadline_pipeline.config.environment import expand_path
from deadline_pipeline.config.errors import ConfigError
from deadline_pipeline.config.messages import did_you_mean, format_loc
from deadline_pipeline.config.sections import DeadlinesConfig, SubscriberConfig
from deadline_pipeline.config.subscribers_csv import read_subscribers_csv

DEFAULT_CONFIG_NAME = "deadlines.yaml"


def tenant_problems(cfg: DeadlinesConfig, origins: dict[str, str]) -> list[str]:
    """One line per subscriber whose tenant is no source's tenant but differs from one only in letter
    case (``Acme`` against a source's ``acme``), naming where the subscriber was written (``origins``:
    subscriber id → ``FILE: line N`` or ``FILE: subscribers[i]``), its tenant and the source tenant(s)
    it nearly matches. Empty when there is none.

    Tenants are compared exactly (a source's reminders are for its own tenant only), so such a
    subscriber was never planned for the source: no reminder, exit 0, and no warning whenever another
    subscriber of the source's exact tenant existed (the "reaches no subscriber" problem needs all of
    them to miss). A tenant that matches a source's exactly, or no source's at all even ignoring case
    (a tenant without sources yet), is not refused here.
    """
    by_folded: dict[str, dict[str, list[str]]] = {}
    for src in cfg.sources:
        by_folded.setdefault(src.tenant.casefold(), {}).setdefault(src.tenant, []).append(src.name)
    exact = {src.tenant for src in cfg.sources}
    problems = []
    for sub in cfg.subscribers:
        near = by_folded.get(sub.tenant.casefold(), {})
        if sub.tenant in exact or not near:
            continue
        where = origins.get(sub.id, f"subscribers ({sub.id})")
        of = "; ".join(f"source(s) {names} have tenant {tenant!r}" for tenant, names in sorted(near.items()))
        meant = " or ".join(repr(t) for t in sorted(near))
        problems.append(f"{where}: subscriber {sub.id!r}: tenant {sub.tenant!r} is no source's tenant, but differs "
                        f"only in letter case from one ({of}); tenants are compared exactly, so this subscriber "
                        f"would get none of their reminders; did you mean {meant}?")
    return problems


def load_config(path: str | os.PathLike | None = None) -> tuple[DeadlinesConfig, Path]:
    """Read and validate a configuration file.

    ``path`` defaults to ``$DEADLINE_CONFIG``, then ``./deadlines.yaml``. Returns the validated
    configuration (with paths resolved) and the file's absolute path.

    Raises :class:`ConfigError` for a missing file, invalid YAML (with line and column), a value
    that fails validation (with the key path, e.g. ``subscriptions[0].offsets``), or a subscriber
    whose tenant differs from a source's only in letter case (:func:`tenant_problems`).
    """
    path = Path(path or os.environ.get("DEADLINE_CONFIG") or DEFAULT_CONFIG_NAME).resolve()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file does not exist") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read configuration: {exc}") from None
    text = utf8_text(data, path)
    raw = parse_yaml(text, path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: (top level): expected a mapping of sections, got {type(raw).__name__}")

    base = path.parent
    # Where each subscriber was written, for errors found after validation (addresses × channels).
    origins = {sub.get("id"): f"{path}: subscribers[{i}]" for i, sub in enumerate(raw.get("subscribers") or [])
               if isinstance(sub, dict)}
    for src in raw.get("sources") or []:
        if isinstance(src, dict) and isinstance(src.get("location"), str):
            src["location"] = expand_path(src["location"], base)
    for ch in (raw.get("channels") or {}).values():
        if isinstance(ch, dict) and isinstance(ch.get("path"), str):
            ch["path"] = expand_path(ch["path"], base)
    if isinstance(raw.get("subscribers_csv"), str):
        csv_path = Path(expand_path(raw["subscribers_csv"], base))
        raw["subscribers_csv"] = str(csv_path)
        from_csv = read_subscribers_csv(csv_path, path)
        inline = {sub["id"]: i for i, sub in enumerate(raw.get("subscribers") or [])
                  if isinstance(sub, dict) and isinstance(sub.get("id"), str)}
        # Checked here, with the CSV line: after merging, the repeat was reported against the
        # configuration file alone ("subscribers: ids repeat"), which holds only one of the copies.
        problems = [f"{csv_path}: line {line}: id {r['id']!r} is also in the configuration's `subscribers:` "
                    f"list ({path}: subscribers[{inline[r['id']]}])" for line, r in from_csv if r.get("id") in inline]
        if problems:
            raise ConfigError("\n".join(problems))
        extra = []
        for line, r in from_csv:
            try:
                extra.append(SubscriberConfig.model_validate(r))
            except ValidationError as exc:
                for err in exc.errors():
                    col = ".".join(str(x) for x in err["loc"]) or "(row)"
                    msg = err["msg"].removeprefix("Value error, ")
                    problems.append(f"{csv_path}: line {line} (id {r.get('id')!r}), column {col}: {msg}")
        if problems:
            raise ConfigError("\n".join(problems))
        raw["subscribers"] = list(raw.get("subscribers") or []) + [e.model_dump() for e in extra]
        origins.update({r.get("id"): f"{csv_path}: line {line}" for line, r in from_csv})

    try:
        cfg = DeadlinesConfig.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = format_loc(err["loc"]) if err["loc"] else "configuration"
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
            if err["type"] == "extra_forbidden" and err["loc"]:
                msg = "unknown key" + did_you_mean(err["loc"][-1], tuple(err["loc"]))
            lines.append(f"{path}: {loc}: {msg}{shown}")
        raise ConfigError("\n".join(lines)) from None
    if not cfg.sources:
        # An empty or truncated file is a mistake, never an intent: refuse it before anything runs.
        raise ConfigError(f"{path}: sources: none configured; a configuration needs at least one source "
                          "(see examples/deadlines.yaml)")
    ids = [s.id for s in cfg.subscribers]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"{path}: subscribers: ids repeat: {dupes}")
    from deadline_pipeline.security.redact import register_config_secrets

    # Every value behind a *_env key is masked in any text this process writes from now on.
    register_config_secrets(cfg)
    from deadline_pipeline.addresses import address_problems

    problems = tenant_problems(cfg, origins) + address_problems(cfg, origins)
    if problems:
        raise ConfigError("\n".join(p if p.startswith(str(path)) or ": line " in p else f"{path}: {p}"
                                     for p in problems))
    return cfg, path
