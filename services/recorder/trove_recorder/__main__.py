"""Entry point: `python -m trove_recorder` (or `trove-recorder`)."""

from __future__ import annotations

import sys
from functools import partial

from trove_recorder.recorder import serve
from trove_schema.service import run
from trove_schema.settings import RecorderSettings


def main() -> int:
    settings = RecorderSettings()
    return run("recorder", settings, partial(serve, settings))


if __name__ == "__main__":
    sys.exit(main())
