"""A bounded memory of which URLs already have a page row, and its id.

Nearly every link of a crawled page points at a page the recorder has seen before
(navigation, tags, the site's other posts). Looking each one up in Postgres was the
largest statement of a batch; with this map only the URLs it has not seen go to the
database.

It is safe because the projection never deletes a page: a URL's id, once committed,
stays. Two things keep it honest:

- entries are added only after the transaction that saw them committed (``learn``),
  so a rolled-back insert never leaves an id behind;
- every batch reads the ``pages`` table's file node, which changes when the table is
  truncated or rebuilt (a reset, a replay into a fresh database), and when the server
  started: a promoted standby has the same file node, and its copy of the table may
  be a little behind, without the latest pages. When either changed, the map is
  dropped (``check_generation``). The pool may have replaced its connections without
  a batch failing (the old primary closed them as it went down);
- a batch the database turned away (``Retry``) drops it too (``forget``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import islice

from trove_recorder.sql import Statement, Transaction

#: The longest URL remembered. The map is bounded by its entries, and URLs may be 2,048
#: characters: a trap whose links grow to that length would fill 200,000 entries with
#: ~420 MB, past the recorder's memory limit. Ordinary URLs are far shorter, and one
#: not remembered costs a lookup in the batch's statement.
REMEMBERED_URL_CHARS = 256

_GENERATION = Statement("SELECT pg_relation_filenode('pages') || '@' || pg_postmaster_start_time()")


class PageIds:
    """URL -> page id, for committed pages only; forgets the oldest tenth when full."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: dict[str, int] = {}
        self._generation: str | None = None

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def get(self) -> Callable[[str], int | None]:
        """The id remembered for a URL, or None (the map's own ``get``: it is called a lot)."""
        return self._ids.get

    def forget(self) -> None:
        """Drop every id: the server behind the URL may be another one now."""
        self._ids.clear()
        self._generation = None

    async def check_generation(self, tx: Transaction) -> str | None:
        """The pages table's current generation; forgets everything if it changed."""
        generation: str | None = await tx.value(_GENERATION)
        if generation != self._generation:
            self._ids.clear()
        return generation

    def learn(self, generation: str | None, ids: Mapping[str, int]) -> None:
        """Remember ids seen by a committed transaction of this ``generation``."""
        if self.capacity <= 0:
            return
        if generation != self._generation:
            self._ids.clear()
            self._generation = generation
        self._ids.update(
            (url, page_id) for url, page_id in ids.items() if len(url) <= REMEMBERED_URL_CHARS
        )
        excess = len(self._ids) - self.capacity
        if excess > 0:
            for url in list(islice(self._ids, excess + self.capacity // 10)):
                del self._ids[url]
