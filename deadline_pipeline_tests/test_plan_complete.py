"""Planning problems are red, not log lines: the ``plan_complete`` check, the watchdog row and the
exit code of ``run`` (SQLite and PostgreSQL), and the watchers' bounded reading of a rule planning
refuses (a ``FREQ=SECONDLY`` rule hung ``horizon_planned``)."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from deadline_pipeline.config import load_config
from deadline_pipeline.ingest.versions import is_future
from deadline_pipeline.plan import occurrences as occ_mod
from deadline_pipeline.plan.service import plan_all, record_plan_run
from deadline_pipeline.store.schema import obligations, sources
from deadline_pipeline.watch import checks as w
from deadline_pipeline.watch.watchdog import evaluate
from deadline_pipeline_tests.factories import ics, write_config
from deadline_pipeline_tests.test_watch_checks import EVENT_A, EVENT_B, T0, _run_cli, ingest

SECONDLY = dict(uid="s@test", tzid="Europe/Berlin", dtstart="20200101T000000", summary="Every second",
                rrule="FREQ=SECONDLY")


def _config(tmp_path, *, bob_email="bob@example.org", kinds=None, events=(EVENT_A, EVENT_B), rules=None,
            subscribers=None, tenant="t1", exclude_kinds=None):
    """ann and bob of ``tenant``, one subscription "all" to the ``cal`` source of tenant t1."""
    (tmp_path / "cal.ics").write_text(ics(*events), newline="")
    sub = {"name": "all", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["box"]}
    if kinds:
        sub["kinds"] = kinds
    if exclude_kinds:
        sub["exclude_kinds"] = exclude_kinds
    if rules:
        sub["rules"] = rules
    if subscribers:
        sub["subscribers"] = subscribers
    bob = {"id": "bob", "tenant": tenant, "timezone": "America/Chicago"}
    if bob_email:
        bob["email"] = bob_email
    path = write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1", "freshness": "P1D"}],
        subscribers=[{"id": "ann", "tenant": tenant, "email": "ann@example.org", "timezone": "Europe/Berlin"}, bob],
        subscriptions=[sub],
        channels={"box": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )
    return load_config(path)[0], path


def _plan(engine, cfg, now):
    """One planning run recorded exactly as the ``plan_obligations`` asset records it."""
    out = plan_all(engine, cfg, now)
    record_plan_run(engine, "plan", started_at=now, completed_at=now, label="test", problems=out.problems)
    return out


@contextmanager
def _deadline(seconds: int):
    """Fail (instead of hanging the suite) when the body runs longer than ``seconds``."""
    def _raise(*_):
        raise TimeoutError(f"took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_run_exits_1_when_a_subscriber_lacks_the_contact_of_a_channel(tmp_path, db_url):
    """bob has no email and the subscription's channel is a maildir: `run` exits 1 naming
    plan_complete, and the watchdog has a red plan_complete row."""
    _, path = _config(tmp_path, bob_email=None)
    res = _run_cli(["run", "--config", str(path), "--db-url", db_url, "--as-of", "2027-01-10T00:00:00Z"], tmp_path)
    assert res.exit_code == 1, res.output
    assert "plan_complete" in res.output and "bob" in res.output, res.output
    dog = _run_cli(["watchdog", "--config", str(path), "--db-url", db_url, "--as-of", "2027-01-10T00:05:00Z"],
                   tmp_path)
    assert dog.exit_code == 1, dog.output
    failing = [line for line in dog.output.splitlines() if line.startswith("FAIL")]
    assert any("plan_complete" in line and "no email" in line for line in failing), dog.output


def test_a_clean_plan_is_complete(engine, tmp_path):
    cfg, _ = _config(tmp_path)
    ingest(engine, cfg, T0)
    _plan(engine, cfg, T0)
    out = w.plan_complete(engine, T0)
    assert out.passed and out.count == 0, out.summary
    assert "plan_complete" in {r.check for r in evaluate(engine, T0, cfg).rows}


def test_an_ambiguous_subscriber_zone_is_said_in_plan_complete_and_the_log_and_stays_green(engine, tmp_path, caplog):
    """A subscriber's zone decides when a date-only deadline ends for them and their quiet hours.
    ``CST`` is read as UTC-6 and also names China Standard Time: a source's such zone was noted at
    ingest, a subscriber's was read without a word. Now the planning run logs each such zone with the
    subscribers it names, and plan_complete counts them, green (the zone is read as written)."""
    cfg, _ = _config(tmp_path, subscribers=["ann", "bob"])
    cfg.subscribers[1] = cfg.subscribers[1].model_copy(update={"timezone": "CST"})
    ingest(engine, cfg, T0)
    with caplog.at_level("WARNING", logger="deadline_pipeline.plan.service"):
        out = plan_all(engine, cfg, T0)
    assert out.subscriber_zone_notes == 1
    assert any("subscriber(s) bob: time zone 'CST' is ambiguous" in r.getMessage() for r in caplog.records)
    record_plan_run(engine, "plan", started_at=T0, completed_at=T0, label="test", problems=out.problems,
                    counts=out.heartbeat_counts())
    check = w.plan_complete(engine, T0)
    assert check.passed and check.metadata["subscriber_zone_notes"] == 1, check
    assert "1 subscriber(s) have an ambiguous time zone" in check.summary, check.summary


def test_decree_notes_are_said_once_across_a_full_run_and_a_backfill_of_the_same_months(engine):
    """A decree calendar's note (CN rolled past the last year the holidays release lists its moved
    days for) describes the configuration's calendars against the months planned: a backfill of
    months the full run planned notes CN again. plan_complete takes the largest count (2, not 3),
    names every calendar noted with the year listed, and stays green."""
    from deadline_pipeline.holiday_calendars import calendar_data_version

    def run(component, minutes, counts):
        at = T0 + timedelta(minutes=minutes)
        record_plan_run(engine, component, started_at=at, completed_at=at, label=component, problems=[],
                        counts=counts)
        return w.plan_complete(engine, at)

    out = run("plan", 0, {"calendar_decree_notes": 2, "decrees_listed_to:CN": 2026, "decrees_listed_to:KZ": 2025})
    assert out.passed and out.metadata["calendar_decree_notes"] == 2, out
    out = run("plan:backfill", 5, {"calendar_decree_notes": 1, "decrees_listed_to:CN": 2026})
    assert out.passed and out.count == 0 and out.metadata["calendar_decree_notes"] == 2, out
    assert out.metadata["decrees_listed_to"] == {"CN": 2026, "KZ": 2025}, out
    assert (f"2 business-day calendar(s) of yearly decree countries rolled due dates past the last year "
            f"{calendar_data_version()} lists their worked weekends and bridged days off for (CN to 2026, KZ to "
            "2025), as if no day moved after it: if a decree moved days, upgrade holidays, or ingest the official "
            "holiday file for that year (business_days.calendar: source:NAME)") in out.summary, out.summary
    # A clean full run after both judges itself alone: nothing said.
    out = run("plan", 60, {"calendar_decree_notes": 0})
    assert out.passed and out.metadata["calendar_decree_notes"] == 0 and "decree" not in out.summary, out


def test_kinds_matching_no_rule_turn_plan_complete_red(engine, tmp_path):
    cfg, _ = _config(tmp_path, kinds=["papr"])
    ingest(engine, cfg, T0)
    assert _plan(engine, cfg, T0).obligations_planned == 0
    out = w.plan_complete(engine, T0)
    assert not out.passed and out.count == 1, out.summary  # one problem per subscription
    assert "papr" in out.summary and "papr" in out.offenders[0]["detail"]
    rows = {r.check: r for r in evaluate(engine, T0, cfg).rows}
    assert not rows["plan_complete"].ok and not evaluate(engine, T0, cfg).healthy


def test_rule_patterns_matching_no_rule_id_turn_plan_complete_red(engine, tmp_path):
    """``rules: ["a"]`` against the UIDs ``a@test`` / ``b@test`` plans nothing: plan_complete is red,
    naming the subscription, the pattern and the source's real rule ids (their "@test")."""
    cfg, _ = _config(tmp_path, rules=["a", "c*"])
    ingest(engine, cfg, T0)
    planned = _plan(engine, cfg, T0)
    assert planned.obligations_planned == 0
    # ann and bob meet the same problem: listed once, not once per subscriber (1,000 lines for 1,000).
    assert len(planned.problems) == 1, planned.problems
    out = w.plan_complete(engine, T0)
    assert not out.passed and out.count == 1, out.summary
    assert "subscription 'all'" in out.summary and "['a', 'c*']" in out.summary, out.summary
    assert "'a@test', 'b@test'" in out.summary, out.summary
    assert not evaluate(engine, T0, cfg).healthy


