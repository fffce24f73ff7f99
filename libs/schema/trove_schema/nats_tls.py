"""The TLS context a NATS client connects with, from the TROVE_NATS_TLS_* settings.

Every process that talks to NATS (the services, the CLI) connects with the same
context, so a deployment that turns TLS on names its CA once, in the environment.
"""

from __future__ import annotations

import ssl

from trove_schema.errors import InvalidTLS
from trove_schema.settings import CommonSettings


def client_tls(settings: CommonSettings | None = None) -> ssl.SSLContext | None:
    """A verifying context for the configured CA (and client certificate), or None.

    None leaves the choice to nats-py: plain TCP for ``nats://``, the system's CAs for
    ``tls://`` or a server that requires TLS.
    """
    settings = settings or CommonSettings()
    if settings.nats_tls_ca is None and settings.nats_tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if settings.nats_tls_ca is not None:
            context.load_verify_locations(cafile=str(settings.nats_tls_ca))
        if settings.nats_tls_cert is not None:
            context.load_cert_chain(
                str(settings.nats_tls_cert),
                None if settings.nats_tls_key is None else str(settings.nats_tls_key),
            )
    except (OSError, ssl.SSLError) as exc:  # a Secret mounted elsewhere, not PEM
        files = [settings.nats_tls_ca, settings.nats_tls_cert, settings.nats_tls_key]
        named = ", ".join(str(f) for f in files if f is not None)
        raise InvalidTLS(f"the NATS TLS files ({named}) cannot be used: {exc}") from exc
    return context
