"""A logger for failures that repeat: the first one with its full traceback, then one line every Nth
time with a count, and one line when it recovers.

An outage (database down, provider down) makes every tick fail the same way. Logging each one floods
the log until nobody reads it; logging none makes the outage silent. This keeps it visible at a
bounded rate.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

# Lines of one kind (per-alert errors, skipped rules) written one by one into a Dagster run's log.
LOG_FIRST_LIMIT = 20


class ThrottledLogger:
    """Per-``key`` counting of consecutive failures.

    ``every``: after the first failure (logged with traceback), log again on failure number
    ``1 + every``, ``1 + 2*every``, … with the count so far. ``level``: the level of those lines.
    Thread-safe; state lives in this object (one per long-lived process or sweep).
    """

    def __init__(self, logger: logging.Logger, *, every: int = 10, level: int = logging.ERROR) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.logger = logger
        self.every = every
        self.level = level
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def failure(self, key: str, message: str, exc: BaseException | None = None) -> bool:
        """Count one failure of ``key``; returns True when this call logged a line."""
        with self._lock:
            n = self._counts.get(key, 0) + 1
            self._counts[key] = n
        if n == 1:
            self.logger.log(self.level, "%s", message, exc_info=exc if exc is not None else False)
            return True
        if (n - 1) % self.every == 0:
            self.logger.log(self.level, "%s (failed %d times in a row; logging every %dth repeat)",
                            message, n, self.every)
            return True
        return False

    def success(self, key: str) -> None:
        """Reset ``key``; after failures, log once that it recovered (so the log shows the outage's end)."""
        with self._lock:
            n = self._counts.pop(key, 0)
        if n:
            self.logger.warning("%s: recovered after %d consecutive failure(s)", key, n)

    def count(self, key: str) -> int:
        """Consecutive failures of ``key`` so far."""
        with self._lock:
            return self._counts.get(key, 0)


def log_first(emit: Callable[[str], object], lines: Sequence[str], *, limit: int = LOG_FIRST_LIMIT,
              what: str = "more") -> None:
    """Write the first ``limit`` of ``lines`` through ``emit`` (``context.log.error``, say) and, when
    there are more, one line ``"… and N more <what> (...)"``. Without that line a run log of 500
    escalated alerts showed 20 of them and read as if there were 20.
    """
    for line in lines[:limit]:
        emit(line)
    if len(lines) > limit:
        emit(f"… and {len(lines) - limit} more {what} (not listed here; the counts above and the run's "
             "metadata have them all)")
