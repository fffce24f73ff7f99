"""The operator's excluded hosts in the tables: their pages leave an index at once.

`trove exclude` stops the crawl of a host within seconds (discovery and the fetcher
read the shared list), but the pages already read kept ``fetched`` until their next
visit, up to the longest re-crawl interval: an index kept from the tables went on
serving a site whose owner asked to be removed. The recorder reads the same list (and
the settings' own rules) and, for each rule new to the ``excluded_hosts`` table, marks
the pages of the host and of every name below it ``rejected``: a change an index reads
(``trove_schema.changes``). A rule lifted leaves the table; its pages come back as their
visits or links bring them back.

What it marked is in the table, so a rule's whole mark runs once, by one replica (the
one whose insert of it wins), and a replay that empties the tables (``excluded_hosts``
with them) has its pages marked again at the next look. A visit that ended before the
rule reached the fetchers, projected after the mark, writes its page ``fetched`` again:
each look marks the rule's pages changed since the last (``changed_xact`` past the
bound the look before read, ``trove_schema.changes``'s window, through its index). The
list is configuration, not an event (PLATFORM.md, "Excluded hosts"): marking the pages
is the tables' view of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from trove_recorder.replay import rebuilding
from trove_schema.changes import window_end
from trove_schema.exclusions import ListedExclusions, is_address

log = logging.getLogger("trove.recorder")

_HELD = text("SELECT rule FROM excluded_hosts")
_LIFTED = text("DELETE FROM excluded_hosts WHERE rule <> ALL(CAST(:rules AS text[]))")
_NEW = text(
    "INSERT INTO excluded_hosts (rule) SELECT unnest(CAST(:rules AS text[])) ON CONFLICT DO NOTHING"
)
_CHECKED = text("SELECT rule, checked_xact FROM excluded_hosts ORDER BY rule")
# The host and the names below it, by their ending: a rule's first mark reads the
# table (a rule is rare: an operator's removal request); each look after it reads the
# rows changed since the last, through ``changed_xact``'s index. Two statements, so
# that neither's plan is made for the other's.
_COVERED = (
    "UPDATE pages SET status = 'rejected' WHERE status <> 'rejected' "
    "AND (domain = :rule OR :below AND right(domain, :length) = :ending)"
)
_MARK = text(_COVERED)
_MARK_SINCE = text(_COVERED + " AND changed_xact >= :since")
_BOUND = text(
    "UPDATE excluded_hosts SET checked_xact = GREATEST(checked_xact, :bound) "
    "WHERE rule = ANY(CAST(:rules AS text[]))"
)


async def mark_excluded(engine: AsyncEngine, rules: frozenset[str]) -> dict[str, int] | None:
    """Bring ``excluded_hosts`` to ``rules``, marking every page of each new rule and
    the pages of the others written again since the last look; the pages marked by
    rule (each new rule, and the others that marked any), or None while a whole
    replay rebuilds the tables."""
    sessions = async_sessionmaker(engine)
    async with sessions.begin() as session:
        if await rebuilding(session):
            return None
        # Taken first: whatever this look's statements do not see was written by a
        # transaction at or past it, which the next look reads.
        bound = await window_end(await session.connection())
        ordered = sorted(rules)
        await session.execute(_LIFTED, {"rules": ordered})
        await session.execute(_NEW, {"rules": ordered})
        marked = {}
        for rule, since in (await session.execute(_CHECKED)).all():
            done = await session.execute(
                _MARK if since is None else _MARK_SINCE,
                {
                    "rule": rule,
                    "below": not is_address(rule),
                    "length": len(rule) + 1,
                    "ending": "." + rule,
                    "since": since,
                },
            )
            pages = int(getattr(done, "rowcount", 0) or 0)
            if since is None or pages:
                marked[rule] = pages
        await session.execute(_BOUND, {"bound": bound, "rules": ordered})
        return marked


async def held(engine: AsyncEngine) -> frozenset[str]:
    """The rules whose pages the tables have marked."""
    async with engine.connect() as conn:
        return frozenset((await conn.execute(_HELD)).scalars().all())


async def keep_excluded_marked(
    engine: AsyncEngine, listed: ListedExclusions, stop: asyncio.Event
) -> None:
    """Every ``listed.interval``, read the list and mark the pages of its rules
    (``mark_excluded``). The broker or the database away: the rules last read, tried again at the
    next look (said once, and once when it works again)."""
    away = False
    while not stop.is_set():
        with contextlib.suppress(Exception):  # the broker away: the rules in force
            await listed.refresh()
        rules = listed.exclusions.rules
        try:
            if rules or await held(engine):
                marked = await mark_excluded(engine, rules)
                for rule, pages in (marked or {}).items():
                    log.info(
                        "excluded host %s: %d pages marked rejected",
                        rule,
                        pages,
                        extra={"domain": rule, "pages": pages},
                    )
        except Exception as exc:
            if not away:
                log.warning("excluded hosts not marked in the tables yet: %s", exc)
            away = True
        else:
            if away:
                log.info("excluded hosts marked in the tables again")
            away = False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), listed.interval)
