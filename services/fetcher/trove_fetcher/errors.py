"""Errors raised by the fetcher's network layer.

    FetcherError
    ├── BlockedAddress        a host not to connect to: private (SSRF), or excluded by the operator
    ├── RedirectPaused        a redirect hop must wait for its host's slot: continue later
    ├── GateDeferred          a timeline poll's next request must wait for its host's slot
    ├── HopGateFailed         what a redirect hop asks first failed for its own reasons
    ├── TooManyRedirects      more same-host redirect hops than allowed, or a redirect loop
    ├── RobotsUnavailable     a redirect hop's robots.txt could not be read: nothing known yet
    ├── DnsError              a name could not be turned into addresses (``trove_fetcher.dns``)
    │   ├── NameNotFound          no such name, or no address for it (cached: negative TTL)
    │   ├── DnsTimeout            no answer within the lookup timeout
    │   ├── DnsFailure            the nameservers failed (SERVFAIL, refused, garbled)
    │   └── ResolverAway          (also a NetworkAway)
    ├── NetworkAway           the pod's own network is away: not the host's fault
    │   ├── ResolverAway          the pod's own nameservers answer nothing
    │   ├── EgressAway            no connection succeeds, to any address (``trove_fetcher.egress``)
    │   └── PodExhausted          the pod is out of descriptors, buffers or DNS query slots
    └── ContentError          the body cannot be taken as it was sent
        ├── DecompressionBomb     it inflates past the size cap at an absurd ratio
        ├── UndecodableBody       its Content-Encoding is corrupt
        ├── UnsupportedContent    a Content-Encoding Trove did not ask for
        ├── CrumbledBody          it comes in thousands of pieces of a few bytes
        └── UnusableContent       a strategy cannot read the body (also a ValueError)
            ├── PdfError              not a PDF, or one pypdf cannot read within its limits
            └── NotActivityStreams    not an ActivityStreams object, or a malformed one

``fetch()`` (``trove_fetcher.http``) never raises any of these for something a site
does: it turns them, and httpx's transport errors, into a ``CrawlOutcome``. Only
``BlockedAddress`` and ``NetworkAway`` leave the transport, through
``httpx.AsyncClient.send``. ``RedirectPaused`` leaves ``fetch()`` and
``fetch_robots()`` (their caller's hop gate raises it, and the caller continues the
chain later), and so does ``NetworkAway``, which no site caused: the work waits.
A page larger than the size cap is not an error: it is cut and marked ``truncated``.
"""

from __future__ import annotations

import errno
import ssl


class FetcherError(Exception):
    """Base of every error the fetcher's network layer raises on purpose."""


class BlockedAddress(FetcherError):
    """A host the fetcher refuses to connect to: it resolved to a private address, or
    the operator excluded it (``trove_schema.exclusions``; then before it is looked up).

    Raised before any connection is attempted, whatever the source of the URL
    (a link, a redirect, a robots.txt redirect, a seed, a timeline poll).
    """

    def __init__(self, host: str, address: str, reason: str) -> None:
        self.host = host
        self.address = address
        self.reason = reason
        if host == address:
            super().__init__(f"{address} ({reason})")
        else:
            super().__init__(f"{host} resolves to {address} ({reason})")


class RobotsUnavailable(FetcherError):
    """A redirect hop's robots.txt could not be read (a 5xx, a timeout): the hop is
    neither allowed nor refused by the site, so the attempt fails and is tried again."""


class RedirectPaused(FetcherError):
    """The next redirect hop may not be requested yet (its host's gap); not a failure.

    ``hops`` is the chain followed so far, its last URL the one still to request, and
    ``at`` the slot reserved for it on that URL's host. ``permanent``: every hop so far
    was a permanent redirect (301, 308), as the fetch that paused knew.
    """

    def __init__(self, hops: tuple[str, ...], at: float) -> None:
        super().__init__(f"redirect to {hops[-1]} waits until {at:.3f}")
        self.hops = hops
        self.at = at
        self.permanent = False


