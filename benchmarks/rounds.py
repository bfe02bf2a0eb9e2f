"""The method every benchmark here shares: contenders interleaved in rounds, medians with their
spread, goals as ratios of figures measured in the same run, and one machine-readable last line.

Why rounds: on a shared machine a single run of one contender swings up to 2x with what the
neighbours do. Running A, B, C, A, B, C, ... (at least three rounds) exposes every contender to the
same noise; the median of its rounds is its figure and min-max shows how much the noise moved it.
A goal is then a ratio of two medians of the same run (``sweep / pgqueuer >= 1.5``), which holds
or fails whatever the machine's absolute speed that minute.

    samples = run_rounds({"a": fa, "b": fb}, rounds=3)   # each f() returns one rate (per second)
    print(table(samples, unit="/s"))
    print(goal_line("sweep / pgqueuer", ratio(samples, "sweep", "pgqueuer"), ">=", 1.5))
    print(json_line(samples))                            # the very last line
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

MIN_ROUNDS = 3


@dataclass(frozen=True)
class Figure:
    """One contender's samples (a rate per second, or seconds) over the rounds."""

    name: str
    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def low(self) -> float:
        return min(self.samples) if self.samples else float("nan")

    @property
    def high(self) -> float:
        return max(self.samples) if self.samples else float("nan")


def run_rounds(contenders: dict[str, Callable[[], float]], rounds: int = MIN_ROUNDS, *,
               log: Callable[[str], None] | None = None) -> dict[str, Figure]:
    """Call every contender once per round, in the order given, ``rounds`` times (A, B, C, A, B, C…).

    Each callable returns one sample (its rate, or its seconds). A contender that raises is reported
    on ``log`` and gets no sample that round (the others keep theirs: one failing baseline must not
    void the run); its figure is then ``nan`` if it never succeeded. Raises ``ValueError`` for fewer
    than :data:`MIN_ROUNDS` rounds: one or two samples give no median worth stating.
    """
    if rounds < MIN_ROUNDS:
        raise ValueError(f"rounds must be at least {MIN_ROUNDS} (got {rounds}): a median needs three samples")
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    got: dict[str, list[float]] = {name: [] for name in contenders}
    for k in range(1, rounds + 1):
        for name, fn in contenders.items():
            try:
                value = float(fn())
            except Exception as exc:  # report it loudly and keep the other contenders' figures
                log(f"round {k}/{rounds} {name}: FAILED: {type(exc).__name__}: {exc}")
                continue
            got[name].append(value)
            log(f"round {k}/{rounds} {name}: {value:,.1f}")
    return {name: Figure(name, tuple(v)) for name, v in got.items()}


def ratio(figures: dict[str, Figure], num: str, den: str) -> float:
    """``median(num) / median(den)``; ``nan`` when either is missing or the denominator is 0."""
    if num not in figures or den not in figures:  # a contender left out of this run (--skip-queues)
        return float("nan")
    a, b = figures[num].median, figures[den].median
    if not b or b != b or a != a:
        return float("nan")
    return a / b


def goal_line(label: str, value: float, op: str, target: float) -> str:
    """``"sweep / pgqueuer = 1.62x (goal >= 1.5x): met"``; ``op`` is ``">="`` or ``"<="``."""
    if value != value:
        verdict = "not measured"
    elif op == ">=":
        verdict = "met" if value >= target else "NOT met"
    elif op == "<=":
        verdict = "met" if value <= target else "NOT met"
    else:
        raise ValueError(f"op must be '>=' or '<=', not {op!r}")
    return f"{label} = {value:.2f}x (goal {op} {target:g}x): {verdict}"


def table(figures: dict[str, Figure], unit: str = "/s", labels: dict[str, str] | None = None) -> str:
    """A Markdown table: contender, median, min-max, rounds."""
    labels = labels or {}
    lines = ["| contender | median | min-max | rounds |", "| --- | ---: | ---: | ---: |"]
    for name, f in figures.items():
        lines.append(f"| {labels.get(name, name)} | {f.median:,.1f}{unit} | {f.low:,.1f}-{f.high:,.1f}{unit} "
                     f"| {len(f.samples)} |")
    return "\n".join(lines)


def json_line(figures: dict[str, Figure], suffix: str = "_per_s", extra: dict | None = None) -> str:
    """One line of JSON: ``{"<name><suffix>": median, ...}`` plus ``extra`` (ratios, sizes); a figure
    without samples is ``null`` (JSON has no NaN)."""
    out: dict = {}
    for name, f in figures.items():
        out[f"{name}{suffix}"] = round(f.median, 3) if f.samples else None
    for key, value in (extra or {}).items():
        out[key] = None if isinstance(value, float) and value != value else value
    return json.dumps(out, sort_keys=False)
