"""The deployments' Postgres ends the sessions of a client that is gone, as the recorder
asks of its own, and the services that drain have as long to stop in Compose as in
Kubernetes."""

from __future__ import annotations

import pytest

from tests.deploy._support import find, of_kind, rendered
from tests.deploy.test_compose import seconds, services
from trove_recorder.database import IDLE_IN_TRANSACTION_TIMEOUT, SERVER_TCP

#: What every server of the deployments holds every session to, whoever its client is.
EXPECTED = {
    **SERVER_TCP,
    "idle_in_transaction_session_timeout": f"{IDLE_IN_TRANSACTION_TIMEOUT:.0f}s",
}


def test_composes_postgres_ends_the_sessions_of_a_client_that_is_gone() -> None:
    command = services()["postgres"]["command"]
    assert command[0] == "postgres"
    flags, pairs = command[1::2], command[2::2]
    assert set(flags) == {"-c"}
    assert len(flags) == len(pairs)
    given = dict(pair.split("=", 1) for pair in pairs)
    assert {name: given.get(name) for name in EXPECTED} == EXPECTED


@pytest.mark.parametrize("variant", ["local", "production"])
def test_the_clusters_postgres_ends_the_sessions_of_a_client_that_is_gone(variant: str) -> None:
    (cluster,) = of_kind(rendered(variant), "Cluster")
    parameters = cluster["spec"]["postgresql"]["parameters"]
    assert {name: parameters.get(name) for name in EXPECTED} == EXPECTED


@pytest.mark.parametrize("service", ["discovery", "recorder"])
def test_a_service_has_as_long_to_stop_in_compose_as_in_kubernetes(service: str) -> None:
    deployment = find(rendered("base"), "Deployment", f"trove-{service}")
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert seconds(services()[service].get("stop_grace_period", "10s")) == grace
