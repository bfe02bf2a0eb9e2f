"""Loading a configuration file: read, expand, merge the subscriber file, validate, cross-check."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import ValidationError

from deadline_pipeline.addresses import address_problems
from deadline_pipeline.config.document import line_of, parse_yaml
from deadline_pipeline.config.encoding import utf8_text
from deadline_pipeline.config.environment import UnsetVariable, expand_path
from deadline_pipeline.config.errors import ConfigError
from deadline_pipeline.config.messages import format_loc, shown_input, wording
from deadline_pipeline.config.sections import DeadlinesConfig, SubscriberConfig
from deadline_pipeline.config.subscribers_csv import SubscriberFileUnreadable, read_subscribers_csv
from deadline_pipeline.security.redact import register_config_secrets

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
    whose tenant differs from a source's only in letter case (:func:`tenant_problems`). A subscriber
    file that cannot be read is one more line among the validation errors (:func:`_validated`).
    """
    path = Path(path or os.environ.get("DEADLINE_CONFIG") or DEFAULT_CONFIG_NAME).resolve()
    raw, root = read_document(path)
    check_sections(raw, path)
    # Where each subscriber was written, for errors found after validation (addresses × channels).
    origins = {sub.get("id"): f"{path}: subscribers[{i}]" for i, sub in enumerate(raw.get("subscribers") or [])
               if isinstance(sub, dict)}
    expand_paths(raw, path)
    unreadable = None
    if isinstance(raw.get("subscribers_csv"), str):
        try:
            origins.update(merge_subscribers_csv(raw, path))
        except SubscriberFileUnreadable as exc:
            line = line_of(root, ("subscribers_csv",)) if root is not None else None
            unreadable = f"{path}: subscribers_csv: {exc.reason}" + (f" [line {line}]" if line else "")
    return _validated(raw, path, root, origins, unreadable), path


def _validated(raw: dict, path: Path, root: yaml.Node | None, origins: dict[str, str],
               unreadable: str | None) -> DeadlinesConfig:
    """:func:`validate` and :func:`check_loaded` of the expanded document ``raw``. ``unreadable``: the
    error line of a subscriber file that could not be read, else None; it is raised together with
    the other errors found (a missing file hid a misspelt key until it was fixed, one error per run),
    and the subscriptions' subscriber ids are then not checked (the file may hold them)."""
    try:
        cfg = validate(raw, path, root, ids_unknown=unreadable is not None)
        check_loaded(cfg, origins, path)
    except ConfigError as exc:
        if unreadable is None:
            raise
        # Empty when the only errors were subscriber ids the unread file may hold (validate).
        raise ConfigError("\n".join(line for line in (unreadable, str(exc)) if line)) from None
    if unreadable is not None:
        raise ConfigError(unreadable)
    return cfg


def read_document(path: Path) -> tuple[dict, yaml.Node | None]:
    """The configuration file at ``path`` as a mapping of sections (``{}`` for an empty file), and
    its composed YAML root node (``None`` for an empty file), which knows each value's line.
    Raises :class:`ConfigError` naming ``path`` for a missing or unreadable file, bytes that are not
    UTF-8, invalid YAML, or a document that is not a mapping."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file does not exist") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read configuration: {exc}") from None
    raw, root = parse_yaml(utf8_text(data, path), path)
    if raw is None:
        return {}, None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: (top level): expected a mapping of sections, got {type(raw).__name__}")
    return raw, root


# What each section must be, checked before anything walks the document: `channels:` written as a
# list failed with "AttributeError: 'list' object has no attribute 'values'", `sources: 5` with
# "TypeError: 'int' object is not iterable", in every command that loads the configuration.
_SECTION_SHAPES: dict[str, tuple[type, str]] = {
    "sources": (list, "a list of sources"),
    "subscribers": (list, "a list of subscribers"),
    "subscriptions": (list, "a list of subscriptions"),
    "channels": (dict, "a mapping of channel names to their settings"),
}


def check_sections(raw: dict, path: Path) -> None:
    """Raise :class:`ConfigError` naming ``path`` and each section of the parsed document ``raw``
    that is present but not the list or mapping it must be (:data:`_SECTION_SHAPES`)."""
    problems = [f"{path}: {key}: expected {what}, got {_kind(raw[key])}"
                for key, (shape, what) in _SECTION_SHAPES.items()
                if raw.get(key) is not None and not isinstance(raw[key], shape)]
    if problems:
        raise ConfigError("\n".join(problems))


def _kind(value) -> str:
    """How an unexpected value is named in a message: ``a list``, ``a mapping``, else its repr (cut)."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def expand_paths(raw: dict, path: Path) -> None:
    """Expand variables in, and make absolute against the folder of the configuration file ``path``,
    every source ``location`` and channel ``path`` of the parsed document ``raw``, in place
    (:func:`expand_path`). Values that are not text are left for validation to refuse. Raises
    :class:`ConfigError` naming ``path``, the key and the variable for each unset or empty variable."""
    problems: list[str] = []

    def expand(section: dict, field: str, key: str) -> None:
        if isinstance(section, dict) and isinstance(section.get(field), str):
            try:
                section[field] = expand_path(section[field], path.parent)
            except UnsetVariable as exc:
                problems.append(f"{path}: {key}: {exc}")

    for i, src in enumerate(raw.get("sources") or []):
        expand(src, "location", f"sources[{i}].location")
    for name, ch in (raw.get("channels") or {}).items():
        expand(ch, "path", f"channels.{name}.path")
    expand(raw, "subscribers_csv", "subscribers_csv")
    if problems:
        raise ConfigError("\n".join(problems))


