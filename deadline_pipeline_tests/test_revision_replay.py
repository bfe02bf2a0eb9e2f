"""Real revision histories replayed through ingest, planning and a maildir sweep, with the clock set
to every reminder instant — and the reminders owed computed by this test itself, from the due
instants in force at each step (not from the outbox):

* ``ai-deadlines-pwc``: the three 2020 revisions in order, then HEAD (as of 2024-03-01, when every
  2020 deadline has passed — a rolling window that must not be quarantined);
* ``ai-deadlines-hf``: every conference file as one source, then the same files with every instant
  shifted a week later (every deadline moves at once).

Asserted: each owed reminder sent exactly once per (due instant, offset, channel) and nothing else;
one correction per subscriber per move after a delivered reminder; a cancellation only for a real
withdrawal after a delivered reminder, never for a rename; every mail in the maildir explained by
exactly one delivered alert.
"""

from __future__ import annotations

import mailbox
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from deadline_pipeline.config import load_config
from deadline_pipeline.ingest.diff import pair_renames
from deadline_pipeline.ingest.parsers import parse_payload
from deadline_pipeline.plan.rule_instant import instant_of
from deadline_pipeline.store.schema import alerts, obligations
from deadline_pipeline.watch.reconcile import reminders_owed
from deadline_pipeline_tests.factories import write_config
from deadline_pipeline_tests.test_watch_checks import cycle

OFFSETS = (-7 * 86400, -86400)
WINDOW = timedelta(minutes=15)  # planning looks back this far (plan.occurrences.window)


@dataclass
class Expected:
    """What the test computed: reminders (lineage, due, offset) → send instant, move and withdrawal
    events that owe a notice, and the instants at which to run the pipeline."""

    reminders: dict[tuple, datetime] = field(default_factory=dict)
    corrections: list[tuple] = field(default_factory=list)
    cancellations: list[tuple] = field(default_factory=list)
    renames: list[tuple] = field(default_factory=list)
    lineage: dict[str, str] = field(default_factory=dict)
    clock: set[datetime] = field(default_factory=set)


def expected_reminders(steps: list[tuple[datetime, bytes]]) -> Expected:
    """Replay ``steps`` ((apply instant, file bytes), chronological) in the model of the product's
    promise: a reminder is owed per due instant in force when its send instant comes; the late ones
    of a new instant fold to the latest (sent at once, if the deadline is still ahead) unless already
    sent for that very instant; a rule whose record fails to parse keeps its instant."""
    exp = Expected()
    prev: dict[str, datetime] = {}  # lineage → due instant in force
    records: dict[str, object] = {}  # current rule id → record
    ever: set[str] = set()  # every rule id seen before this step
    for k, (t, content) in enumerate(steps):
        t_next = steps[k + 1][0] if k + 1 < len(steps) else datetime.max.replace(tzinfo=UTC)
        records = _records_in_force(exp, t, content, records, ever)
        current: dict[str, datetime] = {}
        for rid, r in records.items():
            current[exp.lineage.get(rid, rid)] = instant_of(r)
        delivered_before = {lin for (lin, _d, _o), s in exp.reminders.items() if s < t}
        _owe_cancellations(exp, t, prev, current, delivered_before)
        for lin, due in current.items():
            _owe_for_instant(exp, t, t_next, lin, prev.get(lin), due, lin in delivered_before)
        prev = current
        ever |= set(records)
        exp.clock.add(t)
    exp.clock |= set(exp.reminders.values())
    return exp


def _records_in_force(exp: Expected, t: datetime, content: bytes, records: dict[str, object],
                      ever: set[str]) -> dict[str, object]:
    """The records in force once ``content`` applies at ``t`` (rule id → record): its parsed rules,
    plus those of ``records`` (the step before) held because a record failing to parse may be theirs.
    Renames (a rule gone paired with one that came) are noted in ``exp``."""
    parsed = parse_payload("ai-deadlines", content, source="replay")
    now_rules = {r.rule_id: r for r in parsed.rules if instant_of(r) is not None}
    skipped = [p for p in parsed.problems if p.skipped]
    # A skipped record under an id never seen may be any rule (its id may have changed with it).
    gone = [r for rid, r in records.items() if rid not in now_rules
            and not any(p.may_be(rid, ever) for p in skipped)]
    came = [r for rid, r in now_rules.items() if rid not in records]
    for old, new in pair_renames(gone, came):
        exp.lineage[new.rule_id] = exp.lineage.get(old.rule_id, old.rule_id)
        exp.renames.append((t, old.rule_id, new.rule_id))
    held = {rid: r for rid, r in records.items() if rid not in now_rules and rid not in {g.rule_id for g in gone}}
    return {**held, **now_rules}


