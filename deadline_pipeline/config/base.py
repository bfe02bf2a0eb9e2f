"""The base of every configuration section (a leaf of the package: the sections and the channels
both derive from it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """The base of every section: unknown keys refused, values frozen, no infinity or NaN."""

    # A misspelt key is an error, not a silently ignored setting.
    # Infinity and NaN are refused in every number: `backoff_cap_seconds: .inf` scheduled a retry
    # for never, `timeout_seconds: .nan` never timed out.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
