"""Errors raised by trove_schema.

TroveError
├── MalformedEvent       bytes on the wire that are not a valid Trove event
├── InvalidURL           a URL Trove will not crawl; ``reason`` says why
├── WindowLost           an index's change window starts past its database's transactions
├── BrokerClosed         the NATS client closed the connection for good: the service ends
├── TopologyError        a stream, consumer or bucket could not be created or reconciled
├── RetentionRefused     a stream's shorter retention would drop schedules it holds
├── MigrationStopped     a migrator stopped while it waited for a lock; it held nothing
├── StackError           the embedded or external servers could not be started or reached
├── InvalidPriors        the seed priors file (TROVE_PRIORS_FILE) cannot be read
├── InvalidTLS           the NATS TLS files (TROVE_NATS_TLS_*) cannot be read or used
├── InvalidExclusion     an excluded host (TROVE_EXCLUDED_HOSTS) that names no host
├── UnknownSetting       a TROVE_* variable no settings object knows (``settings``)
├── Retry                a handler hands its message back, to come again (``bus``)
├── MessageTooLarge      a message over the server's max_payload, refused unsent (``bus``)
└── Overtaken            a publish found its subject written since it was read (``bus``)
"""


class TroveError(Exception):
    """Base of every error Trove raises on purpose."""


class MalformedEvent(TroveError):
    """The bytes are not a valid Trove event (poison message): park it, never retry it."""


class WindowLost(TroveError):
    """An index's window of changes (``changes``) starts past the transactions of the
    database it reads: another database than the one it read before. It reads every
    page again."""


class BrokerClosed(TroveError):
    """The NATS client closed the connection for good (a server's ``-ERR``: a password
    changed by a reload, a credential revoked), which no reconnect follows, or a first
    connection was turned away for the patience: the service ends, and its restart
    connects anew."""


class TopologyError(TroveError):
    """A stream, consumer or KV bucket could not be created or reconciled."""


class RetentionRefused(TroveError):
    """A stream's retention, shortened by its owner's settings, would age out schedules
    it holds (re-crawls, polls, deferred work): the owner does not apply it, and stops."""


class MigrationStopped(TroveError):
    """The migrator was stopped while it waited, for the migrators' lock or to try again
    a migration that gave way: it left holding nothing, and the next start migrates."""


class StackError(TroveError):
    """A server of the stack (NATS, Postgres) could not be started or reached."""


class InvalidPriors(TroveError):
    """The seed priors file is missing, is not TOML, or says something impossible."""


class InvalidTLS(TroveError):
    """A NATS TLS file (CA, certificate, key) is missing, unreadable or not PEM."""


class InvalidExclusion(TroveError, ValueError):
    """An excluded host that names no host Trove could crawl; the message says why.

    A ValueError too, so that a settings validator reports it as a bad value.
    """


class InvalidURL(TroveError):
    """A URL Trove will not crawl: not http(s), no host, too long, a private address..."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        #: Why, in words for the operator (e.g. "scheme 'ftp' is not http or https").
        self.reason = reason
