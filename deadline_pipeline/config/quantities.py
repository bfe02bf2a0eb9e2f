"""The numbers of a configuration as pydantic types: each setting's unit and allowed range."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator


def not_a_boolean(value):
    # YAML's `true` is a number to pydantic (1): `batch_size: true` was read as batches of one alert
    # and `timeout_seconds: true` as a one-second timeout, without a word. (Not strict mode: PyYAML
    # reads `1e-3` as a string, which must still be taken as a number.)
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
    return value


NOT_A_BOOLEAN = BeforeValidator(not_a_boolean)
Number = Annotated[float, NOT_A_BOOLEAN]
