"""The benchmarks' shared method (benchmarks/rounds.py): contenders interleaved in rounds, medians
with min-max, goals as same-run ratios, one JSON last line; and every benchmark script still starts.

The benchmarks themselves are too slow for the test suite; these tests keep their method from
silently rotting (a script that no longer imports, a helper that stops interleaving)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from rounds import Figure, goal_line, json_line, ratio, run_rounds, table  # noqa: E402


def test_contenders_run_interleaved_round_by_round():
    calls: list[str] = []

    def contender(name: str, values: list[float]):
        it = iter(values)

        def run() -> float:
            calls.append(name)
            return next(it)
        return run

    figs = run_rounds({"a": contender("a", [1, 9, 5]), "b": contender("b", [2, 2, 8]),
                       "c": contender("c", [3, 1, 2])}, rounds=3, log=lambda _: None)
    assert calls == ["a", "b", "c"] * 3, "A, B, C, A, B, C, ... not all of A first"
    assert (figs["a"].median, figs["a"].low, figs["a"].high) == (5, 1, 9)
    assert (figs["b"].median, figs["c"].median) == (2, 2)


def test_fewer_than_three_rounds_is_refused():
    with pytest.raises(ValueError, match="at least 3"):
        run_rounds({"a": lambda: 1.0}, rounds=2)


def test_a_failing_contender_keeps_the_others_and_is_reported():
    lines: list[str] = []

    def broken() -> float:
        raise RuntimeError("no database")

    figs = run_rounds({"ok": lambda: 4.0, "broken": broken}, rounds=3, log=lines.append)
    assert figs["ok"].samples == (4.0, 4.0, 4.0)
    assert figs["broken"].samples == ()
    assert sum("broken: FAILED: RuntimeError: no database" in line for line in lines) == 3
    assert ratio(figs, "ok", "broken") != ratio(figs, "ok", "broken")  # nan: not measured
    assert json.loads(json_line(figs)) == {"ok_per_s": 4.0, "broken_per_s": None}


def test_goals_are_same_run_ratios_of_medians():
    figs = {"sweep": Figure("sweep", (300.0, 310.0, 290.0)), "pgqueuer": Figure("pgqueuer", (200.0, 100.0, 210.0))}
    assert ratio(figs, "sweep", "pgqueuer") == 1.5
    assert goal_line("sweep / pgqueuer", 1.5, ">=", 1.5).endswith(": met")
    assert goal_line("sweep / pgqueuer", 1.49, ">=", 1.5).endswith(": NOT met")
    assert goal_line("plan / COPY", 2.6, "<=", 2.5).endswith(": NOT met")
    out = table(figs)
    assert "| sweep | 300.0/s | 290.0-310.0/s | 3 |" in out
    assert json.loads(json_line(figs, extra={"ratio": 1.5})) == {"sweep_per_s": 300.0, "pgqueuer_per_s": 200.0,
                                                                 "ratio": 1.5}


def test_no_benchmark_imports_the_tests():
    """Benchmarks run from a checkout without the test suite: they import the package and their own folder."""
    offenders = []
    tests = "deadline_pipeline_tests"
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{path.name}:{node.lineno} {n}" for n in names if n.partition(".")[0] == tests]
    assert offenders == []


@pytest.mark.parametrize("script", ["deliver.py", "plan.py", "ingest.py", "recurrence.py", "sweep_latency.py"])
def test_every_benchmark_script_starts(script):
    """``--help`` imports the script with everything it needs: a rename in the package breaks this."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--help"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
