"""The one exception every configuration problem is reported as."""

from __future__ import annotations


class ConfigError(Exception):
    """A configuration file that cannot be used; the message names file, key path and problem.

    The message is redacted (:func:`~deadline_pipeline.security.redact.redact`): it may echo a
    rejected value, such as a URL with a password or a token.
    """

    def __init__(self, message: str) -> None:
        from deadline_pipeline.security.redact import redact

        super().__init__(redact(message))