def test_rule_patterns_are_not_judged_without_rules_in_force(engine, tmp_path):
    """A source with no rule in force yet (never ingested: its freshness check is red) is no
    pattern problem; neither is a pattern whose rule the source withdrew (nothing is owed)."""
    cfg, _ = _config(tmp_path, rules=["a@test"])
    assert _plan(engine, cfg, T0).problems == []
    ingest(engine, cfg, T0)
    assert _plan(engine, cfg, T0).obligations_planned == 2 and w.plan_complete(engine, T0).passed
    later = T0 + timedelta(days=10)  # a@test (due 2027-01-15) has passed: dropping it is no quarantine
    (tmp_path / "cal.ics").write_text(ics(EVENT_B), newline="")
    ingest(engine, cfg, later)
    out = _plan(engine, cfg, later)
    assert out.problems == [], out.problems


def test_star_reaching_no_subscriber_turns_plan_complete_red(engine, tmp_path):
    """``subscribers: ["*"]`` where every subscriber is of tenant t2 and the source of t1: nothing is
    planned, and plan_complete says why. (A tenant that differs from a source's only in letter case,
    ``T1``, is refused when the configuration is loaded.)"""
    cfg, _ = _config(tmp_path, tenant="t2")
    ingest(engine, cfg, T0)
    assert _plan(engine, cfg, T0).obligations_planned == 0
    out = w.plan_complete(engine, T0)
    # Seen from both sides: the subscription reaches no one, and no one is reached.
    assert not out.passed and out.count == 2, out.summary
    assert "subscription 'all' reaches no subscriber" in out.summary, out.summary
    assert "tenant 't1'" in out.summary and "['t2']" in out.summary, out.summary
    assert "2 subscriber(s) of tenant 't2' reached by no subscription get no reminder: 'ann', 'bob'" in out.summary


def test_a_listed_subscriber_of_another_tenant_is_planned_and_reported(engine, tmp_path):
    """bob (tenant t2) listed by id for a source of tenant t1: his reminders are planned (dropping
    them would be a silent miss), and plan_complete is red naming him and both tenants."""
    cfg, _ = _config(tmp_path, tenant="t2", subscribers=["bob"])
    cfg = cfg.model_copy(update={"subscribers": cfg.subscribers[1:]})  # ann would be reached by nothing
    ingest(engine, cfg, T0)
    assert _plan(engine, cfg, T0).obligations_planned > 0
    out = w.plan_complete(engine, T0)
    assert not out.passed and out.count == 1, out.summary
    assert "'bob' (tenant 't2')" in out.summary and "(tenant 't1')" in out.summary, out.summary
    # Nothing was left unplanned: the summary says what the run reported, not that.
    assert "unplanned" not in out.summary and "(test) reported 1 problem(s): cal/*: " in out.summary, out.summary


def test_star_reaching_no_one_is_reported_next_to_a_listed_subscriber(engine, tmp_path):
    """``subscribers: ["*", "bob"]`` with ann and bob of tenant t2 and the source of t1: bob is
    planned as listed, and both the "*" that reaches no one and bob's tenant are reported."""
    cfg, _ = _config(tmp_path, tenant="t2", subscribers=["*", "bob"])
    ingest(engine, cfg, T0)
    out = _plan(engine, cfg, T0)
    assert out.obligations_planned > 0
    messages = [p.message for p in out.problems]
    assert len(messages) == 3, messages
    assert "1 subscriber(s) of tenant 't2' reached by no subscription get no reminder: 'ann';" in messages[2]
    assert any("'*' in subscribers ['*', 'bob'] reaches no subscriber" in m and "tenant 't1'" in m
               for m in messages), messages
    assert any("'bob' (tenant 't2')" in m for m in messages), messages


