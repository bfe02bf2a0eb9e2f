"""The compute log manager of the embedded Dagster instance (``deadline-pipeline run`` and ``demo``).

Dagster's :class:`~dagster._core.storage.local_compute_log_manager.LocalComputeLogManager` mirrors each
step's standard output and error to the terminal through helper processes it starts when the step
starts (``tail -F`` of the capture file, and a Python watcher that stops the ``tail`` should the step's
process die). They are in the terminal's process group, so Ctrl-C reached them too: each watcher
died printing a ``KeyboardInterrupt`` traceback under ``run``'s one-line report of the interrupt.

:class:`InterruptibleComputeLogManager` is that manager with SIGINT blocked while the helpers start:
a blocked signal stays blocked across ``exec``, so Ctrl-C leaves them alone and the step ends them as
it always does (SIGTERM on the way out, also when the step is interrupted). This process itself
gets a Ctrl-C that arrives meanwhile as soon as the helpers have started.
"""

from __future__ import annotations

import signal
from collections.abc import Generator, Sequence
from contextlib import ExitStack, contextmanager

from dagster._core.storage.compute_log_manager import CapturedLogContext
from dagster._core.storage.local_compute_log_manager import LocalComputeLogManager

#: How the embedded instance's ``dagster.yaml`` names the manager (``config.base_dir``: the folder).
CONFIG_MODULE = __name__
CONFIG_CLASS = "InterruptibleComputeLogManager"


class InterruptibleComputeLogManager(LocalComputeLogManager):
    """:class:`LocalComputeLogManager` whose mirroring processes do not receive Ctrl-C (SIGINT)."""

    @classmethod
    def from_config_value(cls, inst_data, config_value) -> InterruptibleComputeLogManager:
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Generator[CapturedLogContext, None, None]:
        with ExitStack() as stack:
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                captured = stack.enter_context(super().capture_logs(log_key))
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            yield captured
