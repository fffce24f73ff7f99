"""Entry point: `python -m trove_fetcher` (or `trove-fetcher`)."""

from __future__ import annotations

import sys
from functools import partial

from trove_fetcher.app import serve
from trove_schema.service import run
from trove_schema.settings import FetcherSettings, load_settings


def main() -> int:
    settings = load_settings(FetcherSettings, "fetcher")
    return run("fetcher", settings, partial(serve, settings))


if __name__ == "__main__":
    sys.exit(main())