def merge_subscribers_csv(raw: dict, path: Path) -> dict[str, str]:
    """Append the subscribers of the document's ``subscribers_csv`` file to ``raw["subscribers"]``, in
    place (the file name becomes absolute). Returns subscriber id → ``FILE: line N`` for the appended
    rows. Raises :class:`ConfigError` naming the CSV file and line for an unreadable file
    (:func:`read_subscribers_csv`), an id also in the configuration's own list, or an invalid row."""
    csv_path = Path(raw["subscribers_csv"])  # already expanded and absolute (expand_paths)
    raw["subscribers_csv"] = str(csv_path)
    from_csv = read_subscribers_csv(csv_path, path)
    problems = ids_also_inline(from_csv, raw.get("subscribers") or [], csv_path, path)
    if problems:
        raise ConfigError("\n".join(problems))
    extra = csv_subscribers(from_csv, csv_path)
    raw["subscribers"] = list(raw.get("subscribers") or []) + [e.model_dump() for e in extra]
    return {r.get("id"): f"{csv_path}: line {line}" for line, r in from_csv}


def ids_also_inline(from_csv: list[tuple[int, dict]], inline_list: list, csv_path: Path, path: Path) -> list[str]:
    """One line per CSV row (``(line, row)``) whose id is also in the configuration's own
    ``subscribers:`` list ``inline_list``, naming both places; empty when there is none."""
    inline = {sub["id"]: i for i, sub in enumerate(inline_list)
              if isinstance(sub, dict) and isinstance(sub.get("id"), str)}
    # Checked here, with the CSV line: after merging, the repeat was reported against the
    # configuration file alone ("subscribers: ids repeat"), which holds only one of the copies.
    return [f"{csv_path}: line {line}: id {r['id']!r} is also in the configuration's `subscribers:` "
            f"list ({path}: subscribers[{inline[r['id']]}])" for line, r in from_csv if r.get("id") in inline]


def csv_subscribers(from_csv: list[tuple[int, dict]], csv_path: Path) -> list[SubscriberConfig]:
    """The CSV rows (``(line, row)``) validated as subscribers, in order. Raises :class:`ConfigError`
    with one line per problem, each naming the file, line, id and column."""
    extra, problems = [], []
    for line, r in from_csv:
        try:
            extra.append(SubscriberConfig.model_validate(r))
        except ValidationError as exc:
            problems += [f"{csv_path}: line {line} (id {r.get('id')!r}), column "
                         f"{'.'.join(str(x) for x in err['loc']) or '(row)'}: {wording(err)}" for err in exc.errors()]
    if problems:
        raise ConfigError("\n".join(problems))
    return extra


def validate(raw: dict, path: Path, root: yaml.Node | None = None, ids_unknown: bool = False) -> DeadlinesConfig:
    """``raw`` (the expanded document) as a :class:`DeadlinesConfig`. Raises :class:`ConfigError` with
    one line per problem: ``FILE: key.path: message (got value) [line N]`` (:func:`error_line`; the
    line from ``root``, the document's YAML node, when the value is written in the file).
    ``ids_unknown``: the subscriber file could not be read, so a subscription's subscriber id that
    names no subscriber is not reported (the file may hold it; its error is reported instead)."""
    try:
        return DeadlinesConfig.model_validate(raw)
    except ValidationError as exc:
        errors = [err for err in exc.errors() if not (ids_unknown and _names_a_subscriber(err))]
        raise ConfigError("\n".join(error_line(err, path, root) for err in errors)) from None


def _names_a_subscriber(err: dict) -> bool:
    """Whether the pydantic error ``err`` is a subscription's subscriber id naming no subscriber
    (``subscriptions[i].subscribers[j]``, raised by the configuration's reference check)."""
    loc = err["loc"]
    return (err["type"] == "config_agreement" and len(loc) == 4 and loc[0] == "subscriptions"
            and loc[2] == "subscribers")


def error_line(err: dict, path: Path, root: yaml.Node | None = None) -> str:
    """One pydantic error ``err`` as ``FILE: key.path: message (got value) [line N]``; the rejected
    value is left out when it is a mapping or list (the whole section would be printed), the line
    when the value is not in the file (:func:`~deadline_pipeline.config.document.line_of`). The line
    lets an editor jump to a value several screens into a long file (only syntax errors had one)."""
    loc = format_loc(err["loc"]) if err["loc"] else "configuration"
    got = shown_input(err)
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    line = line_of(root, tuple(err["loc"])) if root is not None else None
    where = f" [line {line}]" if line else ""
    return f"{path}: {loc}: {wording(err)}{shown}{where}"


def check_loaded(cfg: DeadlinesConfig, origins: dict[str, str], path: Path) -> None:
    """The checks of a validated configuration that need all of it: at least one source, subscriber
    ids unique, tenants that differ only in case (:func:`tenant_problems`) and undeliverable
    addresses (:func:`~deadline_pipeline.addresses.address_problems`). Registers every ``*_env``
    value as a secret. Raises :class:`ConfigError` naming ``path`` (or the CSV line) per problem."""
    if not cfg.sources:
        # An empty or truncated file is a mistake, never an intent: refuse it before anything runs.
        raise ConfigError(f"{path}: sources: none configured; a configuration needs at least one source "
                          "(see examples/deadlines.yaml)")
    ids = [s.id for s in cfg.subscribers]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"{path}: subscribers: ids repeat: {dupes}")
    # Every value behind a *_env key is masked in any text this process writes from now on.
    register_config_secrets(cfg)
    problems = tenant_problems(cfg, origins) + address_problems(cfg, origins)
    if problems:
        raise ConfigError("\n".join(p if p.startswith(str(path)) or ": line " in p else f"{path}: {p}"
                                     for p in problems))
