"""Which Postgres answers are about the server rather than the statement (SQLSTATEs).

Read by the recorder for each batch (``trove_recorder.database``: a ``Retry``, nothing
counted against the events) and by every service's start (``service.infrastructure_away``:
wait and try again, no crash loop), so both judge the same answers the same way. A
refused login is neither the events' fault nor a server away: the recorder's batches
wait for it for a while and then the recorder ends, and a start ends at once
(``infrastructure_away`` does not read it), so that the restart reads the deployment's
current URL.
"""

from __future__ import annotations

#: The server is away, going away, or coming back.
UNAVAILABLE = frozenset(
    {
        "57P01",  # admin_shutdown: the server is shutting down
        "57P02",  # crash_shutdown: another backend crashed, the server restarts
        "57P03",  # cannot_connect_now: starting up, in recovery, or a standby
        "57P05",  # idle_session_timeout: the server ended the session
        "53300",  # too_many_connections
    }
)
#: Class 08, connection exception: the connection failed or was lost.
CONNECTION_EXCEPTION_CLASS = "08"
#: read_only_sql_transaction: the server is a standby, or a primary made read-only.
READ_ONLY = "25006"
#: The server is there but cannot take writes now. Each is the state of the server,
#: never of what was asked: the same writes succeed once an operator frees the disk,
#: promotes a server, mends an index or grants the role its rights.
#: out_of_memory (53200) is not among them: a batch too large for the server's memory
#: would fail again whole, and one event at a time, the recorder's fallback, fits.
UNWRITABLE = frozenset(
    {
        "53000",  # insufficient_resources
        "53100",  # disk_full: a table or an index could not grow
        "58000",  # system_error: an error outside Postgres, from the operating system
        "58030",  # io_error: the disk failed a read or a write
        READ_ONLY,
        "55P03",  # lock_not_available: a lock held past lock_timeout (a migration, VACUUM FULL)
        "XX001",  # data_corrupted
        "XX002",  # index_corrupted
        "42501",  # insufficient_privilege: the role's rights were taken away
    }
)
#: The transaction lost a race with another one (deadlock_detected, serialization_failure).
CONFLICT = frozenset({"40P01", "40001"})
#: query_canceled: a statement ran past ``statement_timeout``, or an operator cancelled it.
#: A batch of many events may be too large for the timeout and is tried one at a time;
#: one bounded event that cannot finish met a slow or busy server (throttled I/O, a
#: ``VACUUM FULL`` or a long transaction holding a lock), which is not the event's fault.
CANCELED = "57014"


def away(state: str) -> bool:
    """Whether ``state`` says the server is away, going away or coming back."""
    return state in UNAVAILABLE or state.startswith(CONNECTION_EXCEPTION_CLASS)


def unwritable(state: str) -> bool:
    """Whether ``state`` says the server is there but cannot take writes now."""
    return state in UNWRITABLE


#: Class 28, invalid authorization specification: the server refuses the login (28P01:
#: the password was changed; 28000: the role is gone, or pg_hba.conf has no entry for it).
REFUSED_LOGIN_CLASS = "28"
#: invalid_catalog_name: the database the URL names is not there (dropped, renamed).
NO_DATABASE = "3D000"


def refused(state: str) -> bool:
    """Whether ``state`` says the server refuses this login: every new connection meets
    the same until the deployment is mended, and only a restart reads its new URL."""
    return state.startswith(REFUSED_LOGIN_CLASS) or state == NO_DATABASE