def test_a_subscriber_no_subscription_reaches_turns_plan_complete_red(engine, tmp_path):
    """ann is listed, bob (same tenant) is not and there is no "*": bob gets no reminder, and the
    run reports him (one problem per tenant, naming at most ten ids and counting the rest)."""
    cfg, _ = _config(tmp_path, subscribers=["ann"])
    ingest(engine, cfg, T0)
    out = _plan(engine, cfg, T0)
    assert out.obligations_planned > 0, out
    assert [p.message.split(":")[0] for p in out.problems] == [
        "1 subscriber(s) of tenant 't1' reached by no subscription get no reminder"], out.problems
    check = w.plan_complete(engine, T0)
    assert not check.passed and check.count == 1 and "'bob'" in check.summary, check.summary
    many = cfg.model_copy(update={"subscribers": [*cfg.subscribers, *(
        cfg.subscribers[1].model_copy(update={"id": f"s{i:02}", "tenant": "t9"}) for i in range(12))]})
    messages = [p.message for p in _plan(engine, many, T0).problems]
    assert len(messages) == 2 and "12 subscriber(s) of tenant 't9'" in messages[1], messages
    assert "'s09' and 2 more" in messages[1] and "'s10'" not in messages[1], messages


def test_a_subscriber_with_an_empty_tenant_cell_is_reported(tmp_path, db_url):
    """An empty tenant cell in subscribers_csv means tenant ``default``: carl was never planned
    beside a source of tenant t1 while "*" still reached ann, and every check stayed green. `run`
    now exits 1 and plan_complete names carl and why his tenant is ``default``."""
    (tmp_path / "cal.ics").write_text(ics(EVENT_A, EVENT_B), newline="")
    (tmp_path / "subs.csv").write_text("id,tenant,email,timezone\nann,t1,ann@example.org,UTC\n"
                                       "carl,,carl@example.org,UTC\n")
    path = write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1", "freshness": "P1D"}],
        subscribers=[], subscriptions=[{"name": "all", "sources": ["cal"], "channels": ["box"]}],
        channels={"box": {"type": "maildir", "path": str(tmp_path / "maildir")}}, subscribers_csv="subs.csv")
    res = _run_cli(["run", "--config", str(path), "--db-url", db_url, "--as-of", "2027-01-10T00:00:00Z"], tmp_path)
    assert res.exit_code == 1, res.output
    failing = [line for line in res.output.splitlines() if "plan_complete" in line]
    assert any("'carl'" in line for line in failing), res.output
    assert "of tenant 'default' reached by no subscription" in res.output, res.output
    assert "an empty tenant cell in subscribers_csv" in res.output, res.output


def test_a_rule_renamed_out_of_the_patterns_turns_plan_complete_red(engine, tmp_path):
    """``rules: ["filing-*"]`` and the publisher renames ``filing-1@x`` to ``irs-filing-1@x`` (same
    instant and title: a rename, not a withdrawal). The rule's reminders are withdrawn, as the
    patterns say, but no longer in silence: the old id matching only a withdrawn rule passed for
    "the source dropped it". Renamed once more, to ``tax-1@x``, the id in between still counts; with
    the new id in the patterns the problem is gone and the reminders are back."""
    others = [dict(uid=f"other-{c}@x", tzid="UTC", dtstart=f"2027040{i}T120000", summary=c.upper())
              for i, c in enumerate("abc", start=1)]

    def write(uid, patterns):
        (tmp_path / "cal.ics").write_text(ics(dict(uid=uid, tzid="UTC", dtstart="20270301T120000",
                                                   summary="Q1 filing"), *others), newline="")
        path = write_config(
            tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1"}],
            subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org"}],
            subscriptions=[{"name": "filings", "sources": ["cal"], "rules": patterns, "offsets": ["-P7D"],
                            "channels": ["box"]}],
            channels={"box": {"type": "maildir", "path": str(tmp_path / "maildir")}})
        return load_config(path)[0]

    cfg = write("filing-1@x", ["filing-*"])
    ingest(engine, cfg, T0)
    assert _plan(engine, cfg, T0).obligations_planned == 1 and w.plan_complete(engine, T0).passed
    for n, uid in enumerate(["irs-filing-1@x", "tax-1@x"], start=1):
        cfg = write(uid, ["filing-*"])
        ingest(engine, cfg, T0 + timedelta(hours=n))
        out = _plan(engine, cfg, T0 + timedelta(hours=n))
        assert out.obligations_withdrawn == (1 if n == 1 else 0), out
        (p,) = out.problems
        assert p.source == "cal" and p.message.startswith(
            f"subscription 'filings': rule patterns ['filing-*'] select rules of source 'cal' by ids it has "
            f"renamed ('filing-1@x' is now {uid!r})"), p.message
        assert not w.plan_complete(engine, T0 + timedelta(hours=n)).passed
    cfg = write("tax-1@x", ["filing-*", "tax-*"])
    out = _plan(engine, cfg, T0 + timedelta(hours=3))
    assert out.problems == [] and w.plan_complete(engine, T0 + timedelta(hours=3)).passed, out.problems
    with engine.connect() as conn:
        assert conn.execute(select(obligations.c.rule_id, obligations.c.status)).all() == [("tax-1@x", "active")]


def test_an_id_between_two_renames_counts_as_the_rules_own():
    """a → b → c with ``rules: ["b"]`` (the patterns followed the first rename, not the second):
    reported, naming b. Patterns matching c, or no id the rule had, are no problem."""
    from deadline_pipeline.plan.planner import Target, renamed_out_problem

    def target(*patterns):
        return Target(1, "ann", "t", "UTC", 1, "cal", None, patterns, (-86400,), ("box",), subscription="s")

    lineage, recorded = {"c": "a"}, {"b": "a", "c": "a"}
    assert "('b' is now 'c')" in renamed_out_problem(target("b"), lineage, recorded).message
    assert renamed_out_problem(target("b", "c"), lineage, recorded) is None
    assert renamed_out_problem(target("x*"), lineage, recorded) is None


