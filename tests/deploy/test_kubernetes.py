"""The Kubernetes manifests: schemas, security, probes, scaling, network, settings."""

from __future__ import annotations

import copy
import ipaddress
import os
import re
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from sqlalchemy.engine import make_url

from tests.deploy._kustomize import Manifest, containers, load_documents, pod_specs
from tests.deploy._support import (
    K8S,
    VARIANTS,
    all_containers,
    container_environment,
    dockerfile,
    entry_points,
    find,
    kubernetes_validator,
    kubernetes_versions,
    nats_users,
    of_kind,
    quantity,
    rendered,
    schema_errors,
    settings_map,
    workloads,
)
from trove_cli.main import parser as cli_parser
from trove_fetcher.app import prefetch
from trove_schema.addresses import METADATA_ADDRESSES
from trove_schema.settings import (
    CommonSettings,
    DiscoverySettings,
    FetcherSettings,
    RecorderSettings,
    check_environment,
    known_keys,
)
from trove_schema.topology import FETCHER, FETCHER_DEFERRED, declare

#: Kinds that are not built into Kubernetes, and the structural check each gets instead.
CUSTOM_KINDS = {("keda.sh/v1alpha1", "ScaledObject"), ("postgresql.cnpg.io/v1", "Cluster")}
SETTINGS_BY_COMMAND: dict[str, type[CommonSettings]] = {
    "trove-discovery": DiscoverySettings,
    "trove-fetcher": FetcherSettings,
    "trove-recorder": RecorderSettings,
    "trove": CommonSettings,
}
SERVICE_USER = 10001
PRIVATE_V4 = [
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "127.0.0.0/8",
]
PRIVATE_V6 = ["fc00::/7", "fe80::/10", "::1/128"]
KEDA_NATS_JETSTREAM_KEYS = {
    "natsServerMonitoringEndpoint",
    "account",
    "stream",
    "consumer",
    "lagThreshold",
    "activationLagThreshold",
    "useHttps",
}
CNPG_CLUSTER_SPEC_FIELDS = {
    "instances",
    "imageName",
    "imageCatalogRef",
    "primaryUpdateStrategy",
    "primaryUpdateMethod",
    "bootstrap",
    "storage",
    "walStorage",
    "postgresql",
    "resources",
    "affinity",
    "monitoring",
    "backup",
    "description",
    "enableSuperuserAccess",
    "superuserSecret",
    "managed",
    "topologySpreadConstraints",
    "priorityClassName",
}

VARIANT_NAMES = sorted(VARIANTS)


def deployments(variant: str) -> list[Manifest]:
    return of_kind(rendered(variant), "Deployment")


def component(manifest: Manifest) -> str:
    label: str = manifest["metadata"]["labels"]["app.kubernetes.io/component"]
    return label


# ------------------------------------------------------------------------ schemas


@pytest.mark.parametrize("version", kubernetes_versions())
@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_rendered_manifests_match_the_strict_kubernetes_schemas(variant: str, version: str) -> None:
    problems = []
    for manifest in rendered(variant):
        if (manifest["apiVersion"], manifest["kind"]) in CUSTOM_KINDS:
            continue
        validator = kubernetes_validator(version, manifest["apiVersion"], manifest["kind"])
        for error in schema_errors(validator, manifest):
            problems.append(f"{manifest['kind']}/{manifest['metadata']['name']}: {error}")
    assert problems == []


def test_every_manifest_file_is_valid_yaml_of_a_known_kind() -> None:
    files = sorted(K8S.rglob("*.yaml"))
    assert files
    latest = kubernetes_versions()[1]
    for path in files:
        if path.name == "kustomization.yaml" or path.parent.name == "nats":
            # Helm values, and cert-manager's kinds (applied to the nats namespace).
            assert list(yaml.safe_load_all(path.read_text("utf-8"))), path
            continue
        for manifest in load_documents(path):
            key = (manifest["apiVersion"], manifest["kind"])
            if key not in CUSTOM_KINDS:
                validator = kubernetes_validator(latest, *key)
                assert schema_errors(validator, manifest) == [], path


