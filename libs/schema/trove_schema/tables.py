"""The Postgres tables: projections of the event record, rebuilt by replaying it.

Statuses and outcomes are TEXT with CHECK constraints rather than Postgres ENUM
types: adding a value later is a one-line migration that never rewrites or locks the
table the way ``ALTER TYPE ... ADD VALUE`` can inside a transaction.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    literal_column,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from trove_schema.events import MAX_URL_LENGTH, CrawlOutcome, LinkKind

PAGE_STATUSES = ("discovered", "fetched", "failed", "rejected")
CRAWL_OUTCOMES = tuple(o.value for o in CrawlOutcome)
LINK_KINDS = tuple(k.value for k in LinkKind)

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class Page(Base):
    """One row per canonical URL."""

    __tablename__ = "pages"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    url: Mapped[str] = mapped_column(String(MAX_URL_LENGTH), nullable=False, unique=True)
    domain: Mapped[str] = mapped_column(String(253), nullable=False, index=True)
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="discovered")
    depth: Mapped[int | None] = mapped_column(Integer)
    title: Mapped[str | None] = mapped_column(Text)
    #: BCP-47 tag (RFC 5646 allows 35 characters).
    language: Mapped[str | None] = mapped_column(String(35), index=True)
    keywords_tsv: Mapped[str | None] = mapped_column(TSVECTOR)
    #: Validators for a conditional GET on re-crawl.
    etag: Mapped[str | None] = mapped_column(Text)
    last_modified: Mapped[str | None] = mapped_column(Text)
    content_hash: Mapped[str | None] = mapped_column(String(64))
    canonical_url: Mapped[str | None] = mapped_column(String(MAX_URL_LENGTH))
    #: Where the page was last read (its newest success or 304), when a redirect on its
    #: host led there (canonical; NULL: at ``url`` itself). Search leaves out such a row
    #: once the page there is fetched where it answers itself, or was looked at since.
    final_url: Mapped[str | None] = mapped_column(String(MAX_URL_LENGTH))
    noindex: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="false")
    #: Completion time of the newest attempt applied: its outcome and status. Older
    #: ones arriving late (a redelivery, a redrive) set only what they are the newest
    #: of (``content_at``, ``linked_at``, ``fetched_at``).
    last_crawled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_outcome: Mapped[str | None] = mapped_column(String(16))
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    #: When discovery first queued it (NULL: only linked to). Indexed: ``trove crawl``
    #: counts and reports the pages it queued without reading every page of the crawl.
    discovered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    fetched_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    failed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: Completion time of the success the content columns come from, and of the attempt
    #: the links come from: each group is the newest of its kind, in any arrival order
    #: (NULL on a row from before migration 0011: ``last_crawled_at`` stands in).
    content_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    linked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    #: The transaction that last changed what an index reads of the page (its status,
    #: title, language, terms, hash, canonical, final URL, noindex): set on insert by
    #: its default, on update by the ``pages_changed`` trigger (migration 0019), the
    #: one path for every writer. NULL: not changed since before that migration. How
    #: an index reads it: PLATFORM.md, "Reading the tables".
    changed_xact: Mapped[int | None] = mapped_column(
        BigInteger, server_default=text("(pg_current_xact_id())::text::bigint"), index=True
    )

    __table_args__ = (
        CheckConstraint(_in("status", PAGE_STATUSES), name="status"),
        Index("ix_pages_keywords_tsv", "keywords_tsv", postgresql_using="gin"),
    )


class ExcludedHost(Base):
    """A rule of the operator's excluded hosts in force (the shared list, `trove
    exclude`, and the settings' own) whose pages the recorder marked ``rejected`` when
    it came in (``trove_recorder.exclusions``): what it marked whole is not marked whole
    again, and a rule lifted leaves the table. A projection of the configuration, not of
    events: a replay that truncates the tables empties it, and the pages are marked
    again after it."""

    __tablename__ = "excluded_hosts"

    #: A host, covering every name below it, or an address (``trove_schema.exclusions``).
    rule: Mapped[str] = mapped_column(String(253), primary_key=True)
    marked_at: Mapped[datetime] = _now()
    #: Every page written before this transaction (``pages.changed_xact``) has been
    #: looked at: a look marks the rule's pages changed from here on, those a visit from
    #: before the rule wrote ``fetched`` again. None until its first, whole mark.
    checked_xact: Mapped[int | None] = mapped_column(BigInteger)


#: The advisory lock a whole replay holds while it rebuilds the tables (a session lock);
#: each live recorder batch takes it shared, for its transaction, or waits.
REBUILD_LOCK = 0x72656275696C64  # "rebuild"


class RebuildMark(Base):
    """A whole replay that has not read the record to its end (``trove_recorder.replay``):
    written with its truncation, removed at its end. While a row is here the live
    recorders apply nothing, the tables half rebuilt: a replay ``--since`` its
    ``applied_until`` (or ``--truncate``) finishes the rebuild."""

    __tablename__ = "rebuild_marks"

    started_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), primary_key=True, server_default=func.now()
    )
    #: When the stream stored the last event the rebuild went past (applied, or skipped
    #: as a live recorder parks it), and its sequence; None: none yet.
    applied_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    applied_seq: Mapped[int | None] = mapped_column(BigInteger)


class PageCrawl(Base):
    """One row per fetch attempt, append-only: never updated after completion.

    Kept for ever unless ``TROVE_CRAWL_HISTORY_RETENTION_SECONDS`` is set; then the
    recorder deletes the old attempts a later success of their page superseded (see its
    ``retention``), found through the index on ``completed_at``.
    """

    __tablename__ = "page_crawls"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    page_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("pages.id", ondelete="CASCADE"), nullable=False
    )
    domain: Mapped[str] = mapped_column(String(253), nullable=False)
    priority: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    attempt: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1")
    outcome: Mapped[str] = mapped_column(String(16), nullable=False)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error_message: Mapped[str | None] = mapped_column(Text)
    content_length: Mapped[int | None] = mapped_column(BigInteger)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    completed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    duration_ms: Mapped[int] = mapped_column(Integer, nullable=False)
    #: The CrawlCompleted event this row was projected from.
    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False, unique=True)
    #: The work event (PageDiscovered or CrawlRequested) the attempt answered.
    request_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    created_at: Mapped[datetime] = _now()

    __table_args__ = (
        CheckConstraint(_in("outcome", CRAWL_OUTCOMES), name="outcome"),
        Index("ix_page_crawls_completed_at", "completed_at"),
        # A page's attempts by completion: the retry policy's count reads its chain.
        Index("ix_page_crawls_page_id_completed_at", "page_id", "completed_at"),
    )


class PageOutlinks(Base):
    """The citation graph: each fetched page's current outgoing links, as one row.

    Three parallel arrays: the target page ids, each link's kind and nofollow. A page's
    link set is replaced whole on every successful crawl, so one row per page is
    written instead of one per edge (migration 0004 measured why). The GIN index
    answers "who links to page X" (``to_page_ids @> ARRAY[X]``). The view
    ``page_links`` gives the same graph one edge per row
    (``from_page_id, to_page_id, kind, nofollow``).

    No foreign keys (migration 0003): the projection writes the row in the transaction
    that creates or finds every page it names, and pages are never deleted.
    """

    __tablename__ = "page_outlinks"

    from_page_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    to_page_ids: Mapped[list[int]] = mapped_column(ARRAY(BigInteger), nullable=False)
    kinds: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    nofollow: Mapped[list[bool]] = mapped_column(ARRAY(Boolean), nullable=False)
    created_at: Mapped[datetime] = _now()

    __table_args__ = (
        CheckConstraint(
            "cardinality(to_page_ids) = cardinality(kinds) "
            "AND cardinality(kinds) = cardinality(nofollow)",
            name="parallel",
        ),
        CheckConstraint(f"kinds <@ ARRAY[{', '.join(repr(k) for k in LINK_KINDS)}]", name="kinds"),
        Index("ix_page_outlinks_to_page_ids", "to_page_ids", postgresql_using="gin"),
    )


class SeedRejection(Base):
    """Seeds that could not be accepted, with the reason given to the operator."""

    __tablename__ = "seed_rejections"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False, unique=True)
    raw: Mapped[str] = mapped_column(Text, nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    origin: Mapped[str | None] = mapped_column(Text)
    occurred_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class Instance(Base):
    """One row per followed timeline of a fediverse instance (the design's ``instanceId``).

    Projected from ``InstanceFollowed``, ``InstanceUnfollowed`` and ``TimelinePolled``,
    in whatever order they are applied (``timeline_polls`` and ``instance_unfollows``
    keep what the row is worked out from): the newest follow holds it, its poll columns
    are its newest poll's, and each poll is counted once.
    """

    __tablename__ = "instances"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    #: The instance's origin (``https://social.example``).
    instance: Mapped[str] = mapped_column(String(MAX_URL_LENGTH), nullable=False)
    domain: Mapped[str] = mapped_column(String(253), nullable=False)
    #: ``local``, ``public`` or ``tag:NAME``.
    timeline: Mapped[str] = mapped_column(String(120), nullable=False)
    #: The ``InstanceFollowed`` of the current follow (its poll chain carries it).
    follow_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    #: None while only polls of the follow were applied (its event was not, yet).
    followed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: None while followed.
    unfollowed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    max_depth: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    software: Mapped[str | None] = mapped_column(Text)
    software_version: Mapped[str | None] = mapped_column(Text)
    #: When the poll that named ``software`` ended: an older poll applied later does not
    #: replace it.
    software_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_poll: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    last_poll_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_outcome: Mapped[str | None] = mapped_column(String(16))
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    polls: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    posts_seen: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    links_found: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    #: Posts left out: not public, or from accounts that opted out.
    skipped: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    cursor: Mapped[str | None] = mapped_column(Text)
    #: The instance asked for a pause (Retry-After, a rate-limit reset) until then.
    next_poll_after: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: Completion of the first failed poll in the current run of failures.
    failing_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()

    __table_args__ = (
        UniqueConstraint("instance", "timeline"),
        CheckConstraint(
            f"last_outcome IS NULL OR {_in('last_outcome', CRAWL_OUTCOMES)}", name="outcome"
        ),
    )


class TimelinePoll(Base):
    """One row per poll of a follow (``TimelinePolled``): what it counted and ended on.

    The same poll made twice (its request redelivered) is one row, the one that ended
    first. Pruned by the recorder's retention, which keeps each follow's polls from its
    newest success on.
    """

    __tablename__ = "timeline_polls"

    follow_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    poll: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    completed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    outcome: Mapped[str] = mapped_column(String(16), nullable=False)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    posts: Mapped[int] = mapped_column(Integer, nullable=False)
    links: Mapped[int] = mapped_column(Integer, nullable=False)
    skipped: Mapped[int] = mapped_column(Integer, nullable=False)
    cursor: Mapped[str | None] = mapped_column(Text)
    next_poll_after: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: The ``event_id`` of a success that asked the instance nothing (deferred for its
    #: host's slot), which tells nothing of it: so while it is the row's ``event_id``
    #: (another copy of the poll written in its place, by any release, asked). 0018.
    unasked_event: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))

    # A follow's newest success, found at once: a follow that fails for months (a dead
    # instance nobody unfollowed) would otherwise have its whole run read for it.
    __table_args__ = (
        Index("ix_timeline_polls_follow_id_outcome_poll", "follow_id", "outcome", "poll"),
    )


class InstanceUnfollow(Base):
    """One row per ``InstanceUnfollowed``, for a follow applied after it to find."""

    __tablename__ = "instance_unfollows"

    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    instance: Mapped[str] = mapped_column(String(MAX_URL_LENGTH), nullable=False, index=True)
    #: None: every timeline of the instance.
    timeline: Mapped[str | None] = mapped_column(String(120))
    unfollowed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class PageShare(Base):
    """One row per (shared URL, public post that shared it), from ``TimelinePolled``.

    ``url`` is the canonical URL, joined to ``pages.url`` (the page may not be crawled
    yet, so no foreign key). The row keeps the earliest sighting of the post.
    """

    __tablename__ = "page_shares"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    url: Mapped[str] = mapped_column(String(MAX_URL_LENGTH), nullable=False)
    #: The post's ActivityPub id: one post, however many instances show it.
    post_uri: Mapped[str] = mapped_column(String(MAX_URL_LENGTH), nullable=False)
    post_url: Mapped[str | None] = mapped_column(String(MAX_URL_LENGTH))
    #: The followed instance whose timeline showed the post.
    instance: Mapped[str] = mapped_column(String(MAX_URL_LENGTH), nullable=False)
    account: Mapped[str] = mapped_column(Text, nullable=False)
    shared_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    language: Mapped[str | None] = mapped_column(String(35))
    #: When the poll that first showed the post ended (the retention's age, indexed).
    first_seen_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, index=True
    )

    # The post by its md5: two URLs of up to 2,048 characters could pass the largest
    # entry a btree takes (2,704 bytes), and the insert would fail for good. The index
    # also serves the join on ``url``.
    __table_args__ = (
        Index(
            "uq_page_shares_url_post_uri", "url", func.md5(literal_column("post_uri")), unique=True
        ),
        # An account's shares, found by its key when it opted out (0017).
        Index("ix_page_shares_account_md5", func.md5(literal_column("account"))),
    )


class ProjectedEvent(Base):
    """Which events were applied, written in the same transaction as their effect.

    Kept as long as the record can deliver a copy of the event again (see the recorder's
    ``retention``): for ever while ``TROVE_EVENTS`` is.
    """

    __tablename__ = "projected_events"
    # A b-tree, not BRIN: once ids leave, new rows refill the pages they left, and a BRIN
    # range's summary only widens, so the retention's scan would come to read the table.
    __table_args__ = (Index("ix_projected_events_projected_at", "projected_at"),)

    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    event_type: Mapped[str] = mapped_column(String(40), nullable=False)
    projected_at: Mapped[datetime] = _now()


class Outbox(Base):
    """Events the recorder must publish (retries), written with the projection that caused them.

    A publisher loop sends unsent rows and marks them; a crash between the two re-sends
    with the same Nats-Msg-Id, which JetStream's duplicate window drops.
    """

    __tablename__ = "outbox"

    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    subject: Mapped[str] = mapped_column(String(255), nullable=False)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    deliver_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()
    published_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)


class FetcherAttempt(Base):
    """The audit: one row per fetch attempt, with its verdict (``trove_schema.heuristics``).

    Projected from ``CrawlCompleted`` (``event_id``) and kept for
    ``TROVE_AUDIT_RETENTION_SECONDS``, then deleted by the recorder in batches.
    ``page_id`` has no foreign key: what was learnt about a host outlives its pages.
    """

    __tablename__ = "fetcher_attempts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False, unique=True)
    page_id: Mapped[int | None] = mapped_column(BigInteger)
    url: Mapped[str] = mapped_column(String(MAX_URL_LENGTH), nullable=False)
    host: Mapped[str] = mapped_column(String(253), nullable=False)
    #: The fetch strategy used (``http``).
    fetcher: Mapped[str] = mapped_column(Text, nullable=False)
    #: Usable content came back (not merely a 200).
    success: Mapped[bool] = mapped_column(Boolean, nullable=False)
    #: The site refused Trove (403, 429, a bot challenge).
    is_banned: Mapped[bool] = mapped_column(Boolean, nullable=False)
    error_type: Mapped[str | None] = mapped_column(Text)
    http_status: Mapped[int | None] = mapped_column(Integer)
    #: Selected response headers; never cookies, never a body.
    response_headers: Mapped[dict[str, str]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )
    duration_ms: Mapped[int] = mapped_column(Integer, nullable=False)
    attempted_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, index=True
    )

    # A host's attempts by time, with their verdicts: ``trove domain HOST`` counts a busy
    # host's audit from the index alone, without a fetch of each row from the table.
    __table_args__ = (
        Index(
            "ix_fetcher_attempts_host_attempted_at_verdict",
            "host",
            "attempted_at",
            postgresql_include=["success", "is_banned", "error_type"],
        ),
    )


class AttemptHeuristic(Base):
    """Tags of an attempt (``trove_schema.heuristics``): text, so new kinds need no migration."""

    __tablename__ = "attempt_heuristics"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    #: No foreign key: the projection writes the tags in their attempt's transaction, and
    #: checking one for each of ~20 rows an attempt doubled the time of writing them
    #: (migration 0005). Retention deletes them with their attempt.
    attempt_id: Mapped[int] = mapped_column(BigInteger, nullable=False, index=True)
    heuristic_type: Mapped[str] = mapped_column(Text, nullable=False)
    heuristic_value: Mapped[str] = mapped_column(Text, nullable=False)
    importance_score: Mapped[float] = mapped_column(Float, nullable=False, server_default="0.5")

    __table_args__ = (
        CheckConstraint("importance_score BETWEEN 0 AND 1", name="importance"),
        Index("ix_attempt_heuristics_type_value", "heuristic_type", "heuristic_value"),
    )


class HostPolicyRow(Base):
    """Each host's learned policy (``trove_schema.policy``), folded from its attempts.

    The fetchers act on their own copy in KV and never read this table: it is the
    operator's view (``trove domain HOST``), rebuilt by replay like every projection.
    ``policy`` is ``HostPolicy.to_json()``; the columns beside it repeat what an
    operator filters hosts by. ``last_event_id`` is the newest attempt folded in, so
    the same event is never folded twice.
    """

    __tablename__ = "host_policies"

    host: Mapped[str] = mapped_column(String(253), primary_key=True)
    policy: Mapped[dict[str, object]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )
    paused_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    pause_reason: Mapped[str | None] = mapped_column(Text)
    risk_level: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    attempt_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    last_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_event_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    updated_at: Mapped[datetime] = _now()
