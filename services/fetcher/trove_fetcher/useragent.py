"""The User-Agent Trove sends: ``TroveBot/<version> (+<bot info url>)``.

The product token is the robots.txt token (``TROVE_ROBOTS_TOKEN``, ``TroveBot``), so a
webmaster who reads the header in their logs knows what to write in robots.txt; the
URL explains what the bot does and how to opt out (docs/bot.md).
"""

from __future__ import annotations

from importlib import metadata

from trove_schema.settings import FetcherSettings

#: Shown when Trove runs from a source tree that was never installed.
UNKNOWN_VERSION = "0+unknown"


def trove_version() -> str:
    try:
        return metadata.version("trove")
    except metadata.PackageNotFoundError:
        return UNKNOWN_VERSION


def user_agent(settings: FetcherSettings) -> str:
    """``settings.user_agent`` when set, else ``<token>/<version> (+<bot info url>)``."""
    if settings.user_agent.strip():
        return settings.user_agent.strip()
    return f"{settings.robots_token}/{trove_version()} (+{settings.bot_info_url})"
