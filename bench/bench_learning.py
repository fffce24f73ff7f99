"""What the learning system adds to a page's CPU, beside what extracting the page costs.

For each page of a sandbox web (the pages ``bench_vs_scrapy.py`` crawls: ~30 KiB, ~100
links), in one process and one run, alternating:

* **extract**: ``http``'s reader on the body (lxml, links, language, keywords), the part
  of a page every crawler pays;
* **learning, fetcher side**: what the fetcher does for a page because of the learning
  system: ``strategies.applicable``, ``policy.choose``, ``Observation.of`` (the audit's
  verdict and tags) and ``policy.observe``, and the policy's JSON both ways (it rides in
  the lease's KV record);
* **learning, recorder side**: the same fold for ``host_policies`` (``Observation.of`` and
  ``observe``) without the choice;
* **learning, discovery side**: the fold of a page into its host's URL alias record
  (``aliases.observe``) and the record's JSON both ways (it lives in a KV bucket).

It prints microseconds of CPU per page for each and the learning's share of the
extraction. Medians of ``--rounds``; nothing is asserted.

    .venv/bin/python bench/bench_learning.py [--pages 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trove_fetcher.completion import completed
from trove_fetcher.http import FetchResult
from trove_fetcher.strategies import STRATEGIES, applicable
from trove_sandbox import SandboxWeb
from trove_schema.aliases import HostAliases
from trove_schema.aliases import observe as observe_aliases
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    PageDiscovered,
    Provenance,
    Scope,
)
from trove_schema.policy import (
    HostPolicy,
    LearningConfig,
    Observation,
    choose,
    observe,
)


def pages(count: int) -> list[tuple[str, bytes]]:
    web = SandboxWeb.generate(hosts=max(1, count // 10), pages_per_host=10, seed=3, page_kb=30)
    found: list[tuple[str, bytes]] = []
    for spec in web.page_specs():
        response = web.page(spec.host, spec.path)
        if response.status == 200 and response.body:
            found.append((web.url(spec.host, spec.path), response.body))
        if len(found) >= count:
            break
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    corpus = pages(args.pages)
    http = STRATEGIES["http"]
    config = LearningConfig()
    now = datetime.now(UTC)
    events: list[CrawlCompleted] = []
    extracting: list[float] = []
    fetcher_side: list[float] = []
    recorder_side: list[float] = []
    discovery_side: list[float] = []
    for _ in range(args.rounds):
        began = time.process_time()
        extractions = [
            http.extract(
                body,
                url=url,
                content_type="text/html",
                x_robots_tag=None,
                robots_token="TroveBot",  # noqa: S106 - a robots.txt token
            )
            for url, body in corpus
        ]
        extracting.append((time.process_time() - began) / len(corpus))
        if not events:
            for (url, body), extraction in zip(corpus, extractions, strict=True):
                work = PageDiscovered(
                    url=url,
                    domain=url.split("/")[2],
                    scope=Scope(),
                    provenance=Provenance(kind="seed"),
                )
                result = FetchResult(
                    url=url,
                    outcome=CrawlOutcome.SUCCESS,
                    final_url=url,
                    status_code=200,
                    body=body,
                    content_type="text/html",
                    started=0.0,
                    completed=0.05,
                )
                events.append(completed(work, result, extraction, now - timedelta(seconds=1)))
        policies: dict[str, HostPolicy] = {}
        began = time.process_time()
        for event in events:
            raw = policies.get(event.domain)
            policy = (
                HostPolicy()
                if raw is None
                else HostPolicy.from_json(json.loads(json.dumps(raw.to_json())))
            )
            choose(policy, event.url, applicable(event.url), config)
            policies[event.domain] = observe(policy, Observation.of(event), config)
        fetcher_side.append((time.process_time() - began) / len(events))
        folded: dict[str, HostPolicy] = {}
        began = time.process_time()
        for event in events:
            before = folded.get(event.domain, HostPolicy())
            folded[event.domain] = observe(before, Observation.of(event), config)
        recorder_side.append((time.process_time() - began) / len(events))
        records: dict[str, bytes] = {}
        began = time.process_time()
        for event in events:
            record = observe_aliases(
                HostAliases.from_json(records.get(event.domain)),
                url=event.url,
                canonical=event.canonical_url,
                content_hash=event.content_hash,
                links=[link.url for link in event.links],
                event_id=event.id,
            )
            records[event.domain] = record.to_json()
        discovery_side.append((time.process_time() - began) / len(events))
    extract_us = statistics.median(extracting) * 1e6
    fetcher_us = statistics.median(fetcher_side) * 1e6
    recorder_us = statistics.median(recorder_side) * 1e6
    discovery_us = statistics.median(discovery_side) * 1e6
    print(f"pages: {len(corpus)}, rounds: {args.rounds} (medians, CPU per page)")
    print(f"  extract (http reader)        {extract_us:9.1f} us")
    print(f"  learning, fetcher side       {fetcher_us:9.1f} us  ({fetcher_us / extract_us:.1%})")
    print(f"  learning, recorder side      {recorder_us:9.1f} us  ({recorder_us / extract_us:.1%})")
    share = discovery_us / extract_us
    print(f"  learning, discovery side     {discovery_us:9.1f} us  ({share:.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
