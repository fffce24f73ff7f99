"""Entry point: `python -m trove_recorder` (or `trove-recorder`) runs the recorder;
`trove-recorder replay [--truncate]` rebuilds the projections from the event record, and
`trove-recorder replay --since 2h` re-applies a recent window of it."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from functools import partial

from trove_recorder.recorder import serve
from trove_recorder.replay import run_replay, since_of
from trove_recorder.retries import RetryPolicy
from trove_schema.policy import LearningConfig
from trove_schema.service import run
from trove_schema.settings import RecorderSettings, check_environment, load_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trove-recorder")
    sub = parser.add_subparsers(dest="command")
    replay = sub.add_parser("replay", help="rebuild every projection from the streams")
    window = replay.add_mutually_exclusive_group()
    window.add_argument("--truncate", action="store_true", help="empty the tables first")
    window.add_argument(
        "--since",
        metavar="WHEN",
        help="re-apply the events from then on (2h, 30m, 1d, or 2026-11-28T04:00Z)",
    )
    args = parser.parse_args(argv)
    settings = load_settings(RecorderSettings, "recorder")
    if args.command == "replay":
        check_environment()
        if not settings.nats_url or not settings.database_url:
            print("replay needs TROVE_NATS_URL and TROVE_DATABASE_URL")
            return 2
        policy = RetryPolicy.from_settings(settings)
        learning = LearningConfig.from_settings(settings)
        try:
            since = None if args.since is None else since_of(args.since, datetime.now(UTC))
        except ValueError as exc:
            print(f"error: {exc}")
            return 2
        return run_replay(
            settings.nats_url, settings.database_url, policy, args.truncate, learning, since
        )
    return run("recorder", settings, partial(serve, settings))


if __name__ == "__main__":
    sys.exit(main())