class GateDeferred(FetcherError):
    """The next request of a timeline poll may not go yet (the host's gap); not a failure.

    Raised by the poll's request gate when the host's slot, ``wait`` seconds away, is
    too far to wait for in the task: the poll ends with what it has read.
    """

    def __init__(self, wait: float) -> None:
        super().__init__(f"the host's next slot is {wait:.3f} s away")
        self.wait = wait


class HopGateFailed(FetcherError):
    """What is asked before a redirect hop (the gate, or ``robots_allows``) failed for its
    own reasons (the broker, say), not the site's: carried past ``fetch()``'s
    classification so the caller sees it, as ``__cause__``. (A KV read that times out
    raises a ``TimeoutError``, which would otherwise be taken for the site's.)"""


class TooManyRedirects(FetcherError):
    """More same-host redirects than ``max_redirects``, or a hop back to a visited URL."""


class DnsError(FetcherError):
    """A name could not be turned into addresses; the transport makes it a ConnectError."""


class NameNotFound(DnsError):
    """The name does not exist, or has no A or AAAA record."""


class DnsTimeout(DnsError):
    """No answer within the lookup timeout."""


class DnsFailure(DnsError):
    """The nameservers answered with a failure, or not in a way that could be read."""


class NetworkAway(FetcherError):
    """The pod's own network is away, not the host: nothing is recorded against it.

    The work is handed back until the network works again, as it is while the broker
    or the database is away: for ``retry_after`` seconds, when the watch that saw the
    outage looks again (``dns_recheck_seconds``, ``egress_recheck_seconds``).
    """

    def __init__(self, message: str, *, retry_after: float = 10.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ResolverAway(DnsError, NetworkAway):
    """The pod's own nameservers give no answer to anything, the root zone included
    (a cluster DNS restarting, a pod whose network is gone)."""


class EgressAway(NetworkAway):
    """No connection of the pod succeeds, to any address, while many fail: its way out
    (a NAT gateway, a NetworkPolicy, the node's uplink) is taken to be down."""


class PodExhausted(NetworkAway):
    """The pod ran out of something of its own: file descriptors (EMFILE, ENFILE),
    socket buffers or kernel memory (ENOBUFS, ENOMEM), or a free DNS query slot.

    The host was never asked, or its answer never read. Other connections of the pod
    may still succeed at the same moment, so the egress watch cannot tell this apart:
    the error itself does.
    """

    #: What the kernel answers when the pod, not the network or the host, is short.
    SHORTAGES = {
        errno.EMFILE: "file descriptors",
        errno.ENFILE: "file descriptors (the node's)",
        errno.ENOBUFS: "socket buffers",
        errno.ENOMEM: "kernel memory",
    }

    @classmethod
    def of(cls, exc: BaseException) -> PodExhausted | None:
        """``exc`` as the pod's shortage, or None when it is something else."""
        # An SSLError's errno is OpenSSL's error code, not the kernel's.
        if not isinstance(exc, OSError) or isinstance(exc, ssl.SSLError):
            return None
        short = cls.SHORTAGES.get(exc.errno) if exc.errno is not None else None
        return None if short is None else cls(f"the pod is out of {short}: {exc}")


class ContentError(FetcherError):
    """The response body cannot be taken as it was sent."""


class DecompressionBomb(ContentError):
    """The body inflates past the size cap at more than the allowed ratio."""


class UndecodableBody(ContentError):
    """The body is not valid for its Content-Encoding (corrupt gzip or deflate data)."""


class UnsupportedContent(ContentError):
    """A Content-Encoding the fetcher did not offer in Accept-Encoding."""


class CrumbledBody(ContentError):
    """The body comes in thousands of pieces of a few bytes (a chunk a byte): reading it
    would hold the event loop as long as the server keeps sending."""


class UnusableContent(ContentError, ValueError):
    """The body is not something the strategy that asked for it can read.

    Raised by extraction (in the parser pool), never by ``fetch()``: the fetcher records
    the attempt as ``rejected`` with the reason, and the audit calls it ``wrong_tool``.
    """


class PdfError(UnusableContent):
    """Not a PDF, or one that cannot be read within the reader's limits."""


class NotActivityStreams(UnusableContent):
    """Not an ActivityStreams object with content, or one with malformed fields."""