def _owe_cancellations(exp: Expected, t: datetime, prev: dict[str, datetime], current: dict[str, datetime],
                       delivered_before: set[str]) -> None:
    """A cancellation per lineage withdrawn at ``t`` whose instant had not passed (within the planning
    window) and that had a reminder delivered."""
    for lin, old_due in prev.items():
        if lin not in current and old_due >= t - WINDOW and lin in delivered_before:
            exp.cancellations.append((t, lin))


def _owe_for_instant(exp: Expected, t: datetime, t_next: datetime, lin: str, old_due: datetime | None,
                     due: datetime, delivered: bool) -> None:
    """What lineage ``lin``, due at ``due`` from step ``t`` (``old_due`` before it) until ``t_next``,
    owes: the reminders whose send instant falls in the step; for a new instant also a correction
    (after a delivered reminder) and the latest late reminder at once if the deadline is ahead."""
    if old_due == due:
        _owe_on_time(exp, lin, due, t, t_next, include_t=True)
        return
    if old_due is not None and (old_due >= t - WINDOW or due >= t - WINDOW) and delivered:
        exp.corrections.append((t, lin, old_due, due))
    if due < t - WINDOW:
        return  # past when it came into force: nothing owed
    late = [o for o in OFFSETS if due + timedelta(seconds=o) <= t]
    if late and due > t:
        latest = max(late)
        if (lin, due, latest) not in exp.reminders:
            exp.reminders[(lin, due, latest)] = t
    _owe_on_time(exp, lin, due, t, t_next, include_t=False)


def _owe_on_time(exp: Expected, lin: str, due: datetime, t: datetime, t_next: datetime, *, include_t: bool) -> None:
    """The reminders of ``lin`` for ``due`` whose send instant falls in the step from ``t`` (included
    only with ``include_t``: an instant new at ``t`` owes the ones at ``t`` as late ones) to ``t_next``."""
    for o in OFFSETS:
        send = due + timedelta(seconds=o)
        if (t <= send if include_t else t < send) and send < t_next:
            exp.reminders.setdefault((lin, due, o), send)


