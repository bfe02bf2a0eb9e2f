"""Which months of a partitioned job are failing, judged on the runs' scopes alone."""

from __future__ import annotations

from deadline_pipeline.watch.partition_runs import WHOLE_JOB, FinishedRun, failed_partitions

MONTHS = [f"2027-{m:02d}-01" for m in range(1, 13)]


def _keys(scope):
    return [m for m in MONTHS if scope[0] <= m <= scope[1]]


def _judge(runs):
    """``runs`` newest first."""
    return failed_partitions([r for r in runs if r.failed], iter(runs), _keys)


def _run(run_id, failed, first=None, last=None):
    return FinishedRun(run_id, failed, None if first is None else (first, last or first))


def test_a_later_month_does_not_cover_a_failed_one():
    assert _judge([_run("b", False, "2027-04-01"), _run("a", True, "2027-03-01")]) == {"2027-03-01": "a"}


def test_a_range_covers_the_months_it_holds_and_no_other():
    runs = [_run("h", False, "2027-04-01", "2027-12-01"), _run("r", True, "2027-02-01", "2027-05-01")]
    assert _judge(runs) == {"2027-02-01": "r", "2027-03-01": "r"}
    assert _judge([_run("h", False, "2027-01-01", "2027-12-01"), *runs]) == {}


def test_the_latest_failure_of_a_month_is_named():
    assert _judge([_run("new", True, "2027-03-01"), _run("old", True, "2027-03-01")]) == {"2027-03-01": "new"}


def test_a_run_of_no_partition_covers_every_older_run():
    assert _judge([_run("all", False), _run("a", True, "2027-03-01")]) == {}
    assert _judge([_run("all", True), _run("a", True, "2027-03-01")]) == {WHOLE_JOB: "all"}


def test_history_is_read_only_until_no_failure_can_still_count():
    read = []

    def runs():
        for run in [_run("h", False, "2027-01-01", "2027-12-01"), _run("a", True, "2027-03-01"),
                    _run("older", False, "2027-03-01")]:
            read.append(run.run_id)
            yield run

    assert failed_partitions([_run("a", True, "2027-03-01")], runs(), _keys) == {}
    assert read == ["h"]
