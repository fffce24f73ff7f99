"""compose.yaml for real: build, start, crawl, crash, stop and start again, on a real engine.

    make smoke                      # or: .venv/bin/python tests/deploy/smoke_compose.py

Minutes, not seconds, so it is not part of `make test`. It needs a container engine
(Docker with Compose v2 or docker-compose 1.29, or podman-compose) and the base images
the Dockerfile and compose.yaml name; if no engine answers and SMOKE_ENGINE_UP is set,
that command is run first to start one. It runs compose.yaml as shipped, plus
tests/deploy/compose.smoke.yaml (a small web on the compose network that the fetchers
may reach), as its own project (trove-smoke), and removes that project's containers
and volumes at the end unless --keep is given:

1. builds the image and the nats-certs image (timed);
2. `up`, and waits for every health check (timed);
3. seeds the web with `trove seed` as the operator user, kills the recorder's process
   from outside while the crawl runs, sees the restart policy bring it back, and finds
   every page in Postgres;
4. checks, while it crawls, that every Trove container runs as uid 10001 with a
   read-only root file system, no capabilities and no-new-privileges;
5. checks NATS: TLS and a user required, and the fetcher's user refused what it must
   not do (publishing seeds, writing the seen-set, deleting a stream);
6. `down` and `up` again: the pages and the event record are still there.

Every wait is on a condition with a deadline. The figures are printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[2]
PROJECT = "trove-smoke"
FILES = ["compose.yaml", "tests/deploy/compose.smoke.yaml"]
TROVE_SERVICES = ("discovery", "fetcher", "recorder")
USERS = ("DISCOVERY", "FETCHER", "RECORDER", "OPERATOR", "BOX")
SITE_PAGES = 12
#: Every page, and the site's root (/ and /index.html are two URLs of one file).
EXPECTED_PAGES = SITE_PAGES + 1
SITE = "http://site.trove.test:8000/"

T = TypeVar("T")


class SmokeFailed(Exception):
    """A step of the smoke test did not do what it must."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    check: bool = True,
    quiet: bool = False,
) -> subprocess.CompletedProcess[str]:
    if not quiet:
        log("$ " + shlex.join(args))
    done = subprocess.run(
        args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise SmokeFailed(
            f"{shlex.join(args)} exited {done.returncode}\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-3000:]}"
        )
    return done


def eventually(
    probe: Callable[[], T], until: Callable[[T], bool], *, timeout: float, what: str
) -> T:
    """Poll ``probe`` until ``until`` holds, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if until(last):
            return last
        time.sleep(1.0)
    raise SmokeFailed(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


# ------------------------------------------------------------------------- the engine


def engine_answers() -> bool:
    return (
        shutil.which("docker") is not None
        and run(["docker", "info"], check=False, quiet=True).returncode == 0
    )


def ensure_engine() -> None:
    if engine_answers():
        return
    command = os.environ.get("SMOKE_ENGINE_UP", "")
    if not command:
        raise SmokeFailed("no container engine answers `docker info`; set SMOKE_ENGINE_UP")
    log(f"starting a container engine: {command}")
    run(shlex.split(command), timeout=1800)
    if not engine_answers():
        raise SmokeFailed("the container engine did not come up")


def compose_command() -> list[str]:
    if run(["docker", "compose", "version"], check=False, quiet=True).returncode == 0:
        return ["docker", "compose"]
    for name in ("docker-compose", "podman-compose"):
        if shutil.which(name):
            return [name]
    raise SmokeFailed("no Compose: neither `docker compose`, docker-compose nor podman-compose")


class Compose:
    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.command = command
        self.env = env

    def __call__(
        self, *args: str, timeout: float = 600, check: bool = True, quiet: bool = False
    ) -> str:
        files = [part for f in FILES for part in ("-f", f)]
        done = run(
            [*self.command, "-p", PROJECT, *files, *args],
            env=self.env,
            timeout=timeout,
            check=check,
            quiet=quiet,
        )
        return done.stdout

    def sql(self, query: str) -> str:
        (postgres,) = self.containers("postgres")
        psql = ["psql", "-U", "trove", "-d", "trove", "-tAc", query]
        return run(["docker", "exec", postgres["Id"], *psql], quiet=True).stdout.strip()

    def containers(self, service: str | None = None) -> list[dict[str, Any]]:
        filters = ["--filter", f"label=com.docker.compose.project={PROJECT}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        ids = run(["docker", "ps", "-aq", *filters], quiet=True).stdout.split()
        if not ids:
            return []
        found: list[dict[str, Any]] = json.loads(
            run(["docker", "inspect", *ids], quiet=True).stdout
        )
        return found


def service_of(container: dict[str, Any]) -> str:
    name: str = container["Config"]["Labels"]["com.docker.compose.service"]
    return name


# ------------------------------------------------------------------------------ steps


def build(figures: dict[str, Any]) -> None:
    started = time.monotonic()
    run(["docker", "build", "--network", "host", "-t", "trove:local", "."], timeout=1800)
    figures["build_image_seconds"] = round(time.monotonic() - started, 1)
    started = time.monotonic()
    run(
        ["docker", "build", "--network", "host", "-t", "trove-nats-certs:local", "-f",
         "deploy/nats/certs.Dockerfile", "deploy/nats"],
        timeout=900,
    )  # fmt: skip
    figures["build_certs_image_seconds"] = round(time.monotonic() - started, 1)
    image = json.loads(run(["docker", "image", "inspect", "trove:local"], quiet=True).stdout)
    figures["image_mb"] = round(image[0]["Size"] / 1e6)


def write_site(folder: Path) -> None:
    """An index linking to SITE_PAGES - 1 pages, each linking on and home: depth 1 at most."""
    names = ["index.html"] + [f"page{i}.html" for i in range(1, SITE_PAGES)]
    for i, name in enumerate(names):
        links = names[1:] if i == 0 else [names[(i + 1) % SITE_PAGES], "index.html"]
        anchors = " ".join(f'<a href="/{link}">{link}</a>' for link in links)
        body = (
            f"<!doctype html><html lang=en><head><title>Smoke page {i}</title></head>"
            f"<body><h1>Smoke page {i}</h1><p>A small page about lighthouses, tides and "
            f"the keepers who watched them, number {i}.</p>{anchors}</body></html>"
        )
        (folder / name).write_text(body, "utf-8")


def all_healthy(compose: Compose) -> bool:
    containers = compose.containers()
    if not containers:
        return False
    for container in containers:
        state = container["State"]
        if service_of(container) in {"migrate", "nats-certs"}:
            if state["Status"] != "exited":
                return False
            if state["ExitCode"] != 0:
                raise SmokeFailed(f"{container['Name']} exited {state['ExitCode']}")
            continue
        if container["RestartCount"] > 0:
            raise SmokeFailed(f"{container['Name']} restarted while starting up")
        if not state["Running"]:
            return False
        if state.get("Health", {}).get("Status", "healthy") != "healthy":
            return False
    return True


def up(compose: Compose, figures: dict[str, Any], key: str) -> None:
    started = time.monotonic()
    compose("up", "-d", "--no-build", timeout=900)
    eventually(lambda: all_healthy(compose), bool, timeout=300, what="every health check to pass")
    figures[key] = round(time.monotonic() - started, 1)
    replicas = len(compose.containers("fetcher"))
    figures.setdefault("fetcher_containers", replicas)
    if replicas != 3:
        raise SmokeFailed(f"{replicas} fetcher containers, not the 3 of deploy.replicas")


def fetched_pages(compose: Compose) -> int:
    return int(compose.sql("SELECT count(*) FROM pages WHERE status = 'fetched'") or 0)


def check_locked_down(compose: Compose) -> None:
    for container in compose.containers():
        service = service_of(container)
        if service not in TROVE_SERVICES:
            continue
        name = container["Name"].lstrip("/")
        host = container["HostConfig"]
        problems = []
        if container["Config"]["User"] not in {"10001:10001", "10001"}:
            problems.append(f"user {container['Config']['User']!r}")
        if host["ReadonlyRootfs"] is not True:
            problems.append("root file system writable")
        if host["CapDrop"] not in (["ALL"], ["all"]):
            problems.append(f"cap_drop {host['CapDrop']}")
        if "no-new-privileges:true" not in (host.get("SecurityOpt") or []):
            problems.append("no no-new-privileges")
        # And as the running process sees it.
        status = run(["docker", "exec", name, "cat", "/proc/1/status"], quiet=True).stdout
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if fields["Uid"].split()[0] != "10001":
            problems.append(f"process uid {fields['Uid']}")
        if int(fields["CapEff"], 16) != 0 or int(fields["CapBnd"], 16) != 0:
            problems.append(f"capabilities {fields['CapEff']} / {fields['CapBnd']}")
        if fields.get("NoNewPrivs", "").strip() != "1":
            problems.append("NoNewPrivs is not set")
        write = run(["docker", "exec", name, "touch", "/opt/trove/x"], check=False, quiet=True)
        if write.returncode == 0 or "Read-only file system" not in write.stderr:
            problems.append(f"could write the root file system: {write.stderr.strip()}")
        if problems:
            raise SmokeFailed(f"{name} is not locked down: {'; '.join(problems)}")
    log("every Trove container: uid 10001, read-only root, no capabilities, no-new-privileges")


#: Run inside a fetcher container with the fetcher's own credentials: what NATS refuses.
PERMISSION_PROBE = r"""
import asyncio, json, os
import nats
from nats.errors import TimeoutError as NatsTimeout
from trove_schema.nats_tls import client_tls

async def main():
    violations = []
    async def on_error(exc):
        violations.append(str(exc))
    nc = await nats.connect(os.environ["TROVE_NATS_URL"], tls=client_tls(), error_cb=on_error,
                            allow_reconnect=False)
    verdict = {}
    for subject in ("trove.seeds", "$KV.trove_seen.u.smoke", "trove.events.page.discovered"):
        before = len(violations)
        await nc.publish(subject, b"http://intruder.example/")
        await nc.flush()
        for _ in range(50):
            if len(violations) > before:
                break
            await asyncio.sleep(0.1)
        verdict[subject] = "refused" if len(violations) > before else "allowed"
    try:
        await nc.request("$JS.API.STREAM.DELETE.TROVE_EVENTS", b"", timeout=3)
        verdict["delete TROVE_EVENTS"] = "allowed"
    except NatsTimeout:
        verdict["delete TROVE_EVENTS"] = "refused"
    await nc.close()
    print(json.dumps({"verdict": verdict, "violations": violations}))

asyncio.run(main())
"""


def check_nats_permissions(compose: Compose, figures: dict[str, Any]) -> None:
    # The server says, before anything else, that it wants TLS and a user.
    with socket.create_connection(("127.0.0.1", 4222), timeout=5) as sock:
        line = sock.makefile("rb").readline().decode()
    info = json.loads(line.removeprefix("INFO ").strip())
    if not (info.get("tls_required") and info.get("auth_required")):
        raise SmokeFailed(f"NATS does not require TLS and a user: {line.strip()}")
    # A client with the CA but no user is turned away.
    log("as the fetcher: connecting without a user, then publishing what it must not")
    anonymous = compose(
        "exec", "-T", "--index=1", "fetcher", "python", "-c",
        "import asyncio, nats\nfrom trove_schema.nats_tls import client_tls\n"
        "async def main():\n"
        "    try:\n"
        "        await nats.connect('tls://nats:4222', tls=client_tls(), allow_reconnect=False,"
        " max_reconnect_attempts=0, connect_timeout=3)\n"
        "        print('ACCEPTED')\n"
        "    except Exception as exc:\n"
        "        print('REFUSED', type(exc).__name__, exc)\n"
        "asyncio.run(main())",
        check=False,
        quiet=True,
    )  # fmt: skip
    if "REFUSED" not in anonymous:
        raise SmokeFailed(f"NATS let a client without a user in: {anonymous}")
    out = compose(
        "exec", "-T", "--index=1", "fetcher", "python", "-c", PERMISSION_PROBE, quiet=True
    )
    result = json.loads(out.strip().splitlines()[-1])
    verdict = result["verdict"]
    expected = {
        "trove.seeds": "refused",
        "$KV.trove_seen.u.smoke": "refused",
        "trove.events.page.discovered": "refused",
        "delete TROVE_EVENTS": "refused",
    }
    if verdict != expected:
        raise SmokeFailed(f"the fetcher's NATS user may do too much: {result}")
    figures["fetcher_user_refused"] = sorted(verdict)
    log(f"NATS: TLS and a user required; the fetcher's user refused {sorted(verdict)}")


def crash_recorder(compose: Compose, figures: dict[str, Any]) -> None:
    """SIGKILL the recorder's process (as a crash would), and wait for its restart."""
    (container,) = compose.containers("recorder")
    restarts = container["RestartCount"]
    pid = container["State"]["Pid"]
    log(f"killing the recorder's process (host pid {pid}) with SIGKILL")
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    def back() -> bool:
        (now,) = compose.containers("recorder")
        health = now["State"].get("Health", {}).get("Status")
        return bool(now["RestartCount"] > restarts and now["State"]["Running"]) and (
            health == "healthy"
        )

    eventually(back, bool, timeout=180, what="the recorder restarted and healthy again")
    figures["recorder_restart_to_healthy_seconds"] = round(time.monotonic() - killed, 1)
    (now,) = compose.containers("recorder")
    figures["recorder_restart_count"] = now["RestartCount"]
    log(f"recorder restarted by its restart policy ({now['RestartCount']} restart)")


def jetstream_messages() -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open("http://127.0.0.1:8222/jsz", timeout=5) as response:
        return int(json.load(response)["messages"])


def smoke(keep: bool, build_images: bool) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    ensure_engine()
    compose_cmd = compose_command()
    figures["compose"] = run([*compose_cmd, "version"], quiet=True).stdout.splitlines()[0]
    if build_images:
        build(figures)
    site = Path(tempfile.mkdtemp(prefix="trove-smoke-site-"))
    site.chmod(0o755)
    write_site(site)
    for page in site.iterdir():
        page.chmod(0o644)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TROVE_")},
        "SMOKE_SITE_DIR": str(site),
        "SMOKE_SUBNET": os.environ.get("SMOKE_SUBNET", "172.29.213.0/24"),
        **{f"NATS_{user}_PASSWORD": secrets.token_hex(24) for user in USERS},
    }
    compose = Compose(compose_cmd, env)
    compose("down", "-v", "--remove-orphans", check=False)
    try:
        up(compose, figures, "up_to_healthy_seconds")
        check_locked_down(compose)
        check_nats_permissions(compose, figures)

        started = time.monotonic()
        answer = compose("run", "--rm", "cli", "trove", "seed", SITE, "--request", timeout=120)
        log(f"discovery's answer to the seed: {answer.strip()[-300:]}")
        eventually(
            lambda: fetched_pages(compose), lambda n: n >= 2, timeout=120, what="a first page"
        )
        crash_recorder(compose, figures)
        check_locked_down(compose)
        pages = eventually(
            lambda: fetched_pages(compose),
            lambda n: n >= EXPECTED_PAGES,
            timeout=300,
            what=f"{EXPECTED_PAGES} fetched pages in Postgres",
        )
        figures["pages_crawled"] = pages
        figures["crawl_seconds"] = round(time.monotonic() - started, 1)
        figures["crawls_recorded"] = int(compose.sql("SELECT count(*) FROM page_crawls"))
        status = compose("run", "--rm", "cli", "trove", "status", timeout=120)
        log("trove status:\n" + status.strip()[-1500:])

        pages = fetched_pages(compose)
        messages = jetstream_messages()
        compose("down", timeout=300)
        if compose.containers():
            raise SmokeFailed("containers left after down")
        up(compose, figures, "second_up_to_healthy_seconds")
        kept_pages = fetched_pages(compose)
        kept_messages = jetstream_messages()
        if kept_pages != pages or kept_messages < messages:
            raise SmokeFailed(
                f"down and up lost data: pages {pages} -> {kept_pages}, "
                f"JetStream messages {messages} -> {kept_messages}"
            )
        figures["kept_after_down_up"] = {"pages": kept_pages, "jetstream_messages": kept_messages}
        log(f"after down and up: {kept_pages} pages, {kept_messages} JetStream messages kept")
    except SmokeFailed:
        for service in ("nats", "discovery", "fetcher", "recorder", "migrate"):
            logs = compose("logs", "--no-color", "--tail=25", service, check=False)
            log(f"--- logs of {service}:\n{logs}")
        raise
    finally:
        if not keep:
            compose("down", "-v", "--remove-orphans", timeout=300, check=False)
        shutil.rmtree(site, ignore_errors=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the project running")
    parser.add_argument(
        "--no-build",
        action="store_true",
        help="use the images trove:local and trove-nats-certs:local as they are",
    )
    args = parser.parse_args()
    started = time.monotonic()
    try:
        figures = smoke(args.keep, build_images=not args.no_build)
    except SmokeFailed as exc:
        log(f"FAILED: {exc}")
        print("0 passed, 1 failed")
        return 1
    figures["total_seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(figures, indent=2))
    print("1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
