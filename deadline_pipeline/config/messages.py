"""How a pydantic error is worded for the user: the key path as written in the file, and the
did-you-mean of a misspelt key."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from deadline_pipeline.config.sections import DeadlinesConfig


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Annotated, Optional, list, dict, unions)."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out.extend(_models_in(arg))
    return out


def keys_at(loc: tuple) -> set[str]:
    """The keys allowed in the mapping that holds the last part of ``loc`` (a pydantic error path),
    e.g. ``("subscriptions", 0, "ofsets")`` → the fields of a subscription. Empty when unknown."""
    models: list[type[BaseModel]] = [DeadlinesConfig]
    for part in loc[:-1]:
        if not isinstance(part, str):
            continue  # a list index: the item's models are already in ``models``
        nested = [m for model in models if part in model.model_fields
                  for m in _models_in(model.model_fields[part].annotation)]
        if nested:
            models = nested
            continue
        # A dict key (a channel's name) or a union tag (the channel's type): narrow by the tag.
        tagged = [m for m in models if "type" in m.model_fields
                  and part in typing_args(m.model_fields["type"].annotation)]
        if tagged:
            models = tagged
    return {name for m in models for name in m.model_fields}


def typing_args(annotation) -> tuple:
    """``Literal["smtp"]`` → ``("smtp",)``; anything else → ``()``."""
    import typing

    return typing.get_args(annotation) if typing.get_origin(annotation) is Literal else ()


def did_you_mean(key: str, loc: tuple) -> str:
    """``" (did you mean `offsets`?)"`` for a misspelt key at ``loc``, else ``""`` (difflib ratio ≥ 0.6,
    the standard library's own "close match"). A misspelt optional key would otherwise leave a
    default in force that the author believes they changed."""
    import difflib

    close = difflib.get_close_matches(str(key), sorted(keys_at(loc)), n=1)
    return f"; did you mean `{close[0]}`?" if close else ""


# Pydantic puts the channel type it tried into an error's location (channels.hook.webhook.x);
# the file has no such key, so the path names channels.hook.x.
_CHANNEL_TYPES = frozenset({"maildir", "smtp", "webhook", "slack", "caldav", "apprise"})


def format_loc(loc: tuple) -> str:
    if len(loc) >= 3 and loc[0] == "channels" and loc[2] in _CHANNEL_TYPES:
        loc = loc[:2] + loc[3:]
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"
