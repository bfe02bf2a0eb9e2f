"""What changed between two snapshots of one source, in the words an operator checks (pure, no I/O).

:func:`diff_snapshots` compares two lists of :class:`~deadline_pipeline.rules.RuleRecord` by rule
identity (``rule_id``) and sorts every rule into exactly one bucket:

* **added**: only in the new list;
* **renamed**: a rule that left the old list and a rule that entered the new one, paired as one rule
  whose id changed (see "Renames" below) — a move of identity, not a withdrawal plus an addition;
* **unparsed**: only in the old list, but a record of the new snapshot that failed to parse may be
  it (given the new snapshot's parse problems): it is kept in force, not withdrawn;
* **withdrawn**: only in the old list, and no skipped record of the new snapshot may be it;
* **moved**: in both, and *when* it is due differs;
* **reworded**: in both, due at the same time, but some other field differs (title, link, note, or
  the zone's *spelling*: ``UTC-12`` → ``AoE`` is the same instant, so it is reworded, not moved);
* **unchanged**: identical (only counted).

"When it is due" is compared as follows:

* a one-off rule with a zone: its UTC instant, computed exactly as planning does
  (:func:`~deadline_pipeline.plan.rule_instant.instant_of`:
  :func:`~deadline_pipeline.plan.occurrences.to_instant` in the zone from
  :func:`~deadline_pipeline.timezones.resolve_zone`; a date-only rule is due at the end of that day);
* a floating one-off rule (no zone; planning reads it in each subscriber's zone): its local start;
* a recurring rule: its rule fields (start, RRULE, EXDATEs, RDATEs) and the zone it resolves to —
  its occurrences are many, so the series itself is compared, and two spellings of one zone are one
  zone.

A rule whose zone cannot be resolved (a snapshot written before a zone was known, or a bad record
that slipped in) is compared by its spelling instead, so the diff never raises on odd data; the
change then carries no instants.

Renames (:func:`pair_renames`). A rule that disappears and a rule that appears in the same revision
are one renamed rule when all of these hold:

1. they are due at the same time ("when it is due" as above: the same UTC instant, the same floating
   local time, or the same series);
2. they are the same kind of rule: the same ``kind`` and, when the source says, the same deadline
   type (``extra.deadline_type``: an abstract deadline never pairs with a paper deadline);
3. they still name the same thing by one of: the same title, the same edition (``extra.edition_id``)
   or the same non-empty URL — so two unrelated deadlines that merely share an instant never pair;
4. the pairing is unambiguous: exactly one disappearing and one appearing rule share (1) and (2).

Anything else stays a withdrawal plus an addition. A renamed rule keeps its history: its obligations
(and the reminders delivered for them) carry over, because planning keys them on the rule's
*lineage* — the id it first had — instead of its current id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from deadline_pipeline.plan.rule_instant import instant_of, rule_zone
from deadline_pipeline.rules import RuleRecord

# Fields that say *what* a rule is called or links to; changing only these rewords a rule.
DESCRIPTIVE_FIELDS = ("title", "kind", "url", "note", "tz")


@dataclass(frozen=True)
class RuleChange:
    """One rule that differs between the two snapshots.

    ``change``: ``added`` | ``moved`` | ``withdrawn`` | ``reworded``. ``old``/``new``: the record on
    each side (``None`` on the side where the rule is absent). ``old_when``/``new_when``: when it is
    due, as shown to an operator (``2020-02-15T11:59:00Z`` for an instant, ``2020-02-15T23:59:00
    (floating)`` for a floating time, ``FREQ=… from … in …`` for a series). ``old_instant`` /
    ``new_instant``: the aware UTC instant of a one-off rule with a known zone, else ``None``.
    ``fields``: names of the record fields that differ (empty for added and withdrawn rules).
    """

    rule_id: str
    change: str
    old: RuleRecord | None = None
    new: RuleRecord | None = None
    old_when: str | None = None
    new_when: str | None = None
    old_instant: datetime | None = None
    new_instant: datetime | None = None
    fields: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """A JSON-safe dict (instants as ISO 8601 UTC with a ``Z``)."""
        return {
            "rule_id": self.rule_id,
            "change": self.change,
            "old_when": self.old_when,
            "new_when": self.new_when,
            "old_instant": _z(self.old_instant),
            "new_instant": _z(self.new_instant),
            "fields": list(self.fields),
            "old_title": self.old.title if self.old else None,
            "new_title": self.new.title if self.new else None,
        }


@dataclass
class SnapshotDiff:
    """The changes between two snapshots, each list sorted by ``rule_id``; ``unchanged`` is a count."""

    added: list[RuleChange] = field(default_factory=list)
    moved: list[RuleChange] = field(default_factory=list)
    withdrawn: list[RuleChange] = field(default_factory=list)
    reworded: list[RuleChange] = field(default_factory=list)
    # ``rule_id`` is the new id; ``old.rule_id`` the old one.
    renamed: list[RuleChange] = field(default_factory=list)
    unparsed: list[RuleChange] = field(default_factory=list)
    unchanged: int = 0

    @property
    def is_empty(self) -> bool:
        return not (self.added or self.moved or self.withdrawn or self.reworded or self.renamed or self.unparsed)

    def to_json(self) -> dict:
        return {
            "added": [c.to_json() for c in self.added],
            "moved": [c.to_json() for c in self.moved],
            "withdrawn": [c.to_json() for c in self.withdrawn],
            "reworded": [c.to_json() for c in self.reworded],
            "renamed": [{**c.to_json(), "old_rule_id": c.old.rule_id} for c in self.renamed],
            "unparsed": [c.to_json() for c in self.unparsed],
            "unchanged": self.unchanged,
        }


def _z(value: datetime | None) -> str | None:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if value is not None else None


def _when(rule: RuleRecord) -> tuple[object, str, datetime | None]:
    """(comparison key, text for operators, instant or None) of when ``rule`` is due."""
    zone = rule_zone(rule)
    # An unknown zone compares by spelling: two different unknown spellings are a change we show.
    zone_key: object = zone if zone is not None else ("unresolved", rule.tz)
    if rule.rrule or rule.rdates:
        key = ("series", rule.start, zone_key, rule.rrule, tuple(sorted(rule.exdates)), tuple(sorted(rule.rdates)))
        text = f"{rule.rrule or 'RDATE'} from {rule.start} in {rule.tz or 'floating time'}"
        return key, text, None
    try:
        instant = instant_of(rule)
    except ValueError:
        instant = None
    if instant is not None:
        return ("instant", instant), _z(instant), instant
    if rule.tz is None:
        return ("floating", rule.start), f"{rule.start} (floating)", None
    return ("local", rule.start, zone_key), f"{rule.start} in {rule.tz} (unknown zone)", None


def _differing_fields(old: RuleRecord, new: RuleRecord) -> tuple[str, ...]:
    names = ("title", "start", "tz", "rrule", "exdates", "rdates", "kind", "url", "note", "extra")
    return tuple(n for n in names if getattr(old, n) != getattr(new, n))


def _by_id(rules: list[RuleRecord]) -> dict[str, RuleRecord]:
    # The first record of a repeated id wins, as in rule versioning (the parser reports the repeat).
    out: dict[str, RuleRecord] = {}
    for r in rules:
        out.setdefault(r.rule_id, r)
    return out


def _rename_key(rule: RuleRecord) -> tuple:
    return (_when(rule)[0], rule.kind, (rule.extra or {}).get("deadline_type"))


def _same_thing(a: RuleRecord, b: RuleRecord) -> bool:
    ea, eb = a.extra or {}, b.extra or {}
    return (a.title == b.title or (ea.get("edition_id") is not None and ea.get("edition_id") == eb.get("edition_id"))
            or (bool(a.url) and a.url == b.url))


def pair_renames(gone: list[RuleRecord], appeared: list[RuleRecord]) -> list[tuple[RuleRecord, RuleRecord]]:
    """(old, new) pairs of one rule whose id changed, by the matching rule of the module docstring:
    same due time, same kind, still naming the same thing, and unambiguous. Pure; never raises."""
    by_key_old: dict[tuple, list[RuleRecord]] = {}
    by_key_new: dict[tuple, list[RuleRecord]] = {}
    for r in gone:
        by_key_old.setdefault(_rename_key(r), []).append(r)
    for r in appeared:
        by_key_new.setdefault(_rename_key(r), []).append(r)
    pairs = []
    for key, olds in by_key_old.items():
        news = by_key_new.get(key, [])
        if len(olds) == 1 and len(news) == 1 and _same_thing(olds[0], news[0]):
            pairs.append((olds[0], news[0]))
    return sorted(pairs, key=lambda p: p[1].rule_id)


def diff_snapshots(old: list[RuleRecord], new: list[RuleRecord], new_problems: list | None = None) -> SnapshotDiff:
    """Sort every rule of ``old`` and ``new`` into added / moved / withdrawn / reworded / renamed /
    unparsed / unchanged (see the module docstring). ``new_problems``: the new snapshot's parse
    problems (:class:`~deadline_pipeline.ingest.parsers.base.ParseProblem`), so that a rule whose
    record failed to parse is shown as unparsed, not withdrawn. Order of the input lists does not
    matter. Never raises."""
    out = _diff(old, new)
    skipped = [p for p in new_problems or () if p.skipped]
    if skipped:
        known = [r.rule_id for r in old]
        keep = [c for c in out.withdrawn if any(p.may_be(c.rule_id, known) for p in skipped)]
        out.unparsed = keep
        out.withdrawn = [c for c in out.withdrawn if c not in keep]
    pairs = pair_renames([c.old for c in out.withdrawn], [c.new for c in out.added])
    if pairs:
        gone = {o.rule_id for o, _n in pairs}
        came = {n.rule_id for _o, n in pairs}
        for o, n in pairs:
            _k, text, inst = _when(n)
            out.renamed.append(RuleChange(n.rule_id, "renamed", o, n, text, text, inst, inst,
                                          _differing_fields(o, n) + ("rule_id",)))
        out.withdrawn = [c for c in out.withdrawn if c.rule_id not in gone]
        out.added = [c for c in out.added if c.rule_id not in came]
    return out


def _diff(old: list[RuleRecord], new: list[RuleRecord]) -> SnapshotDiff:
    before, after = _by_id(old), _by_id(new)
    out = SnapshotDiff()
    for rid in sorted(before.keys() | after.keys()):
        o, n = before.get(rid), after.get(rid)
        if o is None:
            _k, text, inst = _when(n)
            out.added.append(RuleChange(rid, "added", None, n, None, text, None, inst))
            continue
        if n is None:
            _k, text, inst = _when(o)
            out.withdrawn.append(RuleChange(rid, "withdrawn", o, None, text, None, inst, None))
            continue
        fields = _differing_fields(o, n)
        if not fields:
            out.unchanged += 1
            continue
        ok, otext, oinst = _when(o)
        nk, ntext, ninst = _when(n)
        kind = "moved" if ok != nk else "reworded"
        (out.moved if kind == "moved" else out.reworded).append(
            RuleChange(rid, kind, o, n, otext, ntext, oinst, ninst, fields))
    return out


def format_diff(diff: SnapshotDiff, *, header: str = "") -> str:
    """The diff as plain text for a terminal: one section per kind of change, one line per rule."""
    lines = [header] if header else []
    lines.append(f"added {len(diff.added)}, moved {len(diff.moved)}, withdrawn {len(diff.withdrawn)}, "
                 f"reworded {len(diff.reworded)}, unchanged {diff.unchanged}"
                 + (f", renamed {len(diff.renamed)}" if diff.renamed else "")
                 + (f", unparsed {len(diff.unparsed)} (kept in force)" if diff.unparsed else ""))
    for c in diff.added:
        lines.append(f"  + added      {c.rule_id}  {c.new_when}  {c.new.title!r}")
    for c in diff.moved:
        lines.append(f"  ~ moved      {c.rule_id}  {c.old_when} -> {c.new_when}")
    for c in diff.withdrawn:
        lines.append(f"  - withdrawn  {c.rule_id}  {c.old_when}  {c.old.title!r}")
    for c in diff.renamed:
        lines.append(f"  > renamed    {c.old.rule_id} -> {c.rule_id}  {c.new_when}")
    for c in diff.unparsed:
        lines.append(f"  ! unparsed   {c.rule_id}  {c.old_when}  its record failed to parse; last good version kept")
    for c in diff.reworded:
        shown = ", ".join(
            f"{f}: {getattr(c.old, f)!r} -> {getattr(c.new, f)!r}" for f in c.fields if f in DESCRIPTIVE_FIELDS
        ) or ", ".join(c.fields)
        lines.append(f"  = reworded   {c.rule_id}  {shown}")
    return "\n".join(lines)
