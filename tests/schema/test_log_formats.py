"""What a service's log lines say, in either format (``TROVE_LOG_FORMAT``)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from trove_schema.service import JsonFormatter, TextFormatter


@pytest.fixture
def written() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger = logging.getLogger("trove.tests.log_formats")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.handlers[:] = [handler]
    try:
        yield logger, out
    finally:
        logger.handlers[:] = []


def _crawled(logger: logging.Logger) -> None:
    logger.info(
        "crawled",
        extra={
            "url": "https://blog.example/a%20b",
            "domain": "blog.example",
            "status": 503,
            # What a server's error can say: spaces, quotes, a line of its own.
            "error": 'TLS error: "bad record"\nforged: line',
        },
    )


def test_the_text_format_says_each_field_on_the_records_one_line(
    written: tuple[logging.Logger, io.StringIO],
) -> None:
    # The fields were dropped: "... fetcher INFO crawled", no URL, no domain, no reason.
    logger, out = written
    logger.handlers[0].setFormatter(TextFormatter("fetcher"))
    _crawled(logger)
    logger.warning("a title %s", "with\na newline")
    first, second = out.getvalue().splitlines()
    assert first.split(" ", 2)[2] == (
        "fetcher INFO crawled url=https://blog.example/a%20b domain=blog.example status=503 "
        'error="TLS error: \\"bad record\\"\\nforged: line"'
    )
    assert second.endswith("fetcher WARNING a title with\\na newline")


def test_the_json_format_is_one_object_a_line_with_every_field(
    written: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = written
    logger.handlers[0].setFormatter(JsonFormatter())
    _crawled(logger)
    (line,) = out.getvalue().splitlines()
    entry = json.loads(line)
    assert (entry["level"], entry["message"], entry["domain"], entry["status"]) == (
        "info",
        "crawled",
        "blog.example",
        503,
    )
    assert entry["error"].endswith("\nforged: line")