def test_the_strict_schema_refuses_an_unknown_field() -> None:
    deployment = copy.deepcopy(find(rendered("base"), "Deployment", "trove-fetcher"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    validator = kubernetes_validator(kubernetes_versions()[1], "apps/v1", "Deployment")
    assert any("livenessProbes" in e for e in schema_errors(validator, deployment))


# ---------------------------------------------------------------------- workloads


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_every_deployment_has_probes_on_the_health_port(variant: str) -> None:
    for deployment in deployments(variant):
        for container in containers(deployment):
            env = container_environment(rendered(variant), container)
            port = int(env.get("TROVE_HTTP_PORT") or 0)
            assert port == 8080, deployment["metadata"]["name"]
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            probes = {
                kind: container[kind]
                for kind in ("startupProbe", "livenessProbe", "readinessProbe")
            }
            assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert probes["startupProbe"]["httpGet"]["path"] == "/healthz"
            for probe in probes.values():
                assert ports[probe["httpGet"]["port"]] == port


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_every_container_has_requests_within_limits(variant: str) -> None:
    for manifest, container in all_containers(rendered(variant)):
        resources = container["resources"]
        for name in ("cpu", "memory"):
            request = quantity(resources["requests"][name])
            limit = quantity(resources["limits"][name])
            assert 0 < request <= limit, (manifest["metadata"]["name"], name)


def test_fetcher_resources_fit_its_measured_footprint() -> None:
    fetcher = find(rendered("base"), "Deployment", "trove-fetcher")
    (container,) = containers(fetcher)
    # Measured RSS stays under 150 MiB: the request covers it, the limit leaves headroom.
    assert quantity(container["resources"]["requests"]["memory"]) >= 150 * 2**20
    assert quantity(container["resources"]["limits"]["memory"]) >= 2 * 150 * 2**20


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_every_pod_runs_non_root_read_only_without_privileges(variant: str) -> None:
    for workload in workloads(rendered(variant)):
        name = workload["metadata"]["name"]
        for spec in pod_specs(workload):
            pod = spec["securityContext"]
            assert pod["runAsNonRoot"] is True, name
            assert pod["runAsUser"] == SERVICE_USER, name
            assert pod["seccompProfile"]["type"] == "RuntimeDefault", name
            tmp_volumes = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
            for container in spec["containers"]:
                ctx = container["securityContext"]
                assert ctx["readOnlyRootFilesystem"] is True, name
                assert ctx["allowPrivilegeEscalation"] is False, name
                assert ctx["capabilities"]["drop"] == ["ALL"], name
                assert "add" not in ctx["capabilities"], name
                assert ctx.get("runAsUser", pod["runAsUser"]) == SERVICE_USER, name
                assert ctx.get("privileged", False) is False, name
                mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
                assert mounts.get("/tmp") in tmp_volumes, f"{name}: /tmp must be an emptyDir"


def test_manifests_run_as_the_image_user() -> None:
    (user,) = [i.value for i in dockerfile() if i.keyword == "USER"]
    assert user.split(":")[0] == str(SERVICE_USER)


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_pods_get_no_service_account_token_and_no_service_links(variant: str) -> None:
    manifests = rendered(variant)
    for workload in workloads(manifests):
        for spec in pod_specs(workload):
            assert spec["automountServiceAccountToken"] is False
            # Service links inject <SERVICE>_* variables; trove-* Services would yield
            # TROVE_* names that every service refuses at start.
            assert spec["enableServiceLinks"] is False
            account = find(manifests, "ServiceAccount", spec["serviceAccountName"])
            assert account["automountServiceAccountToken"] is False


def test_deployments_spread_over_nodes_and_zones() -> None:
    for deployment in deployments("base"):
        spec = deployment["spec"]["template"]["spec"]
        by_key = {c["topologyKey"]: c for c in spec["topologySpreadConstraints"]}
        # The fetchers' scale-out is not held pending by one full node.
        fetcher = deployment["metadata"]["name"] == "trove-fetcher"
        strict = "ScheduleAnyway" if fetcher else "DoNotSchedule"
        assert by_key["kubernetes.io/hostname"]["whenUnsatisfiable"] == strict
        assert by_key["topology.kubernetes.io/zone"]["whenUnsatisfiable"] == "ScheduleAnyway"
        for constraint in by_key.values():
            assert (
                constraint["labelSelector"]["matchLabels"]
                == deployment["spec"]["selector"]["matchLabels"]
            )


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_selectors_match_their_pods(variant: str) -> None:
    manifests = rendered(variant)
    pods = {
        component(d): d["spec"]["template"]["metadata"]["labels"]
        for d in of_kind(manifests, "Deployment")
    }
    for deployment in of_kind(manifests, "Deployment"):
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    for budget in of_kind(manifests, "PodDisruptionBudget"):
        selector = budget["spec"]["selector"]["matchLabels"]
        assert [c for c, labels in pods.items() if selector.items() <= labels.items()] == [
            component(budget)
        ]
    assert {component(b) for b in of_kind(manifests, "PodDisruptionBudget")} == set(pods)


def test_pods_are_scraped_by_prometheus_on_the_health_port() -> None:
    for deployment in deployments("base"):
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == "8080"
        assert annotations["prometheus.io/path"] == "/metrics"


def test_replica_counts_and_grace_periods() -> None:
    manifests = rendered("base")
    discovery = find(manifests, "Deployment", "trove-discovery")
    recorder = find(manifests, "Deployment", "trove-recorder")
    fetcher = find(manifests, "Deployment", "trove-fetcher")
    assert discovery["spec"]["replicas"] == 2
    assert recorder["spec"]["replicas"] == 2
    # KEDA's HPA owns the fetcher count; a replicas field would fight it on every apply.
    assert "replicas" not in fetcher["spec"]
    assert fetcher["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 180


def test_fetcher_grace_period_outlasts_a_request() -> None:
    manifests = rendered("base")
    fetcher = find(manifests, "Deployment", "trove-fetcher")
    (container,) = containers(fetcher)
    timeout = float(
        container_environment(manifests, container).get("TROVE_REQUEST_TIMEOUT")
        or FetcherSettings.model_fields["request_timeout"].default
    )
    ack_wait = float(
        container_environment(manifests, container).get("TROVE_ACK_WAIT_SECONDS")
        or FetcherSettings.model_fields["ack_wait_seconds"].default
    )
    grace = fetcher["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # The request, then releasing, publishing and the ack, each patient for half of
    # ack_wait while the broker is away.
    assert grace >= timeout + 3 * ack_wait / 2


def test_fetcher_disruption_budget_keeps_most_fetchers() -> None:
    budget = find(rendered("base"), "PodDisruptionBudget", "trove-fetcher")
    spec = budget["spec"]
    assert spec.get("maxUnavailable") == "25%" or spec.get("minAvailable") == 1


# ------------------------------------------------------------------------ commands


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_every_container_runs_an_existing_entry_point(variant: str) -> None:
    for manifest, container in all_containers(rendered(variant)):
        command = container["command"] + container.get("args", [])
        assert command[0] in entry_points(), manifest["metadata"]["name"]
        if command[0] == "trove":
            cli_parser().parse_args(command[1:])  # exits (fails) on an unknown subcommand


def test_each_service_runs_where_its_name_says() -> None:
    for deployment in deployments("base"):
        (container,) = containers(deployment)
        assert container["command"] == [f"trove-{component(deployment)}"]


def test_migration_job_runs_trove_migrate_and_cleans_up() -> None:
    job = find(rendered("base"), "Job", "trove-migrate")
    (container,) = containers(job)
    assert container["command"] == ["trove", "migrate"]
    assert job["spec"]["backoffLimit"] >= 1
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    assert job["spec"]["template"]["spec"]["restartPolicy"] in {"Never", "OnFailure"}


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_every_workload_runs_the_same_trove_image(variant: str) -> None:
    images = {c["image"] for _, c in all_containers(rendered(variant))}
    assert len(images) == 1, images
    (image,) = images
    assert ":" in image.rsplit("/", 1)[-1]
    assert not image.endswith(":latest")


def test_local_overlay_uses_the_locally_built_image_and_one_of_each() -> None:
    manifests = rendered("local")
    assert {c["image"] for _, c in all_containers(manifests)} == {"trove:local"}
    assert find(manifests, "Deployment", "trove-discovery")["spec"]["replicas"] == 1
    assert find(manifests, "Deployment", "trove-recorder")["spec"]["replicas"] == 1
    assert find(manifests, "ScaledObject", "trove-fetcher")["spec"]["minReplicaCount"] == 1
    assert settings_map(manifests)["data"]["TROVE_REPLICAS"] == "1"
    assert find(manifests, "Cluster", "trove-pg")["spec"]["instances"] == 1


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_everything_lives_in_the_trove_namespace(variant: str) -> None:
    for manifest in rendered(variant):
        if manifest["kind"] == "Namespace":
            assert manifest["metadata"]["name"] == "trove"
        else:
            assert manifest["metadata"]["namespace"] == "trove", manifest["metadata"]["name"]


# ------------------------------------------------------------------------ settings


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_every_trove_variable_in_the_manifests_is_a_known_setting(variant: str) -> None:
    manifests = rendered(variant)
    names = {key for cm in of_kind(manifests, "ConfigMap") for key in cm.get("data", {})} | {
        name for _, c in all_containers(manifests) for name in container_environment(manifests, c)
    }
    trove_names = {n for n in names if n.startswith("TROVE_")}
    assert trove_names, "no settings found"
    assert trove_names <= known_keys(), sorted(trove_names - known_keys())


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_each_service_loads_its_settings_from_the_manifests(
    variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = rendered(variant)
    for manifest, container in all_containers(manifests):
        env = {
            name: value if value is not None else "postgresql+asyncpg://u:p@db:5432/trove"
            for name, value in container_environment(manifests, container).items()
        }
        for name in [n for n in os.environ if n.startswith("TROVE_")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        check_environment(env)
        settings = SETTINGS_BY_COMMAND[container["command"][0]]()
        assert settings.http_port == 8080, manifest["metadata"]["name"]
        if component(manifest) != "migrate":
            assert settings.nats_url.startswith("tls://")
            assert str(settings.nats_tls_ca).endswith("/ca.crt")


def test_base_streams_get_three_replicas_on_a_three_node_nats() -> None:
    config = settings_map(rendered("base"))["data"]
    assert config["TROVE_REPLICAS"] == "3"
    values = yaml.safe_load((K8S / "nats" / "values.yaml").read_text("utf-8"))
    assert values["config"]["cluster"]["enabled"] is True
    assert values["config"]["cluster"]["replicas"] >= int(config["TROVE_REPLICAS"])


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_each_service_reaches_nats_through_the_chart_service_as_its_own_user(
    variant: str,
) -> None:
    for manifest in deployments(variant):
        (container,) = containers(manifest)
        env = {v["name"]: v for v in container["env"]}
        names = [v["name"] for v in container["env"]]
        url = urlsplit(env["TROVE_NATS_URL"]["value"])
        assert (url.scheme, url.hostname, url.port) == ("tls", "nats.nats.svc.cluster.local", 4222)
        assert url.username == component(manifest)
        # Kubernetes splices $(NATS_PASSWORD) in only if it is defined before the URL.
        assert url.password == "$(NATS_PASSWORD)"
        assert names.index("NATS_PASSWORD") < names.index("TROVE_NATS_URL")
        ref = env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("trove-nats", component(manifest))
        assert component(manifest) in nats_users()


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_trove_pods_trust_the_ca_of_the_nats_certificate(variant: str) -> None:
    manifests = rendered(variant)
    for manifest in deployments(variant):
        (container,) = containers(manifest)
        ca = container_environment(manifests, container)["TROVE_NATS_TLS_CA"]
        assert ca is not None
        folder, _, name = ca.rpartition("/")
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
        assert mount["readOnly"] is True
        spec = manifest["spec"]["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == "trove-nats-ca"
        assert volume["secret"]["items"] == [{"key": "ca.crt", "path": name}]


def test_nats_serves_tls_with_the_cert_manager_certificate() -> None:
    values = yaml.safe_load((K8S / "nats" / "values.yaml").read_text("utf-8"))
    tls = values["config"]["nats"]["tls"]
    assert tls["enabled"] is True
    documents = load_documents(K8S / "nats" / "tls.yaml")
    (server,) = [
        d for d in documents if d["kind"] == "Certificate" and not d["spec"].get("isCA", False)
    ]
    assert server["spec"]["secretName"] == tls["secretName"]
    assert server["metadata"]["namespace"] == "nats"
    assert "nats.nats.svc.cluster.local" in server["spec"]["dnsNames"]
    issuers = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Issuer"}
    issuer = issuers[server["spec"]["issuerRef"]["name"]]
    (ca,) = [d for d in documents if d["kind"] == "Certificate" and d["spec"].get("isCA")]
    assert issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    # nats-box trusts the same certificate's CA, and mounts nothing else of it.
    box = values["natsBox"]
    (volume,) = [p["value"] for p in box["podTemplate"]["patch"]]
    assert volume["secret"] == {
        "secretName": tls["secretName"],
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }


def test_nats_users_in_the_helm_values_are_those_of_compose() -> None:
    values = yaml.safe_load((K8S / "nats" / "values.yaml").read_text("utf-8"))
    helm = {u["user"]: u for u in values["config"]["merge"]["authorization"]["users"]}
    compose = nats_users()
    assert set(helm) == set(compose)
    env = values["container"]["env"]
    example, trove = load_documents(K8S / "nats" / "users-secret.example.yaml")
    # The Secret the Deployments read holds the services' passwords, and only those.
    assert set(trove["stringData"]) == {component(d) for d in deployments("base")}
    for name, user in helm.items():
        assert user["permissions"] == compose[name]["permissions"], name
        # "<< $VAR >>" is written unquoted: the server reads the variable.
        variable = compose[name]["password"].removeprefix("$")
        assert user["password"] == f"<< ${variable} >>"
        ref = env[variable]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("nats-users", name)
        assert name in example["stringData"]


# ------------------------------------------------------------------------ database


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_only_the_recorder_and_the_migration_see_the_database(variant: str) -> None:
    readers = set()
    for manifest, container in all_containers(rendered(variant)):
        for variable in container.get("env", []):
            ref = variable.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None and variable["name"] == "NATS_PASSWORD":
                assert ref["name"] == "trove-nats"
            elif ref is not None:
                assert variable["name"] == "TROVE_DATABASE_URL"
                assert (ref["name"], ref["key"]) == ("trove-database", "url")
                readers.add(component(manifest))
    assert readers == {"recorder", "migrate"}


def secret_data(secret: Manifest) -> dict[str, str]:
    data: dict[str, str] = secret.get("stringData", {})
    return data


def test_database_secret_templates_use_the_asyncpg_driver() -> None:
    template = tuple(load_documents(K8S / "postgres" / "database-secrets.example.yaml"))
    for secret in (
        find(template, "Secret", "trove-database"),
        find(rendered("local"), "Secret", "trove-database"),
    ):
        url = make_url(secret_data(secret)["url"])
        assert url.drivername == "postgresql+asyncpg"
        assert url.database == "trove"


def test_local_database_url_matches_the_cnpg_cluster_it_creates() -> None:
    manifests = rendered("local")
    cluster = find(manifests, "Cluster", "trove-pg")
    initdb = cluster["spec"]["bootstrap"]["initdb"]
    owner = secret_data(find(manifests, "Secret", initdb["secret"]["name"]))
    assert find(manifests, "Secret", initdb["secret"]["name"])["type"] == (
        "kubernetes.io/basic-auth"
    )
    url = make_url(secret_data(find(manifests, "Secret", "trove-database"))["url"])
    assert url.host == f"{cluster['metadata']['name']}-rw.trove.svc.cluster.local"
    assert url.username == owner["username"] == initdb["owner"]
    assert url.password == owner["password"]
    assert url.database == initdb["database"]


@pytest.mark.parametrize("variant", ["local", "production"])
def test_cnpg_cluster_is_well_formed(variant: str) -> None:
    (cluster,) = of_kind(rendered(variant), "Cluster")
    assert cluster["apiVersion"] == "postgresql.cnpg.io/v1"
    spec = cluster["spec"]
    assert set(spec) <= CNPG_CLUSTER_SPEC_FIELDS, sorted(set(spec) - CNPG_CLUSTER_SPEC_FIELDS)
    assert isinstance(spec["instances"], int)
    assert spec["instances"] >= 1
    assert quantity(spec["storage"]["size"]) >= 2**30
    initdb = spec["bootstrap"]["initdb"]
    assert initdb["database"] == "trove"
    assert initdb["owner"] == "trove"
    assert initdb["secret"]["name"] == "trove-pg-app"
    assert all(isinstance(v, str) for v in spec["postgresql"]["parameters"].values())
    assert spec["imageName"].startswith("ghcr.io/cloudnative-pg/postgresql:16")


def test_a_replicated_database_commits_on_a_standby_and_a_lone_one_waits_for_none() -> None:
    """A failover must not promote a standby without the recorder's last batches (their
    events were acknowledged), and a lone instance has no standby to wait for."""
    (production,) = of_kind(rendered("production"), "Cluster")
    assert production["spec"]["instances"] >= 2
    synchronous = production["spec"]["postgresql"]["synchronous"]
    assert synchronous["method"] in {"any", "first"}
    assert 1 <= synchronous["number"] < production["spec"]["instances"]
    assert synchronous["dataDurability"] == "preferred"  # no standby up: go on, do not hang
    (local,) = of_kind(rendered("local"), "Cluster")
    assert local["spec"]["instances"] == 1
    assert "synchronous" not in local["spec"]["postgresql"]


# ---------------------------------------------------------------------------- KEDA


def scaled_object(variant: str) -> Manifest:
    (found,) = of_kind(rendered(variant), "ScaledObject")
    return found


def test_keda_scales_the_fetcher_on_the_backlog_of_both_its_consumers() -> None:
    # New pages, and work whose host's slot has come: due work no pod has started asks
    # for pods as much as new work does.
    spec = scaled_object("base")["spec"]
    watched = set()
    for trigger in spec["triggers"]:
        assert trigger["type"] == "nats-jetstream"
        metadata = trigger["metadata"]
        assert metadata["account"] == "$G"
        assert metadata["useHttps"] == "false"
        # Each consumer is the one the topology declares on that stream.
        assert declare().consumer(metadata["consumer"])[0] == metadata["stream"]
        watched.add(metadata["consumer"])
    assert watched == {FETCHER, FETCHER_DEFERRED}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 20)


def test_keda_sizes_count_what_each_fetcher_pod_holds() -> None:
    """KEDA's lag is the consumer's pending plus its unacked messages, and a pod holds
    more than its handlers run (``prefetch``): the threshold and the consumer's cap are
    sized on what a pod pulls, from the settings the manifests give it."""
    spec = scaled_object("base")["spec"]
    threshold = min(int(t["metadata"]["lagThreshold"]) for t in spec["triggers"])
    config = settings_map(rendered("base"))["data"]
    settings = FetcherSettings.model_validate(
        {
            "concurrency": int(config.get("TROVE_CONCURRENCY", FetcherSettings().concurrency)),
            "max_ack_pending": int(config["TROVE_MAX_ACK_PENDING"]),
        }
    )
    hand = settings.concurrency + prefetch(settings.concurrency, settings.max_ack_pending)
    # One pod's full hand alone does not ask for a second pod.
    assert threshold >= hand, (threshold, hand)
    # At the most pods, every one can run all its handlers.
    assert settings.max_ack_pending >= spec["maxReplicaCount"] * settings.concurrency


def test_keda_asks_the_nats_headless_service_for_the_monitoring_port() -> None:
    endpoint = scaled_object("base")["spec"]["triggers"][0]["metadata"][
        "natsServerMonitoringEndpoint"
    ]
    host, _, port = endpoint.rpartition(":")
    assert host == "nats-headless.nats.svc.cluster.local"
    values = yaml.safe_load((K8S / "nats" / "values.yaml").read_text("utf-8"))
    assert values["config"]["monitor"]["enabled"] is True
    assert int(port) == values["config"]["monitor"]["port"] == 8222


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_scaled_object_is_well_formed(variant: str) -> None:
    manifests = rendered(variant)
    scaler = scaled_object(variant)
    assert scaler["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaler["spec"]
    target = spec["scaleTargetRef"]
    assert target.get("kind", "Deployment") == "Deployment"
    assert find(manifests, "Deployment", target["name"])
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    for trigger in spec["triggers"]:
        metadata: dict[str, Any] = trigger["metadata"]
        # The CRD types trigger metadata as map[string]string: YAML numbers or booleans
        # there are rejected by the API server.
        assert all(isinstance(v, str) for v in metadata.values()), metadata
        assert set(metadata) <= KEDA_NATS_JETSTREAM_KEYS, set(metadata) - KEDA_NATS_JETSTREAM_KEYS
        assert int(metadata["lagThreshold"]) > 0
        assert metadata["useHttps"] in {"true", "false"}


# ------------------------------------------------------------------------- network


def fetcher_policy() -> dict[str, Any]:
    spec: dict[str, Any] = find(rendered("base"), "NetworkPolicy", "trove-fetcher")["spec"]
    return spec


def test_fetcher_policy_selects_the_fetchers_in_both_directions() -> None:
    spec = fetcher_policy()
    fetcher = find(rendered("base"), "Deployment", "trove-fetcher")
    assert spec["podSelector"]["matchLabels"] == fetcher["spec"]["selector"]["matchLabels"]
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]


def test_fetcher_reaches_the_web_only_on_public_addresses() -> None:
    web_rules = [
        rule for rule in fetcher_policy()["egress"] if any("ipBlock" in p for p in rule["to"])
    ]
    assert len(web_rules) == 1
    (rule,) = web_rules
    # Every TCP port, as outside Kubernetes: a port closed here would time out and
    # pause the whole host.
    assert rule["ports"] == [{"protocol": "TCP"}]
    blocks = {p["ipBlock"]["cidr"]: p["ipBlock"].get("except", []) for p in rule["to"]}
    assert set(blocks) == {"0.0.0.0/0", "::/0"}
    assert set(PRIVATE_V4) <= set(blocks["0.0.0.0/0"])
    assert set(PRIVATE_V6) <= set(blocks["::/0"])
    for cidr, excepted in blocks.items():
        network = ipaddress.ip_network(cidr)
        for item in excepted:
            sub = ipaddress.ip_network(item)
            assert sub.version == network.version
            assert sub.subnet_of(network)  # type: ignore[arg-type]


def test_fetcher_reaches_no_private_ipv4_address_through_an_ipv6_that_embeds_it() -> None:
    """On an IPv6 cluster with NAT64, 64:ff9b::a9fe:a9fe is the metadata service; 6to4
    embeds an IPv4 address the same way."""
    (rule,) = [r for r in fetcher_policy()["egress"] if any("ipBlock" in p for p in r["to"])]
    blocks = {p["ipBlock"]["cidr"]: p["ipBlock"].get("except", []) for p in rule["to"]}
    excepted = [ipaddress.ip_network(item) for item in blocks["::/0"]]

    def refused(net: ipaddress.IPv6Network) -> bool:
        return any(net.subnet_of(e) for e in excepted)  # type: ignore[arg-type]

    assert refused(ipaddress.IPv6Network("64:ff9b:1::/48"))
    for cidr in blocks["0.0.0.0/0"]:
        v4 = ipaddress.ip_network(cidr)
        start = int(v4.network_address)
        for prefix, shift, length in ((0x64FF9B << 96, 0, 96), (0x2002 << 112, 80, 16)):
            embedded = ipaddress.IPv6Network((prefix | start << shift, length + v4.prefixlen))
            assert refused(embedded), (cidr, str(embedded))
    # Public addresses behind NAT64 stay reachable: IPv4-only sites on such a cluster.
    assert not refused(ipaddress.IPv6Network("64:ff9b::5db8:d822/128"))


def test_fetcher_reaches_no_metadata_service_and_no_ipv6_form_the_fetcher_refuses() -> None:
    """The policy is the second layer under the fetcher's own rule: every metadata
    address that rule names (Azure's WireServer is a public one), in every form that
    carries an IPv4 address, and the special IPv6 ranges a cluster may still route."""
    (rule,) = [r for r in fetcher_policy()["egress"] if any("ipBlock" in p for p in r["to"])]
    blocks = {p["ipBlock"]["cidr"]: p["ipBlock"].get("except", []) for p in rule["to"]}
    excepted = [ipaddress.ip_network(item) for cidr in blocks for item in blocks[cidr]]

    def refused(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
        return any(net.version == e.version and net.subnet_of(e) for e in excepted)  # type: ignore[arg-type]

    for address in METADATA_ADDRESSES:
        assert refused(ipaddress.ip_network(address)), address
        if address.version == 4:
            value = int(address)
            assert refused(ipaddress.IPv6Network((0x64FF9B << 96 | value, 128))), address
            assert refused(ipaddress.IPv6Network((0x2002 << 112 | value << 80, 48))), address
    for special in ("::/96", "2001::/32", "fec0::/10"):
        assert refused(ipaddress.IPv6Network(special)), special


def test_fetcher_reaches_nats_and_dns_and_nothing_else_in_cluster() -> None:
    rules = [r for r in fetcher_policy()["egress"] if not any("ipBlock" in p for p in r["to"])]
    by_port = {tuple(sorted(p["port"] for p in r["ports"])): r for r in rules}
    assert set(by_port) == {(4222,), (53, 53)}
    (nats,) = by_port[(4222,)]["to"]
    assert nats["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "nats"}
    assert nats["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "nats"
    dns_rule = by_port[(53, 53)]
    assert {p["protocol"] for p in dns_rule["ports"]} == {"UDP", "TCP"}
    (dns,) = dns_rule["to"]
    assert dns["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}


def test_only_prometheus_may_connect_and_only_to_the_metrics_port() -> None:
    for policy in of_kind(rendered("base"), "NetworkPolicy"):
        for rule in policy["spec"].get("ingress", []):
            assert [p["port"] for p in rule["ports"]] == [8080]
            for peer in rule["from"]:
                assert peer["namespaceSelector"]["matchLabels"] == {
                    "kubernetes.io/metadata.name": "monitoring"
                }


def test_every_trove_pod_is_covered_by_an_ingress_policy() -> None:
    manifests = rendered("base")
    policies = of_kind(manifests, "NetworkPolicy")
    for workload in workloads(manifests):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        covered = False
        for policy in policies:
            selector = policy["spec"]["podSelector"]
            match = selector.get("matchLabels", {}).items() <= labels.items() and all(
                labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", [])
            )
            covered |= match and "Ingress" in policy["spec"]["policyTypes"]
        assert covered, workload["metadata"]["name"]


# ---------------------------------------------------------------------------- NATS


def test_nats_values_run_a_synced_jetstream_on_persistent_volumes() -> None:
    values = yaml.safe_load((K8S / "nats" / "values.yaml").read_text("utf-8"))
    jetstream = values["config"]["jetstream"]
    assert jetstream["enabled"] is True
    assert jetstream["fileStore"]["enabled"] is True
    assert jetstream["fileStore"]["pvc"]["enabled"] is True
    assert quantity(jetstream["fileStore"]["pvc"]["size"]) >= 10 * 2**30
    assert jetstream["merge"]["sync_interval"] == "always"
    major, minor = (int(x) for x in values["container"]["image"]["tag"].split("-")[0].split("."))
    assert (major, minor) >= (2, 12)


def test_nats_tells_go_its_memory_limit_with_room_for_what_is_not_heap() -> None:
    values = yaml.safe_load((K8S / "nats" / "values.yaml").read_text("utf-8"))
    container = values["container"]
    limit = quantity(container["merge"]["resources"]["limits"]["memory"])
    soft = container["env"]["GOMEMLIMIT"]
    # Go's units are Kubernetes' binary ones with a B: 1800MiB, not 1800Mi or 1800M.
    assert re.fullmatch(r"[0-9]+(Ki|Mi|Gi)?B", soft), "GOMEMLIMIT in Go's units"
    assert 0.8 * limit <= quantity(soft.removesuffix("B")) <= 0.95 * limit
