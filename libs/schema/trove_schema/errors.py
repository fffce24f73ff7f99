"""Errors raised by trove_schema.

    TroveError
    ├── MalformedEvent       bytes on the wire that are not a valid Trove event
    ├── TopologyError        a stream, consumer or bucket could not be created or reconciled
    └── StackError           the embedded or external servers could not be started or reached
"""


class TroveError(Exception):
    """Base of every error Trove raises on purpose."""


class MalformedEvent(TroveError):
    """The bytes are not a valid Trove event (poison message): park it, never retry it."""


class TopologyError(TroveError):
    """A stream, consumer or KV bucket could not be created or reconciled."""


class StackError(TroveError):
    """A server of the stack (NATS, Postgres) could not be started or reached."""