def _setup(tmp_path):
    path = write_config(
        tmp_path,
        sources=[{"name": "conf", "format": "ai-deadlines", "location": "conf.yml", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["conf"], "offsets": ["-P7D", "-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )
    return load_config(path)[0]


def replay(engine, tmp_path, steps: list[tuple[datetime, bytes]]) -> dict:
    """Run the pipeline over ``steps`` at every instant the model names; compare; return figures."""
    exp = expected_reminders(steps)
    cfg = _setup(tmp_path)
    applied = iter(steps)
    pending = next(applied)
    for now in sorted(exp.clock):
        while pending is not None and pending[0] <= now:
            (tmp_path / "conf.yml").write_bytes(pending[1])
            pending = next(applied, None)
        cycle(engine, cfg, now)
    end = max(exp.clock) + timedelta(days=1)
    cycle(engine, cfg, end)
    # The reconciliation, recomputed from the rule versions in force, agrees: nothing owed is missing.
    owed_check = reminders_owed(engine, cfg, end, lookback=timedelta(days=30))
    assert owed_check.passed, owed_check.summary

    with engine.connect() as conn:
        rows = conn.execute(
            select(obligations.c.rule_id, alerts.c.kind, alerts.c.due_at, alerts.c.offset_seconds, alerts.c.status,
                   alerts.c.dedup_key, alerts.c.obligation_id, alerts.c.revision)
            .join(obligations, obligations.c.id == alerts.c.obligation_id)).all()
    delivered = [r for r in rows if r.status == "delivered"]
    sent = {}
    for r in delivered:
        if r.kind == "reminder":
            key = (exp.lineage.get(r.rule_id, r.rule_id), r.due_at, r.offset_seconds)
            sent[key] = sent.get(key, 0) + 1
    assert all(n == 1 for n in sent.values()), {k: n for k, n in sent.items() if n > 1}
    missing = sorted(set(exp.reminders) - set(sent))
    extra = sorted(set(sent) - set(exp.reminders))
    assert not missing and not extra, (missing[:5], extra[:5])
    corrections = [r for r in delivered if r.kind == "correction"]
    assert len({(r.obligation_id, r.revision) for r in corrections}) == len(corrections)
    assert len(corrections) == len(exp.corrections), (len(corrections), exp.corrections)
    cancellations = [r for r in delivered if r.kind == "cancellation"]
    renamed = {exp.lineage.get(new, new) for _t, _old, new in exp.renames}
    assert not [r for r in cancellations if exp.lineage.get(r.rule_id, r.rule_id) in renamed]
    assert len(cancellations) == len(exp.cancellations), (len(cancellations), exp.cancellations)
    # Zero unexplained mails: every message references exactly one delivered alert, and vice versa.
    box = mailbox.Maildir(tmp_path / "maildir", create=False)
    refs = sorted(re.search(r"Reference: (\w+)", m.get_payload(decode=True).decode() if not m.is_multipart()
                            else m.get_payload(0).get_payload(decode=True).decode()).group(1) for m in box)
    assert refs == sorted(r.dedup_key for r in delivered)
    return {"owed": len(exp.reminders), "sent": sum(sent.values()), "corrections": len(corrections),
            "cancellations": len(cancellations), "renames": len(exp.renames), "mails": len(refs),
            "steps": len(steps), "clock": len(exp.clock)}


def test_pwc_revisions_and_head_replayed(shared_dir, engine, tmp_path, capsys):
    folder = shared_dir / "data" / "ai-deadlines-pwc"
    revisions = sorted((folder / "revisions").glob("conferences.*.yml"), key=lambda p: p.name.split(".")[2])
    steps = [(datetime.fromisoformat(p.name.split(".")[2]).replace(tzinfo=UTC), p.read_bytes()) for p in revisions]
    steps.append((datetime(2024, 3, 1, tzinfo=UTC), (folder / "conferences.yml").read_bytes()))
    figures = replay(engine, tmp_path, steps)
    with capsys.disabled():
        print(f"\npwc replay ({engine.dialect.name}): {figures}")
    assert figures["owed"] > 50 and figures["corrections"] >= 1


_STAMP = re.compile(r"(?P<q>['\"]?)(?P<d>\d{4}-\d{1,2}-\d{1,2})(?P<t>[ T]\d{1,2}:\d{2}(?::\d{2})?)?(?P=q)")


def shifted(text: str, delta: timedelta) -> str:
    """``text`` with every written date (and time) moved by ``delta``, in the same spelling."""
    def move(m: re.Match) -> str:
        if m.group("t"):
            fmt = "%Y-%m-%d %H:%M:%S" if m.group("t").count(":") == 2 else "%Y-%m-%d %H:%M"
            when = datetime.strptime(f"{m.group('d')} {m.group('t').strip()}", fmt) + delta
            return f"{m.group('q')}{when.strftime(fmt)}{m.group('q')}"
        when = datetime.strptime(m.group("d"), "%Y-%m-%d") + delta
        return f"{m.group('q')}{when:%Y-%m-%d}{m.group('q')}"
    return _STAMP.sub(move, text)


def test_hf_files_with_every_instant_shifted(shared_dir, engine, tmp_path, capsys):
    files = sorted((shared_dir / "data" / "ai-deadlines-hf" / "conferences").glob("*.yml"))
    text = "\n".join(f.read_text() for f in files)
    start = datetime(2025, 6, 1, tzinfo=UTC)
    steps = [(start, text.encode()),
             (start + timedelta(days=120), shifted(text, timedelta(days=7)).encode())]
    figures = replay(engine, tmp_path, steps)
    with capsys.disabled():
        print(f"\nhf replay ({engine.dialect.name}): {figures}")
    assert figures["corrections"] >= 1 and figures["owed"] > 20
