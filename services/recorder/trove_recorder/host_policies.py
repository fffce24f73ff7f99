"""The ``host_policies`` projection: each host's learned policy, for the operator.

Each ``CrawlCompleted`` is folded into its host's policy with the fetcher's own fold
(``trove_schema.policy.observe``), in stream order within a batch, so the table says
what the fetchers act on. A batch costs three statements whatever its size: the rows of
new hosts are created, the batch's hosts are locked (in host order, so concurrent
batches never deadlock) and read, and the folded rows are written back. Idempotent
twice over: an event is folded only when ``projected_events`` took its id (the caller's
check), and never when it is the host's ``last_event_id``.

Unlike the other projections, it depends on order: the fold escalates and forgives
by what came before. Batches handled at once (two a recorder, and each replica's) fold
a host's attempts in the order they commit, which is stream order except where one
host's attempts sit in two of them, as when a backlog is caught up. A replay folds in
stream order, and may then differ from the live table by those attempts' order (a
risk level, a pause's end). Keeping each host's recent attempts, to fold them again
in their order when one arrives late, would cost every row a window of them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from trove_recorder.sql import Statement, Transaction
from trove_schema.events import CrawlCompleted
from trove_schema.heuristics import Audit
from trove_schema.policy import HostPolicy, LearningConfig, Observation, observe

_CREATE = Statement(
    "INSERT INTO host_policies (host) SELECT h FROM unnest(CAST(:hosts AS text[])) AS v(h) "
    "ORDER BY h ON CONFLICT DO NOTHING"
)
_LOCK = Statement(
    "SELECT host, policy, last_event_id FROM host_policies "
    "WHERE host = ANY(CAST(:hosts AS text[])) ORDER BY host FOR UPDATE"
)
_WRITE = Statement(
    "UPDATE host_policies p SET policy = CAST(v.policy AS jsonb), paused_until = v.paused, "
    "pause_reason = v.reason, risk_level = v.risk, attempt_count = v.attempts, "
    "last_attempt_at = v.last, last_event_id = v.event, updated_at = now() "
    "FROM unnest(CAST(:hosts AS text[]), CAST(:policies AS text[]), "
    "CAST(:paused AS timestamptz[]), CAST(:reasons AS text[]), CAST(:risks AS int[]), "
    "CAST(:attempts AS bigint[]), CAST(:lasts AS timestamptz[]), CAST(:events AS uuid[])) "
    "AS v(host, policy, paused, reason, risk, attempts, last, event) WHERE p.host = v.host"
)


async def fold_host_policies(
    tx: Transaction,
    completed: Sequence[CrawlCompleted],
    verdicts: Sequence[Audit],
    config: LearningConfig,
) -> None:
    """Fold the batch's new attempts (in stream order, with their audit verdicts) into
    their hosts' rows."""
    if not completed:
        return
    hosts = sorted({event.domain for event in completed})
    await tx.execute(_CREATE, {"hosts": hosts})
    current: dict[str, tuple[HostPolicy, str | None]] = {
        host: (HostPolicy.from_json(raw), str(last) if last is not None else None)
        for host, raw, last in await tx.fetch(_LOCK, {"hosts": hosts})
    }
    for event, verdict in zip(completed, verdicts, strict=True):
        policy, last = current[event.domain]
        if event.id == last:
            continue
        observation = Observation.of(event, verdict)
        current[event.domain] = (observe(policy, observation, config), event.id)
    rows = [(host, *current[host]) for host in hosts]
    await tx.execute(
        _WRITE,
        {
            "hosts": hosts,
            "policies": [json.dumps(policy.to_json()) for _, policy, _ in rows],
            "paused": [_time(policy.paused_until) for _, policy, _ in rows],
            "reasons": [policy.pause_reason for _, policy, _ in rows],
            "risks": [policy.risk_level for _, policy, _ in rows],
            "attempts": [policy.attempts for _, policy, _ in rows],
            "lasts": [_time(policy.last_attempt_at) for _, policy, _ in rows],
            "events": [_uuid(last) for _, _, last in rows],
        },
    )


def _time(at: float) -> datetime | None:
    return datetime.fromtimestamp(at, UTC) if at > 0 else None


def _uuid(value: str | None) -> Any:
    if value is None:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None
