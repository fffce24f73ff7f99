"""The words of an answer to a `nats req` on an operator subject (seeds, follows)."""

from __future__ import annotations

from collections.abc import Sequence

#: Items named in a text reply; the rest are counted.
REPLY_TEXT_LIMIT = 20


def reply_lines(head: str, accepted: Sequence[str], rejected: Sequence[tuple[str, str]]) -> str:
    """``head`` and how many were accepted (naming the first ones), then each refusal
    (raw input, reason), for someone typing at a terminal."""
    lines = [f"{head} {len(accepted)}"]
    if accepted:
        shown = list(accepted[:REPLY_TEXT_LIMIT])
        more = len(accepted) - len(shown)
        lines[0] += ": " + ", ".join(shown) + (f" and {more} more" if more else "")
    if rejected:
        lines.append(f"rejected {len(rejected)}:")
        lines.extend(
            f"  {raw or '(empty)'} — {reason}" for raw, reason in rejected[:REPLY_TEXT_LIMIT]
        )
        more = len(rejected) - REPLY_TEXT_LIMIT
        if more > 0:
            lines.append(f"  and {more} more")
    return "\n".join(lines)
