"""compose.yaml: the Compose Specification, dependencies, health, NATS, settings."""

from __future__ import annotations

import copy
import os
import re
from typing import Any
from urllib.parse import urlsplit

import pytest
from sqlalchemy.engine import make_url

from tests.deploy._kustomize import containers
from tests.deploy._support import (
    REPO,
    compose,
    compose_validator,
    entry_points,
    find,
    nats_users,
    quantity,
    rendered,
    schema_errors,
)
from trove_cli.main import parser as cli_parser
from trove_schema.settings import (
    CommonSettings,
    DiscoverySettings,
    FetcherSettings,
    RecorderSettings,
    check_environment,
    known_keys,
)

TROVE_SERVICES = ("discovery", "recorder", "fetcher")
SETTINGS: dict[str, type[CommonSettings]] = {
    "discovery": DiscoverySettings,
    "recorder": RecorderSettings,
    "fetcher": FetcherSettings,
    "migrate": CommonSettings,
    "cli": CommonSettings,
}
#: The NATS user each client of compose.yaml logs in as.
NATS_USER = {
    "discovery": "discovery",
    "fetcher": "fetcher",
    "recorder": "recorder",
    "cli": "operator",
    "nats-box": "box",
}
#: What docker-compose 1.29 and podman-compose read at the top level.
PORTABLE_TOP_LEVEL = {"services", "volumes", "networks"}


def services() -> dict[str, Any]:
    found: dict[str, Any] = compose()["services"]
    return found


def built_services() -> dict[str, Any]:
    """The services that run the Trove image."""
    return {name: s for name, s in services().items() if s.get("image") == "trove:local"}


def mounts(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """target -> (source, mode) of a service's short-syntax volumes."""
    found = {}
    for volume in service.get("volumes", []):
        source, target, *mode = volume.split(":")
        found[target] = (source, mode[0] if mode else "rw")
    return found


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration)
    assert "".join(a + b for a, b in parts) == duration, duration
    return sum(float(a) * units[b] for a, b in parts)


def nats_config() -> str:
    """The configuration file NATS is started with, read from the mounted folder."""
    command: list[str] = services()["nats"]["command"]
    assert command[0] == "--config"
    for target, (source, _) in mounts(services()["nats"]).items():
        if command[1].startswith(target + "/"):
            return (REPO / source / command[1].removeprefix(target + "/")).read_text("utf-8")
    raise AssertionError(f"{command[1]} is not in a mounted folder")


def test_compose_file_matches_the_compose_specification() -> None:
    assert schema_errors(compose_validator(), compose()) == []


def test_the_compose_schema_refuses_a_misspelt_key() -> None:
    broken = copy.deepcopy(compose())
    broken["services"]["fetcher"]["healthcheck"]["intervall"] = "5s"
    assert schema_errors(compose_validator(), broken) != []


def test_compose_file_keeps_to_what_older_compose_implementations_read() -> None:
    document = compose()
    top = {key for key in document if not key.startswith("x-")}
    assert top <= PORTABLE_TOP_LEVEL, sorted(top - PORTABLE_TOP_LEVEL)
    for name, service in services().items():
        assert "configs" not in service, name
        assert "secrets" not in service, name
        for volume in service.get("volumes", []):
            assert isinstance(volume, str), f"{name}: short volume syntax only"


def test_trove_services_share_one_image_built_from_the_dockerfile() -> None:
    built = built_services()
    assert set(built) == {*TROVE_SERVICES, "migrate", "cli"}
    assert {s["image"] for s in built.values()} == {"trove:local"}
    for service in built.values():
        assert service["build"]["context"] == "."
        assert (REPO / service["build"].get("dockerfile", "Dockerfile")).is_file()


def test_every_trove_command_is_an_entry_point() -> None:
    for name, service in built_services().items():
        command = service["command"]
        assert command[0] in entry_points(), name
        if command[0] == "trove":
            cli_parser().parse_args(command[1:])
    for name in TROVE_SERVICES:
        assert services()[name]["command"] == [f"trove-{name}"]


