"""What an operator sent: who sent it, what was refused, and the words of the answer to
a `nats req` on an operator subject (seeds, follows)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg

from trove_schema.urls import masked

#: Items named in a text reply; the rest are counted.
REPLY_TEXT_LIMIT = 20
#: Longest input a refusal keeps.
MAX_RAW_LENGTH = 512
#: Longest reason a reply quotes: a refused host is quoted escaped (``'\u0378...'``),
#: thousands of characters for a long one.
REPLY_REASON_LENGTH = 300
#: How many items each list of a JSON reply holds before ``truncated``...
REPLY_JSON_LIMIT = 1000
#: ... and how many bytes of JSON. A reply larger than the server's max_payload (1 MiB
#: by default) cannot be sent, and the requester hears nothing.
REPLY_LIST_BYTES = 256 * 1024

#: What ends a word of operator input, and the search for a cut password's "@".
_WORD_END = re.compile(r"[\s\"'<>]")


def command_place(msg: Msg) -> str:
    """Where an operator's command sits in the record, for the ids of the events it
    causes: its stream sequence, and the moment nats-server stored it. A sequence alone
    starts again at 1 when ``TROVE_SEEDS`` is made anew (restored into an empty server,
    deleted by hand): a seed sent again took the id of the old one at its place, the
    broker dropped its ``PageDiscovered`` as a duplicate, and the recorder dropped the
    events of its crawl as the old crawl's, redelivered. A redelivery has both the same."""
    metadata = msg.metadata
    stored = round(metadata.timestamp.timestamp() * 1_000_000)
    return f"{metadata.sequence.stream}@{stored}"


def command_origin(msg: Msg) -> str:
    """Where an operator's command came from, as its provenance and its refusals record
    it: the subject, and who sent it when a header says (``Trove-Origin``, as in ``nats
    pub -H Trove-Origin:alice trove.seeds URL``, or the ``Nats-Origin`` of a bridge)."""
    headers = msg.headers or {}
    who = headers.get("Trove-Origin") or headers.get("Nats-Origin")
    return msg.subject + (f" ({who})" if who else "")


@dataclass(frozen=True, slots=True)
class Refused:
    """Something an operator sent that was not accepted, and why."""

    #: What was sent, its credentials masked, cut to ``MAX_RAW_LENGTH`` characters.
    raw: str
    reason: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "raw", _kept(self.raw))


def _kept(raw: str) -> str:
    """``raw`` as a refusal keeps it: each URL's userinfo written ``***``, cut to
    ``MAX_RAW_LENGTH``. A refusal is logged and recorded for good, and a URL refused for
    another reason (a private host) still carries the operator's password."""
    kept = raw[:MAX_RAW_LENGTH]
    if "@" not in raw:
        return kept
    # The cut may go through a URL whose userinfo ends after it (past a password's "/",
    # too): the rest of its word matters only for holding an "@".
    end = _WORD_END.search(raw, MAX_RAW_LENGTH)
    if "@" in raw[MAX_RAW_LENGTH : end.start() if end else len(raw)]:
        kept += "@"
    return masked(kept)[:MAX_RAW_LENGTH]


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
            f"  {raw or '(empty)'} — {reason[:REPLY_REASON_LENGTH]}"
            for raw, reason in rejected[:REPLY_TEXT_LIMIT]
        )
        more = len(rejected) - REPLY_TEXT_LIMIT
        if more > 0:
            lines.append(f"  and {more} more")
    return "\n".join(lines)


def refused_item(refused: Refused) -> dict[str, str]:
    """A refusal as a JSON reply lists it, its reason cut to ``REPLY_REASON_LENGTH``."""
    return {"raw": refused.raw, "reason": refused.reason[:REPLY_REASON_LENGTH]}


def listed(items: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """The first of ``items`` a JSON reply lists (``REPLY_JSON_LIMIT`` of them, at most
    ``REPLY_LIST_BYTES`` of JSON), and whether any were left out."""
    kept: list[dict[str, Any]] = []
    size = 0
    for item in items:
        size += len(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode()) + 1
        if len(kept) == REPLY_JSON_LIMIT or size > REPLY_LIST_BYTES:
            return kept, True
        kept.append(item)
    return kept, False


def read_json(text: str) -> tuple[Any, str | None]:
    """The JSON document ``text`` holds, or None and why it is refused: malformed,
    nested too deeply, or with a lone surrogate escape ("\\ud800") in a string, which no
    reply, event or regular expression could carry (each would raise on it)."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        return None, f"malformed JSON: {exc}"
    except RecursionError:  # "[[[[...": json's C parser gives up, it is not malformed
        return None, "JSON nested too deeply"
    try:
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return None, "a JSON string holds a lone surrogate escape (\\ud800 to \\udfff)"
    except RecursionError:
        return None, "JSON nested too deeply"
    return document, None
