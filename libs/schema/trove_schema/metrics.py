"""Prometheus metrics of every service, served on ``/metrics`` beside the health probes.

One registry per process (the default one); names carry the ``trove_`` prefix and the
service is a label the scraper adds (pod labels), not part of the name.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

EVENTS_PUBLISHED = Counter(
    "trove_events_published_total", "Events published to JetStream (PubAck received)", ["type"]
)
MESSAGES_HANDLED = Counter(
    "trove_messages_total", "Messages a consumer finished with, by ending", ["consumer", "ending"]
)
#: Kept until an operator re-drives or drops them (`trove dead`): alert when above 0.
DEAD_LETTERS = Gauge(
    "trove_dead_letters",
    "Messages this consumer parked on TROVE_DEAD that wait for an operator",
    ["consumer"],
)

BROKER_CONNECTED = Gauge(
    "trove_broker_connected",
    "1 while this pod's connection to NATS is up; 0 while it is lost and being tried "
    "again (the service waits it out, ready: alert when it lasts)",
)

FETCHES = Counter("trove_fetches_total", "Fetch attempts by outcome", ["outcome"])
FETCH_SECONDS = Histogram(
    "trove_fetch_seconds",
    "Time from sending a request to the end of its body",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
FETCH_READ_LAG = Histogram(
    "trove_fetch_read_lag_seconds",
    "How long a response's last byte waited in the socket before this pod read it "
    "(the pod's own lag: an event loop with more work than it gets through)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
FETCH_BYTES = Counter("trove_fetch_bytes_total", "Body bytes read")
FETCHES_IN_FLIGHT = Gauge("trove_fetches_in_flight", "Requests in flight in this pod")
LEASES = Counter(
    "trove_leases_total", "Domain lease decisions", ["decision"]
)  # granted, waited (local), deferred (re-scheduled), moved (asked at the new origin)
ROBOTS_CACHE = Counter("trove_robots_cache_total", "robots.txt lookups", ["result"])
RESERVATION_HORIZON = Gauge(
    "trove_reservation_horizon_seconds",
    "How far ahead the furthest slot this pod planned for deferred work lies",
)
NAMESERVERS_AWAY = Gauge(
    "trove_nameservers_away",
    "1 while this pod's nameservers answer nothing, not even for the root zone: work "
    "that needs a name waits, and no host is blamed (the cluster's DNS, or the pod's network)",
)
EGRESS_AWAY = Gauge(
    "trove_egress_away",
    "1 while no connection of this pod succeeds and many addresses fail to connect: its "
    "work waits, and no host is blamed (a NAT gateway, a NetworkPolicy, the node's uplink), "
    "for the egress patience at most; past it the failures are the hosts' and the gauge "
    "stays 1 until a connection succeeds",
    ["family"],
)
CLOCK_OFFSET = Gauge(
    "trove_clock_offset_seconds",
    "nats-server's time less this pod's clock, as last estimated: the pod keeps "
    "politeness on nats-server's time (a value of a second or more: the node is not in time)",
)
STRATEGY_CHOICES = Counter(
    "trove_strategy_choices_total",
    "Fetch strategies chosen, by strategy and reason (only, prior, learned, explore); "
    'the exploration share is choices{reason="explore"} over all choices',
    ["strategy", "reason"],
)
STRATEGY_MISPREDICTIONS = Counter(
    "trove_strategy_mispredictions_total",
    "Attempts whose chosen strategy gave no usable content (wrong_tool, empty_content)",
    ["strategy"],
)
HOST_PAUSES = Counter(
    "trove_host_pauses_total",
    "Hosts paused for every pod by their learned policy, by reason",
    ["reason"],
)

DISCOVERED = Counter("trove_pages_discovered_total", "PageDiscovered published", ["via"])
SEEDS = Counter("trove_seeds_total", "Seeds by verdict", ["verdict"])
BUDGET_REFUSALS = Counter(
    "trove_budget_refusals_total", "New pages refused by a budget this cycle", ["budget"]
)  # host_pages (the host's page budget), site_hosts (its site's host budget)

PROJECTED = Counter("trove_events_projected_total", "Events applied to the tables")
PROJECTION_BATCH_SECONDS = Histogram(
    "trove_projection_batch_seconds",
    "Time to apply one batch in one transaction",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
)
WAITING_FOR_REPLAY = Gauge(
    "trove_recorder_waiting_for_replay",
    "1 while this recorder's batches wait for a whole replay: one rebuilding the tables, "
    "or one that stopped before its end (alert when it lasts: `trove status` names the "
    "replay that finishes it)",
)
PROJECTION_LAG_SECONDS = Gauge(
    "trove_projection_lag_seconds",
    "Seconds since the stream stored the newest message applied, when it was applied",
)


def exposition() -> tuple[bytes, str]:
    """The metrics page and its content type."""
    return generate_latest(), CONTENT_TYPE_LATEST