def test_a_clean_backfill_does_not_hide_the_full_runs_problems(engine):
    """The hourly run reports a rule cut at the expansion cap; five minutes later a one-month
    backfill, clean in its month, turned plan_complete green while the cut months stayed unplanned.
    A backfill turns it red, never green: only the next clean full run does."""
    from deadline_pipeline.plan.planner import PlanProblem

    cut = [PlanProblem("cal", "h@test", "more than 5000 occurrences (the expansion cap)")]

    def run(component, minutes, problems=()):
        at = T0 + timedelta(minutes=minutes)
        record_plan_run(engine, component, started_at=at, completed_at=at, label=component, problems=list(problems))
        return w.plan_complete(engine, at)

    assert not run("plan", 0, cut).passed
    out = run("plan:backfill", 5)
    assert not out.passed and "expansion cap" in out.summary and out.offenders[0]["component"] == "plan", out
    out = run("plan:backfill", 10, [PlanProblem("cal", "x@test", "no email")])
    assert not out.passed and out.count == 2 and [o["component"] for o in out.offenders] == [
        "plan:backfill", "plan"], out
    # A clean full run after both: the backfill is older, so only the full run is judged.
    assert run("plan", 60).passed
    assert not run("plan:backfill", 65, cut).passed


def _two_sources(tmp_path, rules, **subscription):
    """ann of tenant t1 and one subscription ``both`` with ``rules`` (and ``subscription``'s other
    keys) over ``cal`` (a@test, b@test) and ``conf`` (c@conf)."""
    (tmp_path / "cal.ics").write_text(ics(EVENT_A, EVENT_B), newline="")
    (tmp_path / "conf.ics").write_text(ics(dict(EVENT_A, uid="c@conf")), newline="")
    path = write_config(
        tmp_path,
        sources=[{"name": n, "format": "ics", "location": f"{n}.ics", "tenant": "t1", "freshness": "P1D"}
                 for n in ("cal", "conf")],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/Berlin"}],
        subscriptions=[{"name": "both", "sources": ["cal", "conf"], "offsets": ["-P1D"], "channels": ["box"],
                        "rules": rules, **subscription}],
        channels={"box": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )
    return load_config(path)[0]


def test_rule_patterns_are_judged_per_subscription_over_its_sources(engine, tmp_path):
    """``rules: ["a@*"]`` over ``cal`` and ``conf`` selects cal's a@test and nothing of conf: the
    subscription is meant for cal's rule, no problem. Patterns selecting nothing in either source
    are one problem naming both sources and some rule ids of each."""
    cfg = _two_sources(tmp_path, ["a@*"])
    ingest(engine, cfg, T0)
    out = _plan(engine, cfg, T0)
    assert out.obligations_planned == 1 and out.problems == [], out.problems
    assert w.plan_complete(engine, T0).passed
    cfg = _two_sources(tmp_path, ["x*"])
    out = _plan(engine, cfg, T0)
    assert len(out.problems) == 1, out.problems
    (p,) = out.problems
    assert p.source == "cal, conf" and "subscription 'both'" in p.message, p
    assert "selects no rule in any of its sources ['cal', 'conf']" in p.message, p.message
    assert "cal: rule patterns ['x*']" in p.message and "'a@test', 'b@test'" in p.message, p.message
    assert "conf: rule patterns ['x*']" in p.message and "'c@conf'" in p.message, p.message


def test_kinds_with_rule_patterns_are_judged_where_the_patterns_select(engine, tmp_path):
    """Patterns leave ``conf`` out (``a@*``): its rules are not judged on ``kinds``, with or without
    a kinds problem in ``cal``. Patterns selecting in both sources: kinds selecting nothing in either
    are one problem per source, each naming its source, the kinds asked for and the kinds it has."""
    cfg = _two_sources(tmp_path, ["a@*"], kinds=["event"])
    ingest(engine, cfg, T0)
    out = _plan(engine, cfg, T0)
    assert out.obligations_planned == 1 and out.problems == [], out.problems
    cfg = _two_sources(tmp_path, ["a@*"], kinds=["todo"])
    out = _plan(engine, cfg, T0)
    assert [(p.source, p.message) for p in out.problems] == [
        ("cal", "subscription 'both': kinds ['todo'] match no rule of source 'cal'; its kinds are ['event']")]
    cfg = _two_sources(tmp_path, ["*"], kinds=["todo"])
    out = _plan(engine, cfg, T0)
    assert [(p.source, p.message) for p in out.problems] == [
        (name, f"subscription 'both': kinds ['todo'] match no rule of source {name!r}; its kinds are ['event']")
        for name in ("cal", "conf")], out.problems
    check = w.plan_complete(engine, T0)
    assert not check.passed and check.count == 2, check.summary


def _conferences(tmp_path, shared_dir, kinds, exclude_kinds=None):
    """Real ai-deadlines-hf files as two sources of tenant t1: ``all`` (every conference but WACV,
    in one file) and ``wacv``, and one subscription ``papers`` over both with ``kinds`` (None: every
    kind) and ``exclude_kinds``. WACV types its paper deadlines ``submission``; the others mostly
    ``paper``."""
    folder = shared_dir / "data" / "ai-deadlines-hf" / "conferences"
    (tmp_path / "all.yml").write_text("\n".join(f.read_text() for f in sorted(folder.glob("*.yml"))
                                                if f.stem != "wacv"))
    (tmp_path / "wacv.yml").write_bytes((folder / "wacv.yml").read_bytes())
    path = write_config(
        tmp_path,
        sources=[{"name": n, "format": "ai-deadlines", "location": f"{n}.yml", "tenant": "t1"}
                 for n in ("all", "wacv")],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/Berlin"}],
        subscriptions=[{"name": "papers", "sources": ["all", "wacv"], "offsets": ["-P1D"], "channels": ["box"],
                        **({"kinds": kinds} if kinds else {}),
                        **({"exclude_kinds": exclude_kinds} if exclude_kinds else {})}],
        channels={"box": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )
    return load_config(path)[0], path


# Before WACV 2027's "Round 1 Paper Submission" (2026-06-25 AoE).
SPRING_2026 = datetime(2026, 5, 1, tzinfo=UTC)


def _planned_sources(engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(select(sources.c.name).join(obligations, obligations.c.source_id == sources.c.id)
                                .where(obligations.c.status == "active")).scalars())


def _wacv_titles(engine) -> list[str]:
    with engine.connect() as conn:
        return conn.execute(select(obligations.c.title).join(sources, obligations.c.source_id == sources.c.id)
                            .where(sources.c.name == "wacv", obligations.c.status == "active")).scalars().all()


def test_kinds_paper_selects_the_paper_deadlines_typed_submission(engine, tmp_path, shared_dir):
    """``kinds: [abstract, paper]``, the documented example, over ``sources: [all, wacv]``: WACV types
    its paper deadlines ``submission`` (as the reader types a flat ``deadline:``), and none was
    planned while ``all``'s ``paper`` ones kept every check green. ``paper`` selects them too."""
    cfg, _ = _conferences(tmp_path, shared_dir, ["abstract", "paper"])
    ingest(engine, cfg, SPRING_2026)
    out = _plan(engine, cfg, SPRING_2026)
    assert out.problems == [] and _planned_sources(engine) == {"all", "wacv"}, out.problems
    titles = _wacv_titles(engine)
    assert any("Round 1 Paper Submission" in t for t in titles), titles
    assert not any("Registration" in t for t in titles), titles
    assert w.plan_complete(engine, SPRING_2026).passed


def test_kinds_matching_no_rule_of_one_named_source_turn_plan_complete_red(engine, tmp_path, shared_dir):
    """``sources: [all, wacv]`` with ``kinds: [abstract, rebuttal_start]``: ``all`` has abstract deadlines,
    WACV none. WACV's deadlines are not planned, and plan_complete is red naming the subscription,
    WACV, the kinds asked for and WACV's own kinds; with ``submission`` added, WACV's paper
    deadlines are planned and the plan is complete."""
    cfg, _ = _conferences(tmp_path, shared_dir, ["abstract", "rebuttal_start"])
    ingest(engine, cfg, SPRING_2026)
    out = _plan(engine, cfg, SPRING_2026)
    assert _planned_sources(engine) == {"all"}
    (problem,) = out.problems
    assert problem.source == "wacv", problem
    assert problem.message.startswith("subscription 'papers': kinds ['abstract', 'rebuttal_start'] match no rule "
                                      "of source 'wacv'; its kinds are ["), problem.message
    assert "'submission'" in problem.message and "'registration'" in problem.message, problem.message
    check = w.plan_complete(engine, SPRING_2026)
    assert not check.passed and check.count == 1, check.summary
    assert "wacv" in check.summary and "'submission'" in check.offenders[0]["detail"], check.offenders
    cfg, _ = _conferences(tmp_path, shared_dir, ["abstract", "rebuttal_start", "submission"])
    out = _plan(engine, cfg, SPRING_2026)
    assert out.problems == [] and _planned_sources(engine) == {"all", "wacv"}, out.problems
    assert any("Round 1 Paper Submission" in t for t in _wacv_titles(engine))
    assert w.plan_complete(engine, SPRING_2026).passed


# Every deadline type WACV gives, but none of the paper and abstract dates the other conferences give.
WACV_TYPES = ["submission", "registration", "supplementary", "notification", "camera_ready", "review_release",
              "rebuttal_and_revision"]


def test_exclude_kinds_excluding_every_rule_of_one_named_source_turn_plan_complete_red(engine, tmp_path,
                                                                                      shared_dir):
    """``exclude_kinds`` meant to drop administrative dates, over ``sources: [all, wacv]``, with
    ``submission`` among them: ``all`` keeps its paper deadlines, WACV (which types its paper
    deadlines ``submission``) keeps nothing. Its deadlines are not planned, and plan_complete is red
    naming the subscription, WACV, the excluded kinds and WACV's own kinds; without ``submission``
    excluded, WACV's paper deadlines are planned and the plan is complete."""
    cfg, _ = _conferences(tmp_path, shared_dir, None, WACV_TYPES)
    ingest(engine, cfg, SPRING_2026)
    out = _plan(engine, cfg, SPRING_2026)
    assert _planned_sources(engine) == {"all"}
    (problem,) = out.problems
    assert problem.source == "wacv", problem
    assert problem.message.startswith(f"subscription 'papers': exclude_kinds {WACV_TYPES} exclude every rule of "
                                      "source 'wacv'; its kinds are ["), problem.message
    assert "'submission'" in problem.message and "'deadline'" in problem.message, problem.message
    check = w.plan_complete(engine, SPRING_2026)
    assert not check.passed and check.count == 1, check.summary
    assert "wacv" in check.summary and "exclude_kinds" in check.offenders[0]["detail"], check.offenders
    cfg, _ = _conferences(tmp_path, shared_dir, None, WACV_TYPES[1:])
    out = _plan(engine, cfg, SPRING_2026)
    assert out.problems == [] and _planned_sources(engine) == {"all", "wacv"}, out.problems
    assert w.plan_complete(engine, SPRING_2026).passed


def test_kinds_and_exclude_kinds_are_judged_together():
    """``kinds`` that select a source's rules and ``exclude_kinds`` that drop every one of them are
    one problem naming both; a rule they admit anywhere among the selected ones, or a withdrawn rule
    they admitted (the source dropped that deadline), is none."""
    from deadline_pipeline.plan.planner import Target, subscription_selection_problems
    from deadline_pipeline.rules import RuleRecord

    def rule(rid, kind):
        return 1, RuleRecord(rid, rid, "2027-03-01T12:00:00", "UTC", extra={"deadline_type": kind})

    target = Target(1, "ann", "t1", "UTC", 1, "wacv", None, ("*",), (-86400,), ("box",),
                    kinds=("paper", "submission"), exclude_kinds=("submission",), subscription="papers")
    rules = [rule("r1/submission", "submission"), rule("r1/notification", "notification")]
    (p,) = subscription_selection_problems([(target, rules, {})])
    assert (p.source, p.message) == ("wacv", "subscription 'papers': exclude_kinds ['submission'] exclude every "
                                     "rule of this source that kinds ['paper', 'submission'] select; its kinds are "
                                     "['deadline', 'notification', 'submission']"), p
    assert subscription_selection_problems([(target, [*rules, rule("r2/paper", "paper")], {})]) == []
    assert subscription_selection_problems([(target, rules, {"r0/paper": {"deadline", "paper"}})]) == []
    # A withdrawn rule the exclusion dropped as well does not excuse it.
    assert len(subscription_selection_problems([(target, rules, {"r0/sub": {"deadline", "submission"}})])) == 1


def test_paper_and_submission_are_one_kind_in_kinds_not_in_exclude_kinds():
    """``kinds`` selects ``paper`` and ``submission`` together (a flat ai-deadlines ``deadline:`` is
    typed ``submission``), so ``kinds: [abstract, paper]`` plans it, and ``paper`` over a source that
    only has ``submission`` is no misspelt entry; ``exclude_kinds`` drops only the type it names."""
    from deadline_pipeline.ingest.parsers import parse_payload
    from deadline_pipeline.plan.planner import Target, subscription_selection_problems
    from deadline_pipeline.rules import kinds_admit, kinds_allow

    (flat,) = parse_payload("ai-deadlines", b"- {id: c27, deadline: '2027-03-01 23:59', timezone: AoE}\n",
                            source="s").rules
    assert kinds_allow(["abstract", "Paper"], (), flat)
    assert kinds_admit(["submission"], (), {"deadline", "paper"})
    assert kinds_admit(None, ["paper"], {"deadline", "submission"})
    assert not kinds_admit(None, ["submission"], {"deadline", "submission"})
    target = Target(1, "ann", "t1", "UTC", 1, "wacv", None, ("*",), (-86400,), ("box",),
                    kinds=("abstract", "paper"), subscription="papers")
    assert subscription_selection_problems([(target, [(1, flat)], {})]) == []


def test_editions_whose_every_deadline_kinds_leave_out_are_logged_not_red(engine, tmp_path, shared_dir, caplog):
    """``kinds: [abstract, rebuttal_start]``: WACV's editions list no such deadline, and neither do
    some of ``all``'s. The kinds problem names WACV (no rule at all); the editions of ``all`` left out
    while others of it are planned are legitimate but logged, naming the subscription and them."""
    from deadline_pipeline.plan.planner import Target, editions_left_out
    from deadline_pipeline.rules import RuleRecord

    def rule(edition, kind):
        return 1, RuleRecord(f"{edition}/{kind}", "t", "2027-03-01T12:00:00", "UTC",
                             extra={"edition_id": edition, "deadline_type": kind})

    target = Target(1, "ann", "t1", "UTC", 1, "conf", None, ("*",), (-86400,), ("box",),
                    kinds=("paper",), subscription="papers")
    rules = [rule("a27", "paper"), rule("a27", "notification"), rule("b27", "notification"), rule("c27", "submission")]
    assert editions_left_out(target, rules) == ["b27"]
    assert editions_left_out(Target(1, "ann", "t1", "UTC", 1, "conf", None, ("*",), (-86400,), ("box",)), rules) == []
    cfg, _ = _conferences(tmp_path, shared_dir, ["abstract", "rebuttal_start"])
    ingest(engine, cfg, SPRING_2026)
    with caplog.at_level("INFO", logger="deadline_pipeline.plan.service"):
        _plan(engine, cfg, SPRING_2026)
    (line,) = [r.getMessage() for r in caplog.records if "select no deadline of" in r.getMessage()
               and "'all'" in r.getMessage()]
    assert line.startswith("subscription 'papers': kinds ['abstract', 'rebuttal_start']"), line


def test_a_misspelt_kinds_entry_is_named_with_the_kind_meant():
    """An entry of ``exclude_kinds`` (or of ``kinds`` beside a correct one) that no rule of the
    subscription's sources has but that is close to a kind one has was accepted without a word:
    ``exclude_kinds: [submision]`` excluded nothing and every submission deadline was reminded. It is
    one problem for the subscription, naming each entry, the kind meant and the sources' kinds. An
    entry near no kind they have (a kind a source may give later), one differing only in case, and
    one a withdrawn rule had are none."""
    from deadline_pipeline.plan.planner import Target, subscription_selection_problems
    from deadline_pipeline.rules import RuleRecord

    def rule(rid, kind):
        return 1, RuleRecord(rid, rid, "2027-03-01T12:00:00", "UTC", extra={"deadline_type": kind})

    def problems(kinds=None, exclude=(), withdrawn=None):
        targets = [Target(1, "ann", "t1", "UTC", sid, name, None, ("*",), (-86400,), ("box",), kinds=kinds,
                          exclude_kinds=exclude, subscription="papers") for sid, name in ((1, "all"), (2, "wacv"))]
        return subscription_selection_problems([
            (targets[0], [rule("neurips/paper", "paper"), rule("neurips/abstract", "abstract")], {}),
            (targets[1], [rule("wacv/submission", "submission"), rule("wacv/notification", "notification")],
             withdrawn or {})])

    (p,) = problems(exclude=("submision",))
    assert (p.source, p.rule_id, p.message) == (
        "all, wacv", "*", "subscription 'papers': exclude_kinds entry 'submision' (did you mean 'submission'?) is no "
        "kind of a rule of its sources ['all', 'wacv'], so selects or excludes nothing; their kinds are ['abstract', "
        "'deadline', 'notification', 'paper', 'submission']"), p
    (p,) = problems(kinds=("abstract", "papr", "submission"), exclude=("notifcation",))
    assert p.message.startswith("subscription 'papers': kinds entry 'papr' (did you mean 'paper'?), exclude_kinds "
                                "entry 'notifcation' (did you mean 'notification'?) are no kinds of a rule of its "
                                "sources ['all', 'wacv']"), p.message
    assert problems(exclude=("rebuttal", "Notification")) == []
    assert problems(exclude=("registration",), withdrawn={"wacv/reg": {"deadline", "registration"}}) == []


def test_a_misspelt_exclude_kinds_entry_turns_plan_complete_red(engine, tmp_path):
    """``exclude_kinds: [evnt]`` over a calendar of events excludes nothing: every event is planned,
    as before, and plan_complete is red naming the entry and the kind meant."""
    cfg, _ = _config(tmp_path, exclude_kinds=["evnt"])
    ingest(engine, cfg, T0)
    out = _plan(engine, cfg, T0)
    assert out.obligations_planned > 0
    (problem,) = out.problems
    assert problem.source == "cal" and "exclude_kinds entry 'evnt' (did you mean 'event'?)" in problem.message
    check = w.plan_complete(engine, T0)
    assert not check.passed and check.count == 1, check.summary
    assert "'evnt'" in check.offenders[0]["detail"], check.offenders
    cfg, _ = _config(tmp_path, exclude_kinds=["todo"])
    assert _plan(engine, cfg, T0).problems == []
    assert w.plan_complete(engine, T0).passed


def _failed_plan_complete(path, db_url, tmp_path, as_of: str) -> str:
    """The plan_complete line of ``run`` on the configuration at ``path``, which must exit 1."""
    res = _run_cli(["run", "--config", str(path), "--db-url", db_url, "--as-of", as_of], tmp_path)
    assert res.exit_code == 1, res.output
    line = next(ln for ln in res.output.splitlines() if "plan_complete" in ln)
    assert "FAIL" in line, res.output
    return line


def test_run_exits_1_when_an_exclude_kinds_entry_is_misspelt(tmp_path, db_url):
    _, path = _config(tmp_path, exclude_kinds=["evnt"])
    line = _failed_plan_complete(path, db_url, tmp_path, "2027-01-10T00:00:00Z")
    assert "'evnt'" in line and "did you mean 'event'?" in line, line


def test_run_exits_1_when_kinds_match_no_rule_of_one_named_source(tmp_path, db_url, shared_dir):
    _, path = _conferences(tmp_path, shared_dir, ["abstract", "rebuttal_start"])
    line = _failed_plan_complete(path, db_url, tmp_path, "2026-05-01T00:00:00Z")
    assert "'wacv'" in line and "'submission'" in line, line


def test_run_exits_1_when_rule_patterns_match_nothing(tmp_path, db_url):
    _, path = _config(tmp_path, rules=["a"])
    line = _failed_plan_complete(path, db_url, tmp_path, "2027-01-10T00:00:00Z")
    assert "['a']" in line and "'a@test'" in line, line


def test_a_refused_rule_is_red_and_does_not_hang_the_watchers(engine, tmp_path):
    """A FREQ=SECONDLY rule from 2020: planning refuses it (a problem → plan_complete red), and
    horizon_planned and the quarantine's is_future read it bounded instead of stepping through
    every second since its DTSTART."""
    cfg, _ = _config(tmp_path, events=(EVENT_A, EVENT_B, SECONDLY))
    ingest(engine, cfg, T0)
    _plan(engine, cfg, T0)
    out = w.plan_complete(engine, T0)
    assert not out.passed and "s@test" in out.summary, out.summary
    with _deadline(60):
        horizon = w.horizon_planned(engine, cfg, T0, timedelta(minutes=90), timedelta(days=366))
    assert horizon.passed, horizon.summary  # the other rules are planned; the refused one is plan_complete's
    payload = {"rule_id": "s@test", "title": "x", "start": "2020-01-01T00:00:00", "tz": "Europe/Berlin",
               "rrule": "FREQ=SECONDLY"}
    with _deadline(60):
        assert is_future(payload, T0)  # over the work budget: counted as future, the safe side


def test_a_rule_cut_at_the_occurrence_cap_is_red_and_keeps_what_was_expanded(engine, tmp_path, monkeypatch):
    """An hourly rule over the horizon holds more occurrences than the cap (small here): planning
    plans the first ``cap`` of them and reports the rest as a planning problem naming the rule, the
    cap, where expansion stopped and the window's end. Before, only a log line said so while
    plan_complete and ``run`` stayed green."""
    monkeypatch.setattr(occ_mod, "MAX_OCCURRENCES", 30)
    hourly = dict(uid="hourly@test", tzid="UTC", dtstart="20270110T000000", summary="Hourly", rrule="FREQ=HOURLY")
    cfg, _ = _config(tmp_path, events=(EVENT_A, hourly))
    ingest(engine, cfg, T0)
    out = _plan(engine, cfg, T0)
    hourly_obs = out.obligations_planned - 2  # EVENT_A once for ann and bob
    assert hourly_obs == 2 * 30, out.obligations_planned  # the expanded part is planned, not dropped
    assert [p.rule_id for p in out.problems] == ["hourly@test"]  # ann's and bob's identical problem, once
    cut = "2027-01-11T06:00:00+00:00"  # the 31st hour: the first occurrence left out
    check = w.plan_complete(engine, T0)
    assert not check.passed and check.count == 1, check.summary
    for text in (check.summary, check.offenders[0]["detail"]):
        assert "cal/hourly@test" in text and "more than 30 occurrences" in text, text
        assert f"expansion stopped at {cut}" in text and f"due from {cut} on are not planned" in text, text
        assert "window's end 2028-01-11T00:00:00+00:00" in text and "recurs too often" in text, text
    rows = {r.check: r for r in evaluate(engine, T0, cfg).rows}
    assert not rows["plan_complete"].ok
    fanout = w.fanout_complete(engine, T0, timedelta(days=366), {"box": "maildir"})
    assert fanout.passed and "planned obligation(s)" in fanout.summary, fanout.summary


# Zone data whose Reykjavik jumps from UTC to UTC+1 at 02:00Z on 8 March 2026 and back at 03:00Z: the
# wall times 02:00-02:59 that day do not exist, but the offset is the same before and after, within
# one step of the planner's gap scan (zone_gaps), which sees no gap.
BLIP_ZONE = """Zone Atlantic/Reykjavik 0:00 - GMT 2026 Mar 8 2:00u
\t\t\t1:00 - BLIP 2026 Mar 8 3:00u
\t\t\t0:00 - GMT
"""


def _blip_zone_data(tmp_path):
    """A zoneinfo folder marked newer than any release whose Atlantic/Reykjavik is :data:`BLIP_ZONE`,
    compiled by the system's ``zic``, every other zone as the ``tzdata`` package has it."""
    import shutil
    import subprocess

    from deadline_pipeline import zone_data
    from deadline_pipeline_tests.test_zone_data import package_copy

    if shutil.which("zic") is None:
        pytest.skip("zic (the IANA zone compiler) is not installed")
    folder = package_copy(tmp_path / "zoneinfo-blip", "2099a")
    (tmp_path / "blip.zone").write_text(BLIP_ZONE)
    subprocess.run(["zic", "-d", str(folder), str(tmp_path / "blip.zone")], check=True)
    return zone_data.ZoneData("system", "2099a", str(folder), "system")


def test_a_quiet_window_edge_read_by_the_gap_rule_is_counted_in_plan_complete(tmp_path, db_url, caplog):
    """A subscriber in a zone whose quiet window 02:30-06:00 starts at a time zone data skips without
    a gap the planner's scan sees: the window's start is read by the gap rule (a fallback, the reminder
    still deferred to 06:00Z), and ``run``'s planning records it where plan_complete's metadata shows it."""
    from deadline_pipeline.orchestration.checks import to_result
    from deadline_pipeline.store.db import make_engine
    from deadline_pipeline.store.schema import alerts
    from deadline_pipeline_tests.test_zone_data import zone_database

    choice = _blip_zone_data(tmp_path)
    (tmp_path / "cal.ics").write_text(ics(dict(uid="d@test", tzid="UTC", dtstart="20260308T120000",
                                               summary="Filing")), newline="")
    path = write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Atlantic/Reykjavik",
                      "quiet_hours": "02:30-06:00"}],
        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": ["-PT9H"], "channels": ["box"]}],
        channels={"box": {"type": "maildir", "path": str(tmp_path / "maildir")}})
    with zone_database(choice):
        res = _run_cli(["run", "--config", str(path), "--db-url", db_url, "--as-of", "2026-03-01T00:00:00Z"],
                       tmp_path)
        engine = make_engine(db_url)
        out = w.plan_complete(engine, datetime(2026, 3, 1, tzinfo=UTC))
        with engine.connect() as conn:
            send_at = conn.execute(select(alerts.c.send_at)).scalar_one()
        engine.dispose()
    assert res.exit_code == 0, res.output
    assert send_at == datetime(2026, 3, 8, 6, tzinfo=UTC)  # 03:00Z, inside the window, deferred to its end
    logged = [r for r in caplog.records if "read by the gap rule" in r.getMessage()]
    assert logged and out.passed and out.metadata["gap_rule_fallbacks"] == len(logged), out
    assert f"{len(logged)} quiet-window edge(s) read by the gap rule" in out.summary
    assert to_result(out).metadata["gap_rule_fallbacks"].value == len(logged)


