"""Entry point: `python -m trove_discovery` (or `trove-discovery`)."""

from __future__ import annotations

import sys
from functools import partial

from trove_discovery.app import serve
from trove_schema.service import run
from trove_schema.settings import DiscoverySettings, load_settings


def main() -> int:
    settings = load_settings(DiscoverySettings, "discovery")
    return run("discovery", settings, partial(serve, settings))


if __name__ == "__main__":
    sys.exit(main())
