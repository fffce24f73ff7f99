"""A re-crawl request names the URL whose answer gave its validators (the attempt's
``final_url``), so that the fetcher sends them to that URL only, on real NATS."""

from __future__ import annotations

import pytest

from tests.discovery.test_recrawl import PAGE, SCOPE, replica, scheduled_request
from trove_schema.bus import Bus
from trove_schema.events import CrawlCompleted, CrawlOutcome, utcnow

pytestmark = pytest.mark.usefixtures("clean")

DEPLOYED = "Wed, 01 Jan 2025 00:00:00 GMT"


def fetched(**changes: object) -> CrawlCompleted:
    now = utcnow()
    event = CrawlCompleted(
        url=PAGE,
        domain="site.example",
        scope=SCOPE,
        request_id="work-1",
        outcome=CrawlOutcome.SUCCESS,
        started_at=now,
        completed_at=now,
        last_modified=DEPLOYED,
        content_hash="a",
    )
    return event.model_copy(update=changes)


async def test_a_recrawl_of_a_redirected_page_names_its_final_url_as_the_validators_url(
    bus: Bus,
) -> None:
    redirected = fetched(final_url="https://site.example/page/en/")
    await (await replica(bus))._request_recrawl(redirected)

    pending = await scheduled_request(bus)
    assert pending.last_modified == DEPLOYED
    assert pending.validators_url == "https://site.example/page/en/"


async def test_a_recrawl_of_a_page_that_answered_itself_names_the_page(bus: Bus) -> None:
    await (await replica(bus))._request_recrawl(fetched())

    pending = await scheduled_request(bus)
    assert pending.last_modified == DEPLOYED
    assert pending.validators_url == PAGE


async def test_a_recrawl_read_whole_names_no_validators_url(bus: Bus) -> None:
    redirected = fetched(final_url="https://site.example/page/en/")
    await (await replica(bus))._request_recrawl(redirected, validators=False)

    pending = await scheduled_request(bus)
    assert (pending.etag, pending.last_modified, pending.validators_url) == (None, None, None)