def test_two_plans_in_one_process_each_count_only_their_own_gap_rule_fallbacks(tmp_path, pg_url, caplog):
    """Two planning runs in one process at once (the hourly plan and a backfill run in-process): each
    records only the gap-rule fallbacks of the alert rows it built itself. Counted by a process-wide
    counter read before and after each run, the run that planned second took the first one's
    fallbacks as its own, and plan_complete summed them twice."""
    import threading
    import time as clock

    from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
    from deadline_pipeline.plan.service import sync_configuration
    from deadline_pipeline.store.db import make_engine, upgrade
    from deadline_pipeline.store.staging import PLANNING_LOCK
    from deadline_pipeline_tests.test_zone_data import zone_database

    choice = _blip_zone_data(tmp_path)
    (tmp_path / "cal.ics").write_text(ics(dict(uid="d@test", tzid="UTC", dtstart="20260308T120000",
                                               summary="Filing")), newline="")
    cfg = load_config(write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Atlantic/Reykjavik",
                      "quiet_hours": "02:30-06:00"}],
        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": ["-PT9H"], "channels": ["box"]}],
        channels={"box": {"type": "maildir", "path": str(tmp_path / "maildir")}}))[0]
    now = datetime(2026, 3, 1, tzinfo=UTC)
    engine = make_engine(pg_url)
    upgrade(engine)
    outs, errors = [], []

    def plan() -> None:
        try:
            outs.append(plan_all(engine, cfg, now))
        except Exception as exc:  # re-raised below, on the test's thread
            errors.append(exc)

    try:
        with zone_database(choice):
            fetch_snapshot(engine, cfg.sources[0], now)
            apply_latest_snapshot(engine, cfg.sources[0], now)
            sync_configuration(engine, cfg)
            runs = [threading.Thread(target=plan) for _ in range(2)]
            # Both runs start, then wait for the planning lock held here: they overlap, as a
            # backfill and the hourly plan of one process do.
            with engine.begin() as holder:
                holder.exec_driver_sql("SELECT pg_advisory_xact_lock(%(k)s)", {"k": PLANNING_LOCK})
                for run in runs:
                    run.start()
                waited_until = clock.monotonic() + 60
                with engine.connect() as probe:
                    while probe.exec_driver_sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                                "AND NOT granted").scalar() < 2:
                        assert clock.monotonic() < waited_until, "the two planning runs never waited for the lock"
                        clock.sleep(0.05)
            for run in runs:
                run.join(120)
            assert not errors, errors
            logged = [r for r in caplog.records if "read by the gap rule" in r.getMessage()]
            # The run that planned first built the reminder and met the fallbacks; the second found
            # it planned already and built nothing.
            assert logged and sorted(o.gap_rule_fallbacks for o in outs) == [0, len(logged)], (outs, len(logged))
            for component, out, seconds in zip(("plan", "plan:backfill"), outs, (1, 2), strict=True):
                record_plan_run(engine, component, started_at=now, completed_at=now + timedelta(seconds=seconds),
                                label="2026-03..2027-03", problems=out.problems, counts=out.heartbeat_counts())
            check = w.plan_complete(engine, now + timedelta(seconds=3))
    finally:
        engine.dispose()
    assert check.passed and check.metadata["gap_rule_fallbacks"] == len(logged), check


