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
bound the look before read, ``trove_schema.changes``'s window, through its index).
Pages are found by their hosts, matched to the rules here: a look costs the pages it
reads, not their number times the rules'. The
list is configuration, not an event (PLATFORM.md, "Excluded hosts"): marking the pages
is the tables' view of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from trove_recorder.replay import rebuilding
from trove_schema.changes import window_end
from trove_schema.exclusions import Exclusions, ListedExclusions

log = logging.getLogger("trove.recorder")

_HELD = text("SELECT rule FROM excluded_hosts")
_LIFTED = text("DELETE FROM excluded_hosts WHERE rule <> ALL(CAST(:rules AS text[]))")
_NEW = text(
    "INSERT INTO excluded_hosts (rule) SELECT unnest(CAST(:rules AS text[])) ON CONFLICT DO NOTHING"
)
_CHECKED = text("SELECT rule, checked_xact FROM excluded_hosts ORDER BY rule")
_BOUND = text(
    "UPDATE excluded_hosts SET checked_xact = GREATEST(checked_xact, :bound) "
    "WHERE rule = ANY(CAST(:rules AS text[]))"
)
# What a look marks is found by the pages' hosts, not their rules: the hosts of the
# pages not yet rejected (every page's for new rules, a rule being rare: an operator's
# removal request, or a list of them at once, one scan for all; for the rules marked
# before, the pages changed since the last look, through ``changed_xact``'s index),
# matched to the rules here, and their pages marked through the host's index. A look
# costs the pages it reads, whatever the number of rules.
_HOSTS = text("SELECT DISTINCT domain FROM pages WHERE status <> 'rejected'")
#: Hosts a look holds at once while it matches them to the rules.
HOSTS_READ_AT_ONCE = 10_000
_HOSTS_SINCE = text(
    "SELECT DISTINCT domain FROM pages WHERE changed_xact >= :since AND status <> 'rejected'"
)
_MARKED = (
    "WITH marked AS (UPDATE pages SET status = 'rejected' "
    "WHERE domain = ANY(CAST(:hosts AS text[])) AND status <> 'rejected'{since} "
    "RETURNING domain) SELECT domain, count(*) FROM marked GROUP BY domain"
)
_MARK = text(_MARKED.format(since=""))
_MARK_SINCE = text(_MARKED.format(since=" AND changed_xact >= :since"))


async def _mark(session: AsyncSession, rules: Collection[str], since: int | None) -> dict[str, int]:
    """Mark the pages ``rules`` cover (changed from ``since`` on, if given); how many
    each rule marked."""
    marked = dict.fromkeys(rules, 0)
    if not rules:
        return marked
    covering = Exclusions(rules).covering
    if since is None:
        hosts = await session.stream(_HOSTS)
    else:
        hosts = await session.stream(_HOSTS_SINCE, {"since": since})
    # Read in parts (a server-side cursor): a broad crawl's hosts are millions.
    covered = [
        host
        async for part in hosts.partitions(HOSTS_READ_AT_ONCE)
        for (host,) in part
        if covering(host) is not None
    ]
    if not covered:
        return marked
    params = {"hosts": covered, "since": since}
    for host, pages in await session.execute(_MARK if since is None else _MARK_SINCE, params):
        marked[covering(host) or host] += pages
    return marked


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
        checked: dict[str, int | None] = {
            rule: since for rule, since in await session.execute(_CHECKED)
        }
        new = [rule for rule, since in checked.items() if since is None]
        looked = {rule: since for rule, since in checked.items() if since is not None}
        marked = await _mark(session, new, None)
        if looked:
            again = await _mark(session, list(looked), min(looked.values()))
            marked |= {rule: pages for rule, pages in again.items() if pages}
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
            # Not before the shared list is read once: the configured rules alone would
            # lift every listed rule's mark, and the next read mark them all again, each
            # a scan of every host the tables know.
            if listed.revision is not None and (rules or await held(engine)):
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