def test_services_wait_for_healthy_nats_and_the_finished_migration() -> None:
    for name in TROVE_SERVICES:
        depends = services()[name]["depends_on"]
        assert depends["nats"]["condition"] == "service_healthy", name
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
    assert services()["recorder"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_migration_runs_once_after_postgres_is_healthy() -> None:
    migrate = services()["migrate"]
    assert migrate["command"] == ["trove", "migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_every_long_running_service_has_a_healthcheck() -> None:
    for name, service in services().items():
        if service.get("restart") == "no" or service.get("profiles"):
            continue
        check = service["healthcheck"]
        assert not check.get("disable", False), name
        assert check["test"][0] in {"CMD", "CMD-SHELL"}, name
    for name in TROVE_SERVICES:
        test = " ".join(services()[name]["healthcheck"]["test"])
        assert "/healthz" in test, name
        assert "urllib.request" in test, name


def test_trove_containers_are_read_only_and_unprivileged() -> None:
    for name, service in built_services().items():
        assert service["read_only"] is True, name
        assert "/tmp" in service["tmpfs"], name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name


def test_fetchers_run_three_replicas_and_finish_their_work_on_stop() -> None:
    fetcher = services()["fetcher"]
    assert fetcher["deploy"]["replicas"] == 3
    assert "ports" not in fetcher  # replicas could not share a published port
    timeout = float(
        fetcher["environment"].get("TROVE_REQUEST_TIMEOUT")
        or FetcherSettings.model_fields["request_timeout"].default
    )
    ack_wait = float(
        fetcher["environment"].get("TROVE_ACK_WAIT_SECONDS")
        or FetcherSettings.model_fields["ack_wait_seconds"].default
    )
    # The request, then releasing, publishing and the ack, each patient for half of
    # ack_wait while the broker is away.
    assert seconds(fetcher["stop_grace_period"]) >= timeout + 3 * ack_wait / 2


def test_nats_runs_jetstream_with_synced_writes_on_a_volume() -> None:
    nats = services()["nats"]
    image, _, tag = nats["image"].partition(":")
    assert image == "nats"
    major, minor = (int(x) for x in tag.split("-")[0].split(".")[:2])
    assert (major, minor) >= (2, 12), "message schedules need nats-server 2.12"
    config = nats_config()
    assert re.search(r"^\s*sync_interval:\s*always\s*$", config, re.M)
    assert any(mode == "ro" for _, mode in mounts(nats).values()), "configuration read-only"
    store = re.search(r"^\s*store_dir:\s*(\S+)\s*$", config, re.M)
    assert store is not None
    volumes = {t: s for t, (s, _) in mounts(nats).items() if not s.startswith(".")}
    assert any(store.group(1).startswith(mount) for mount in volumes)
    assert set(volumes.values()) <= set(compose()["volumes"]), "named volumes only"
    assert re.search(r"^\s*http_port:\s*8222\s*$", config, re.M)
    assert "8222/healthz" in " ".join(nats["healthcheck"]["test"])


def test_postgres_is_16_on_a_volume_with_a_readiness_check() -> None:
    postgres = services()["postgres"]
    assert postgres["image"] == "postgres:16-alpine"
    assert any(v.startswith("postgres-data:") for v in postgres["volumes"])
    check = " ".join(postgres["healthcheck"]["test"])
    assert "pg_isready" in check
    # Over TCP: the first start's initialisation server listens on the socket alone.
    assert "-h 127.0.0.1" in check


def test_only_the_recorder_the_migration_and_the_cli_see_the_database() -> None:
    readers = {n for n, s in services().items() if "TROVE_DATABASE_URL" in s.get("environment", {})}
    assert readers == {"recorder", "migrate", "cli"}


def test_database_url_matches_the_postgres_service() -> None:
    postgres = services()["postgres"]["environment"]
    for name, service in built_services().items():
        if "TROVE_DATABASE_URL" not in service["environment"]:
            continue
        url = make_url(service["environment"]["TROVE_DATABASE_URL"])
        assert url.drivername == "postgresql+asyncpg", name
        assert (url.host, url.port) == ("postgres", 5432)
        assert (url.username, url.password, url.database) == (
            postgres["POSTGRES_USER"],
            postgres["POSTGRES_PASSWORD"],
            postgres["POSTGRES_DB"],
        )


def interpolated(value: str) -> str:
    """The variable a ``${NAME:?message}`` value reads."""
    match = re.fullmatch(r"\$\{(\w+)(?::\?[^}]*)?\}", value)
    assert match, value
    return match.group(1)


def test_each_client_logs_in_to_nats_as_its_own_user_over_tls() -> None:
    users = nats_users()
    nats_env = services()["nats"]["environment"]
    for name, user in NATS_USER.items():
        env = services()[name]["environment"]
        # ${NAME:?message} read as NAME, so that the URL parses.
        raw = env.get("TROVE_NATS_URL") or env["NATS_URL"]
        url = urlsplit(re.sub(r"\$\{(\w+)(?::\?[^}]*)?\}", r"\1", raw))
        assert (url.scheme, url.hostname, url.port) == ("tls", "nats", 4222), name
        assert url.username == user, name
        assert url.password is not None
        assert "${" + url.password in raw, "the password comes from the environment"
        # The password the server checks is the one the client is given.
        variable = url.password
        assert users[user]["password"] == "$" + variable, name
        assert interpolated(nats_env[variable]) == variable
    clients = {n for n, s in services().items() if "nats" in s.get("depends_on", {})}
    assert clients == set(NATS_USER)
    assert "TROVE_NATS_URL" not in services()["migrate"]["environment"]


def test_clients_trust_the_ca_made_at_first_start_and_only_nats_reads_its_key() -> None:
    certs = services()["nats-certs"]
    assert certs["restart"] == "no"
    volumes = {t: s for t, (s, _) in mounts(certs).items()}
    assert services()["nats"]["depends_on"]["nats-certs"]["condition"] == (
        "service_completed_successfully"
    )
    script = (REPO / "deploy" / "nats" / "make-certs.sh").read_text("utf-8")
    assert "DNS:nats" in script
    config = nats_config()
    tls = re.search(r"^tls \{(.*?)^\}", config, re.M | re.S)
    assert tls is not None, "NATS clients must use TLS"
    files = dict(re.findall(r"^\s*(cert_file|key_file):\s*(\S+)\s*$", tls.group(1), re.M))
    nats_mounts = mounts(services()["nats"])
    for path in files.values():
        folder = path.rsplit("/", 1)[0]
        assert nats_mounts[folder] == (volumes["/tls"], "ro"), path
    for name, service in services().items():
        if name in {"nats", "nats-certs"}:
            continue
        assert volumes["/tls"] not in {s for s, _ in mounts(service).values()}, name
    for name in NATS_USER:
        service = services()[name]
        env = service["environment"]
        ca = env.get("TROVE_NATS_TLS_CA") or env["NATS_CA"]
        folder = ca.rsplit("/", 1)[0]
        assert mounts(service)[folder] == (volumes["/ca"], "ro"), name


def test_every_trove_variable_in_compose_is_a_known_setting() -> None:
    names = {key for s in services().values() for key in s.get("environment", {})}
    trove_names = {n for n in names if n.startswith("TROVE_")}
    assert trove_names <= known_keys(), sorted(trove_names - known_keys())


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_each_service_loads_its_settings_from_compose(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {k: str(v) for k, v in services()[name]["environment"].items()}
    for key in [k for k in os.environ if k.startswith("TROVE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    check_environment(env)
    settings = SETTINGS[name]()
    assert settings.http_port == 8080
    assert settings.log_format == "json"


def test_nats_box_can_seed_the_crawl() -> None:
    box = services()["nats-box"]
    assert box["image"].split(":")[0] == "natsio/nats-box"
    assert box["profiles"] == ["tools"]  # run on demand, not by `up`
    assert "trove.seeds" in nats_users()["box"]["permissions"]["publish"]["allow"]
    assert services()["cli"]["profiles"] == ["tools"]
    ports = services()["nats"]["ports"]
    assert any(p.endswith(":4222:4222") for p in ports), "the host's nats CLI needs 4222"


@pytest.mark.parametrize("service", TROVE_SERVICES)
def test_each_service_runs_with_the_limits_it_has_in_kubernetes(service: str) -> None:
    # docs/deploy.md promises the laptop's Compose run the pods' limits: a fetcher that
    # fits in Kubernetes is not killed for its memory on the laptop.
    limits = compose()["services"][service]["deploy"]["resources"]["limits"]
    (container,) = containers(find(rendered("base"), "Deployment", f"trove-{service}"))
    pods = container["resources"]["limits"]
    # Docker reads a memory size's letters as binary units: 768M is 768 MiB.
    memory = re.fullmatch(r"([0-9]+)([KMG])", limits["memory"])
    assert memory is not None, limits["memory"]
    size = int(memory.group(1)) * 2 ** {"K": 10, "M": 20, "G": 30}[memory.group(2)]
    assert size == quantity(pods["memory"])
    assert float(limits["cpus"]) == quantity(pods["cpu"])


def test_every_trove_containers_log_is_rotated() -> None:
    # A line a fetch, kept for ever by Docker's default json-file driver, fills the
    # engine's disk in weeks.
    trove = built_services()
    assert {"discovery", "fetcher", "recorder"} <= set(trove)
    for name, service in trove.items():
        options = service.get("logging", {}).get("options", {})
        assert options.get("max-size"), name
        assert options.get("max-file"), name