def test_overrides_folding_takes_out_are_counted_in_plan_complete_and_stay_green(engine, tmp_path):
    """A weekly series whose calendar cancels one occurrence (a RECURRENCE-ID override with
    STATUS:CANCELLED): folding it takes that occurrence out, which planning counted nowhere (the
    fold's counts were dropped). The run records it in its heartbeat's counts and plan_complete
    shows it in its metadata — green: the calendar cancelled it, no reminder is owed."""
    from deadline_pipeline.orchestration.checks import to_result
    from deadline_pipeline_tests.factories import cal_ics_config, ingest_and_plan

    (tmp_path / "cal.ics").write_text(ics(
        dict(uid="w@test", tzid="UTC", dtstart="20260302T120000", summary="Weekly", rrule="FREQ=WEEKLY;COUNT=4"),
        dict(uid="w@test", tzid="UTC", dtstart="20260309T120000", summary="Weekly", recurrence_id="20260309T120000",
             status="CANCELLED")), newline="")
    now = datetime(2026, 3, 1, tzinfo=UTC)
    out = ingest_and_plan(engine, cal_ics_config(tmp_path), now)
    assert out.override_folds["cancelled_occurrences"] == 1 and out.obligations_planned == 3, out
    record_plan_run(engine, "plan", started_at=now, completed_at=now, label="2026-03..2027-03",
                    problems=out.problems, counts=out.heartbeat_counts())
    check = w.plan_complete(engine, now)
    assert check.passed and check.metadata["cancelled_occurrences"] == 1, check
    assert check.metadata["orphan_overrides"] == 0 and check.metadata["gap_rule_fallbacks"] == 0, check
    assert to_result(check).metadata["cancelled_occurrences"].value == 1
