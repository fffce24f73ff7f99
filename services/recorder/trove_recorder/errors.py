"""Errors raised by trove_recorder.

    TroveError                   (trove_schema.errors)
    └── RecorderError            anything the recorder or a replay stops on, on purpose
        ├── LoginRefused         Postgres refused every login for the patience: the
        │                        recorder ends, and its restart reads the current URL
        ├── NotEmpty             a whole replay's database already holds projections
        ├── RecordIncomplete     the tables go back further than the event record
        ├── RebuildUnfinished    a whole replay stopped partway, and a replay --since
        │                        a later time would leave a hole
        ├── LockLost             a replay's lock went with its connection
        ├── RebuildUnderWay      a retention pass met a whole replay's rebuild, running
        │                        or stopped partway: it waits for the next pass
        └── ReplayStalled        no event came from NATS for a replay's patience

A batch's trouble is not among them: the database's errors become a ``Retry`` (the
events handed back) or, for an event of its own fault, a failure the consumer counts
and parks (``trove_recorder.database``).
"""

from __future__ import annotations

from datetime import datetime

from trove_schema.errors import TroveError


class RecorderError(TroveError):
    """Base of every error trove_recorder raises on purpose."""


class LoginRefused(RecorderError):
    """Postgres refused every login of the recorder for the patience: the recorder ends,
    and its restart reads the deployment's current ``TROVE_DATABASE_URL``."""


class NotEmpty(RecorderError):
    """The target database already holds projections; replay refuses to mix them."""


class RecordIncomplete(RecorderError):
    """The tables hold what the event record no longer does (its retention removed the
    oldest events): a whole replay would empty them and rebuild only what is left."""


class RebuildUnfinished(RecorderError):
    """A whole replay stopped before the end of the record (its mark is in
    ``rebuild_marks``), and this replay ``--since`` a later time would leave a hole."""


class LockLost(RecorderError):
    """The replay's lock went with its connection: the replay stopped."""


class ReplayStalled(RecorderError):
    """No event came from NATS for the replay's patience: the broker stayed away.

    ``applied_until``: when the stream stored the last event the replay applied (a
    ``--since`` for the next run), None when it applied none."""

    applied_until: datetime | None = None


class RebuildUnderWay(RecorderError):
    """A whole replay is rebuilding the tables, or stopped before its end: retention
    leaves them alone until it is finished, as the live batches do. It would delete
    rows the replay reads again (a held retry's causing attempt, which tells whether it
    was overtaken)."""
