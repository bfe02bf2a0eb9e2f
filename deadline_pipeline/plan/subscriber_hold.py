"""The subscribers' counterpart of a source's quarantine: a subscriber list that would withdraw an
implausible share of the subscribers owed reminders is not applied (pure; the planning service
mirrors the configuration with it).

A subscriber file (``subscribers_csv``) cut short at a line boundary — a truncated copy, a deploy
that stopped half-way, an export that ended early — still reads as a valid file. Mirrored as it
was, the missing subscribers were made inactive and every pending reminder of theirs cancelled
silently (a removed subscriber's reminders are cancelled without a notice), while every check
stayed green: only an entirely empty list was refused. Now, when more than
``plan.max_subscriber_withdraw_share`` of the active subscribers that have a reminder still to send
(and more than one of them) are missing, the last good list's subscribers are kept, as stored: their
obligations and reminders stay, planned with what they were planned with. The run reports it as a
planning problem (``plan_complete`` and the watchdog turn red, naming the file, the counts and the
command), until the list is fixed or ``deadline-pipeline subscribers accept`` withdraws them.
One removed subscriber, or a share at most the setting, is mirrored as before.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The command that withdraws held subscribers after a human looked (named in the problem).
ACCEPT_COMMAND = "deadline-pipeline subscribers accept"


@dataclass(frozen=True)
class SubscriberHold:
    """Subscribers a planning run keeps although its subscriber list leaves them out.

    ``listed_in``: where the list came from (the ``subscribers_csv`` path, or the configuration's
    ``subscribers`` key); ``removed``: how many of the ``owed`` subscribers owed a reminder the list
    leaves out; ``share``: the setting it exceeded (a fraction); ``kept``: external ids of every
    active subscriber the list leaves out (owed a reminder or not), sorted."""

    listed_in: str
    removed: int
    owed: int
    share: float
    kept: tuple[str, ...]

    def message(self) -> str:
        """One line for the log, the planning problem and the check: the file, the counts, what was
        done and how to accept."""
        sample = ", ".join(self.kept[:5]) + (f" and {len(self.kept) - 5} more" if len(self.kept) > 5 else "")
        return (f"{self.listed_in}: would withdraw {self.removed} of {self.owed} subscribers with reminders to send "
                f"(more than {self.share:.0%}); not applied: the {len(self.kept)} subscriber(s) missing from it "
                f"({sample}) are kept with their reminders. If the file is cut short, restore it; if they "
                f"really left, run '{ACCEPT_COMMAND}' to withdraw them")


def judge_removal(listed: set[str], active: set[str], owed: set[str], share: float,
                  listed_in: str) -> SubscriberHold | None:
    """The hold for a subscriber list, or None when it may be mirrored.

    ``listed``: external ids the configuration lists; ``active``: ids active in the store; ``owed``:
    the active ids with a reminder still to send; ``share``: the largest fraction of ``owed`` that
    may go at once. Held when more than one of ``owed`` is missing and the missing are more than
    ``share`` of ``owed`` (one removal is always mirrored: removing one of two subscribers is an
    edit, not a broken file)."""
    removed = owed - listed
    # The share compared as the sources' quarantine compares it (ingest.versions.quarantine_reason).
    if len(removed) <= 1 or len(removed) / len(owed) <= share:
        return None
    return SubscriberHold(listed_in, len(removed), len(owed), share, tuple(sorted(active - listed)))
