"""``trove``: the command line for running, seeding and inspecting a crawl."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pydantic
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text
from sqlalchemy import exc as sa_exc

from trove_cli.broker import connect, shown
from trove_cli.database import engine as database_engine
from trove_cli.dead import DEFAULT_LAST as DEFAULT_LAST_DEAD
from trove_cli.dead import dead_command
from trove_cli.domain import DEFAULT_LAST, domain_command
from trove_cli.exclusions import exclusions_command
from trove_cli.instances import (
    command_payload,
    follow_command,
    instances_command,
    timelines_never_polled,
)
from trove_cli.local import LocalTrove, running_stack
from trove_cli.outside import outside
from trove_cli.report import (
    TOP_ROWS,
    build_report,
    progress_counts,
    refusals_so_far,
    render,
)
from trove_cli.search import DEFAULT_LIMIT, MAX_LIMIT, search_command
from trove_cli.status import status_command
from trove_cli.supervisor import RestartPolicy
from trove_schema.bus import nats_servers
from trove_schema.errors import TroveError
from trove_schema.migrate import upgrade
from trove_schema.nats_tls import client_tls
from trove_schema.seed_text import seed_words
from trove_schema.server_time import server_now
from trove_schema.settings import (
    CommonSettings,
    UnknownSetting,
    check_environment,
    settings_problem,
)
from trove_schema.topology import (
    DISCOVERY_FOLLOWS,
    DISCOVERY_LINKS,
    DISCOVERY_SEEDS,
    EVENTS_STREAM,
    FETCH_DEFERRED,
    FETCHER,
    FETCHER_DEFERRED,
    FOLLOW_SUBJECT,
    RECORDER,
    SEEDS_STREAM,
    SEEDS_SUBJECT,
    WORK_STREAM,
    TopologyOptions,
    declare,
    ensure_topology,
)
from trove_schema.urls import masked
from trove_stack.stack import left_behind_stopped

console = Console(stderr=False)

#: ``trove crawl --sandbox``'s state folder when TROVE_STATE_DIR is not set.
SANDBOX_STATE_DIR = Path(".trove-sandbox")

#: How long ``trove crawl --until-idle`` waits for a followed instance's first poll
#: before it takes the crawl for idle without it.
FIRST_POLL_WAIT = 60.0

CONSUMERS = (
    (SEEDS_STREAM, DISCOVERY_SEEDS),
    (SEEDS_STREAM, DISCOVERY_FOLLOWS),
    (EVENTS_STREAM, DISCOVERY_LINKS),
    (EVENTS_STREAM, FETCHER),
    (WORK_STREAM, FETCHER_DEFERRED),
    (EVENTS_STREAM, RECORDER),
)


def _urls(settings: CommonSettings) -> tuple[str, str]:
    """The servers to talk to: TROVE_* URLs, else a stack started by `trove up`.

    One URL set and the other taken from `trove up`'s stack only when that stack uses
    the one set: a production database and this machine's event record would be two
    crawls' (a replay would fill the one with the other)."""
    nats_url, db_url = settings.nats_url, settings.database_url
    if not nats_url or not db_url:
        found = running_stack(settings.state_dir)
        local_nats = found.get("TROVE_NATS_URL", "")
        local_db = found.get("TROVE_DATABASE_URL", "")
        if not nats_url and (not db_url or db_url == local_db):
            nats_url = local_nats
        if not db_url and (not settings.nats_url or settings.nats_url == local_nats):
            db_url = local_db
    return nats_url, db_url


def _half_given(settings: CommonSettings) -> str | None:
    """Why a stack of this machine's cannot start beside the one URL given, if one is:
    its empty event record would feed a production database its projections, or its
    empty database would take a production broker's events from its services."""
    if bool(settings.nats_url) == bool(settings.database_url):
        return None
    given, other = (
        ("TROVE_NATS_URL", "TROVE_DATABASE_URL")
        if settings.nats_url
        else ("TROVE_DATABASE_URL", "TROVE_NATS_URL")
    )
    return (
        f"{given} is set and {other} is not: a crawl's broker and database go together. "
        f"Set both to run against them, or neither to start servers of this machine's own"
    )


def _not_joined(settings: CommonSettings, command: str, join: bool) -> str | None:
    """Why this machine's services do not start on the servers given, if both are and
    ``--join`` is not: they own the streams, consumers and buckets there, so they would
    reconcile a production cluster to this shell's settings (3 replicas to 1), migrate
    its database, and a sandbox's fetcher would crawl for it with the sandbox's gap."""
    if join or not (settings.nats_url and settings.database_url):
        return None
    return (
        f"TROVE_NATS_URL and TROVE_DATABASE_URL are set: `trove {command}` would run this "
        "machine's services on those servers, which would take their streams, consumers "
        "and buckets to this shell's settings and migrate the database. Add --join if "
        "that stack is yours to run services on; `trove seed` feeds a crawl already "
        "running there; unset both to start servers of this machine's own"
    )


async def pipeline_backlog(js: JetStreamContext) -> int:
    """Messages waiting or in flight in any consumer, plus fetches deferred to a later slot."""
    total = 0
    for stream, durable in CONSUMERS:
        try:
            info = await js.consumer_info(stream, durable)
        except Exception:
            return -1
        total += (info.num_pending or 0) + (info.num_ack_pending or 0)
    # The deferred fetches are the stream's messages on its one other subject: each
    # schedule has a subject of its own, and listing them (a frontier's million) would
    # walk the server's subject index and answer megabytes, twice a second.
    info = await js.stream_info(WORK_STREAM, subjects_filter=FETCH_DEFERRED)
    fired = (info.state.subjects or {}).get(FETCH_DEFERRED, 0)
    total += max(info.state.messages - fired, 0)
    return total


#: How often a crawl on a stack of this machine's own looks at its servers.
SERVERS_LOOKED_AT_EVERY = 0.5


async def unless_a_server_exits(local: LocalTrove, work: Awaitable[int]) -> int:
    """``work``'s result, unless a server of ``local``'s stack exits first (the OOM
    killer, a full disk): then a ``StackError`` naming it. The server's end shows first
    as a connection that fails or hangs anywhere (a reconnecting client waits two
    minutes), which would be the error said instead, or none."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=SERVERS_LOOKED_AT_EVERY)
            if done and task.exception() is None:
                return task.result()
            local.stack.check_servers()
            if done:
                return task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def watch_crawl(
    *,
    nats_url: str,
    database_url: str,
    seeds: Sequence[str],
    until_idle: bool,
    max_pages: int | None,
    timeout: float,  # noqa: ASYNC109 - the crawl's budget, not an I/O timeout
    local: LocalTrove | None = None,
    follows: Sequence[str] = (),
    force: bool = False,
) -> int:
    """Send the seeds (``force``: to be crawled now, if known this cycle too) and the
    follows, show the crawl's progress until it is over, and report it; its exit code.
    ``cmd_crawl`` runs it beside a look at its stack's servers (``unless_a_server_exits``)."""

    async def quiet(exc: Exception) -> None:
        """nats-py prints each failed reconnect with its traceback, twice a second: the
        crawl says once what ended it (a server of the stack that exited, say)."""

    # Reconnects allowed: a cluster joined may restart a node under a long crawl.
    nc = await nats.connect(
        nats_servers(nats_url), name="trove-cli", tls=client_tls(), error_cb=quiet
    )
    engine = database_engine(database_url)
    try:
        # The seeds stream must exist before a core publish, or the seeds go nowhere. The
        # CLI owns nothing: it creates what is missing (with TROVE_REPLICAS and the
        # retention settings) and never changes what exists.
        options = TopologyOptions.from_settings(CommonSettings())
        await ensure_topology(nc.jetstream(), declare(options), owner="cli")
        # The progress, the page limit, the idle check and the report count from here: a
        # state folder kept from earlier crawls holds theirs. The earlier of nats-server's
        # clock and this machine's: the fetchers stamp their attempts on nats-server's
        # time, and a discovery replica a page's discovery on its node's (this machine's,
        # for the services `--join` runs here); a laptop minutes ahead of the cluster
        # would count none of the attempts, one behind none of its own discoveries.
        began = min(datetime.now(UTC), datetime.fromtimestamp(await server_now(nc), UTC))
        refusals_before = await refusals_so_far(engine)
        if seeds:
            # Exactly what `nats pub trove.seeds "$(printf '%s\n' URL...)"` sends, or
            # `nats pub trove.seeds '{"urls": [...], "force": true}'`.
            await nc.publish(SEEDS_SUBJECT, seeds_payload(seeds, force=force))
            await nc.flush()
        for instance in follows:
            # What `nats pub trove.follow '{"instance": "URL"}'` sends: its local timeline.
            await nc.publish(FOLLOW_SUBJECT, command_payload(instance, None, None))
            await nc.flush()
        js = nc.jetstream()
        code = 0
        deadline = time.monotonic() + timeout
        polls_awaited_until = time.monotonic() + FIRST_POLL_WAIT
        quiet_since: float | None = None
        next_line = time.monotonic()
        columns = (
            TextColumn("[bold]crawling"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("pages"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[note]}"),
        )
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task("crawl", total=None, note="")
            while True:
                # A service that dies meanwhile is restarted by LocalTrove's supervisor.
                # A state folder kept from earlier crawls (no --fresh): --max-pages and the
                # bar count this crawl's pages (its report's), not every page the database
                # holds.
                done, queued = await progress_counts(engine, began)
                backlog = await pipeline_backlog(js)
                note = f"backlog {backlog}"
                # The pages a followed instance shares come with its first poll: the
                # crawl is not idle before it (nor after FIRST_POLL_WAIT without one).
                unpolled = 0
                if follows and time.monotonic() < polls_awaited_until:
                    unpolled = await timelines_never_polled(engine, follows)
                    note += f", {unpolled} instance(s) not polled yet" if unpolled else ""
                if local is not None:
                    restarts = sum(s.restarts for s in local.process_states().values())
                    note += f", {restarts} service restart(s)" if restarts else ""
                progress.update(task, completed=done, total=max(queued, 1), note=note)
                if not console.is_terminal and time.monotonic() >= next_line:
                    # No live bar without a terminal (CI, a pipe): a line every few seconds.
                    console.print(f"crawled {done}/{queued} pages, {note}")
                    next_line = time.monotonic() + 5.0
                if max_pages is not None and done >= max_pages:
                    break
                # Idle: nothing waiting anywhere, every page this crawl queued crawled, for
                # 2 s (the seeds are in the backlog from their publish on). Nothing queued
                # at all is idle too: every seed was refused, which the report says.
                if until_idle and backlog == 0 and done == queued and not unpolled:
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since >= 2.0:
                        break
                else:
                    quiet_since = None
                if time.monotonic() > deadline:
                    console.print(f"[yellow]stopped after {timeout:.0f}s: not idle yet[/yellow]")
                    # Asked to crawl until idle, it did not get there: not a success.
                    code = 1 if until_idle else 0
                    break
                await asyncio.sleep(0.5)
        report = await build_report(engine, refusals_after=refusals_before, since=began)
        render(report, console)
        refused_all = len(report.rejected_seeds) >= min(len(set(seeds)), TOP_ROWS)
        if seeds and not queued and not force and not refused_all:
            # A state folder kept from an earlier crawl knows the seeds: discovery takes a
            # URL once a cycle, and its pages are re-crawled on their own schedule.
            console.print(
                "[yellow]no page was queued: the seeds not refused above are known from "
                "an earlier crawl, and re-crawled on their schedule; `trove crawl --force "
                "URL...` crawls them again now[/yellow]"
            )
        return code
    finally:
        await engine.dispose()
        await nc.close()


@dataclass(frozen=True, slots=True)
class _Sandbox:
    seeds: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    #: The sandbox's fediverse instance, to follow, when it is served.
    follows: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def _maybe_sandbox(enabled: bool, fediverse: int | None = None) -> AsyncIterator[_Sandbox]:
    if not enabled:
        yield _Sandbox()
        return
    from trove_sandbox.fediverse import FediverseInstance, serve_instance
    from trove_sandbox.server import serve_sandbox
    from trove_sandbox.web import TLD, SandboxWeb

    web = SandboxWeb.generate()
    async with contextlib.AsyncExitStack() as stack:
        running = await stack.enter_async_context(serve_sandbox(web))
        resolve = ",".join(f"{h}={ip}" for h, ip in sorted(running.resolve_map.items()))
        networks = web.allowed_network()
        follows: list[str] = []
        if fediverse is not None:
            # On the IP after the web's last host, as `trove sandbox --fediverse` serves it.
            ip = str(ipaddress.IPv4Address(web.hosts[-1].ip) + 1)
            instance = FediverseInstance.generate(web=web, posts=fediverse, ip=ip)
            await stack.enter_async_context(
                serve_instance(instance, port=running.port, witness=running.witness)
            )
            resolve += f",{instance.host}={instance.ip}"
            networks += f",{instance.ip}/32"
            follows.append(instance.origin)
        # The sandbox's hosts are many sites under one name, as on a blog platform.
        env = {
            "TROVE_RESOLVE": resolve,
            "TROVE_ALLOWED_NETWORKS": networks,
            "TROVE_PLATFORM_DOMAINS": TLD,
        }
        yield _Sandbox(seeds=list(running.seeds), env=env, follows=follows)


def restart_policy(settings: CommonSettings) -> RestartPolicy:
    return RestartPolicy(
        first_delay=settings.restart_delay_seconds,
        max_delay=max(settings.restart_max_delay_seconds, settings.restart_delay_seconds),
        reset_after=settings.restart_reset_after_seconds,
    )


def _tell(message: str) -> None:
    """The supervisor's news (a service exited, was restarted), on the console."""
    console.print(Text(message, style="yellow"))


def _not_sandbox_alone(args: argparse.Namespace, settings: CommonSettings) -> str | None:
    """Why a ``--sandbox`` crawl cannot start, if it is asked to crawl more than the
    sandbox: its fetcher waits 1 s between requests and may reach the sandbox's loopback
    network, settings for Trove's own hosts, not for a real site, an instance or a
    production frontier."""
    if not args.sandbox:
        return None
    others = [
        what
        for what, given in (
            ("seed URLs", args.seeds),
            ("--follow", args.follow),
            ("--join", args.join),
            ("TROVE_NATS_URL or TROVE_DATABASE_URL", settings.nats_url or settings.database_url),
        )
        if given
    ]
    if not others:
        return None
    return (
        "--sandbox crawls the sandbox web alone, on servers of this machine's own: its "
        "fetcher waits 1 s between requests and may reach the sandbox's loopback "
        "addresses, settings not for real sites, instances or another stack. Drop "
        f"{' and '.join(others)}, or crawl without --sandbox"
    )


def crawl_state_dir(sandbox: bool, settings: CommonSettings) -> Path:
    """A sandbox crawl's state folder: ``.trove-sandbox`` unless TROVE_STATE_DIR names
    one, so that its ``--fresh`` never empties a real crawl's ``.trove``, nor a later
    ``trove up`` crawl on from the sandbox's pages and followed instance."""
    if sandbox and "state_dir" not in settings.model_fields_set:
        return SANDBOX_STATE_DIR
    return settings.state_dir


async def cmd_crawl(args: argparse.Namespace, settings: CommonSettings) -> int:
    refused = (
        _not_text(args.seeds)
        or _not_sandbox_alone(args, settings)
        or _half_given(settings)
        or _not_joined(settings, "crawl", args.join)
    )
    if refused:
        console.print(Text(refused, "red"))
        return 2
    if args.fediverse is not None and not args.sandbox:
        console.print("[red]--fediverse serves the sandbox's instance: add --sandbox[/red]")
        return 2
    state_dir = crawl_state_dir(args.sandbox, settings)
    async with _maybe_sandbox(args.sandbox, args.fediverse) as sandbox:
        seeds = [*args.seeds, *sandbox.seeds]
        follows = [*args.follow, *sandbox.follows]
        if not seeds and not follows:
            console.print("[red]give at least one seed URL, --follow URL or --sandbox[/red]")
            return 2
        service_env = dict(sandbox.env)
        if args.sandbox and "TROVE_MIN_DOMAIN_DELAY_SECONDS" not in os.environ:
            # Our own sandbox may be crawled briskly: a sandbox crawl fetches nothing else.
            service_env["TROVE_MIN_DOMAIN_DELAY_SECONDS"] = "1"
        local = LocalTrove(
            state_dir=state_dir,
            nats_url=settings.nats_url,
            database_url=settings.database_url,
            fresh=args.fresh,
            fetchers=args.fetchers,
            service_env=service_env,
            fast_and_unsafe=args.fresh,
            notify=_tell,
            restart_policy=restart_policy(settings),
        )
        console.print(f"starting Trove (state in {state_dir}) ...")
        await left_behind_stopped(state_dir, say=console.print)
        try:
            # Stopped whatever ends the crawl, a signal while the stack starts too: the
            # stop waits for the start's thread (``LocalTrove.turn``).
            await asyncio.to_thread(local.start)
            nats_shown, db_shown = shown(local.stack.nats_url), shown(local.stack.database_url)
            console.print(Text(f"NATS {nats_shown}   Postgres {db_shown}"))
            # The operator's own URLs, shown as everything else Trove prints them.
            console.print(Text("seeds: " + masked(", ".join(seeds))))
            if follows:
                console.print(Text("following: " + masked(", ".join(follows))))
            crawl = watch_crawl(
                nats_url=local.stack.nats_url,
                database_url=local.stack.database_url,
                seeds=seeds,
                # Up to --max-pages, or fewer if the crawl runs out of pages first.
                until_idle=True,
                max_pages=args.max_pages,
                timeout=args.timeout,
                local=local,
                follows=follows,
                force=args.force,
            )
            return await unless_a_server_exits(local, crawl)
        finally:
            await asyncio.to_thread(local.stop)


def _not_text(seeds: Sequence[str]) -> str | None:
    """Why the seeds cannot be sent, if one is not UTF-8 (bytes the shell passed that
    Python keeps as surrogates): discovery would refuse the whole message for it."""
    for seed in seeds:
        try:
            seed.encode()
        except UnicodeEncodeError:
            # The bytes as given (``caf\xe9``), which the surrogates stand for.
            shown = seed.encode(errors="surrogateescape").decode(errors="backslashreplace")
            return (
                f"not UTF-8 text: {shown} (a terminal not set to UTF-8? percent-encode "
                "such a byte, \\xe9 as %E9): nothing was sent"
            )
    return None


async def cmd_seed(args: argparse.Namespace, settings: CommonSettings) -> int:
    if refused := _not_text(args.urls):
        console.print(Text(refused, "red"))
        return 2
    if args.force and any(url.lstrip().startswith(("{", "[")) for url in args.urls):
        console.print(Text('--force takes URLs: in JSON, say "force": true', "red"))
        return 2
    nats_url, _ = _urls(settings)
    if not nats_url:
        console.print("[red]no running stack: set TROVE_NATS_URL or start `trove up`[/red]")
        return 2
    nc = await connect(nats_url)
    try:
        # The stream must exist, or seeds sent while no discovery runs go nowhere. The
        # CLI owns nothing: it creates what is missing and changes nothing else.
        options = TopologyOptions.from_settings(CommonSettings())
        await ensure_topology(nc.jetstream(), declare(options), owner="cli")
        # Forced, in discovery's JSON form, which says it: a seed of a page known already
        # this cycle is otherwise dropped as seen (its place kept by its chain).
        payload = seeds_payload(args.urls, force=args.force)
        if args.request:
            try:
                reply = await nc.request(SEEDS_SUBJECT, payload, timeout=10)
            except (NatsTimeout, NoRespondersError):
                console.print(
                    Text(
                        f"no answer from discovery within 10 s: the seeds are kept in "
                        f"{SEEDS_SUBJECT} and will be handled when discovery runs",
                        "yellow",
                    )
                )
                return 0
            answer = reply.data.decode(errors="replace")
            console.print(outside(answer))  # it repeats each refused seed as sent
            # Discovery's summary (``reply_lines``, or JSON for seeds sent as JSON): a
            # refusal fails the command, as `trove follow`'s does, so a script can tell.
            return 1 if _refused(answer) else 0
        else:
            await nc.publish(SEEDS_SUBJECT, payload)
            await nc.flush()
            console.print(f"published {len(args.urls)} seed(s) to {SEEDS_SUBJECT}")
    finally:
        await nc.close()
    return 0


def seeds_payload(seeds: Sequence[str], *, force: bool) -> bytes:
    """What ``nats pub trove.seeds`` sends for ``seeds``: one a line, or with ``force``
    discovery's JSON form, ``{"urls": [...], "force": true}``. An argument may hold
    several lines (``"$(cat urls.txt)"``): its URLs are the seeds in both forms, read as
    discovery reads a message's text (``seed_words``: in JSON, the lines of one argument
    were one URL, their line breaks dropped)."""
    if not force:
        return "\n".join(seeds).encode()
    urls = [url for seed in seeds for url in seed_words(seed)]
    return json.dumps({"urls": urls, "force": True}, ensure_ascii=False).encode()


def _refused(answer: str) -> bool:
    """Whether discovery's answer to a seed request refused any of it."""
    if answer.lstrip().startswith("{"):
        try:
            summary = json.loads(answer)
        except ValueError:
            return True  # not discovery's summary: nothing says the seeds were taken
        return not isinstance(summary, dict) or summary.get("rejected_count", 1) != 0
    return re.search(r"^rejected \d+:", answer, re.MULTILINE) is not None


async def cmd_status(args: argparse.Namespace, settings: CommonSettings) -> int:
    nats_url, db_url = _urls(settings)
    if not nats_url or not db_url:
        console.print(
            "[red]no running stack: set TROVE_NATS_URL/TROVE_DATABASE_URL or `trove up`[/red]"
        )
        return 2
    return await status_command(nats_url, db_url, console, state_dir=settings.state_dir)


async def cmd_dead(args: argparse.Namespace, settings: CommonSettings) -> int:
    nats_url, _ = _urls(settings)
    if not nats_url:
        console.print("[red]no running stack: set TROVE_NATS_URL or start `trove up`[/red]")
        return 2
    return await dead_command(
        nats_url,
        console,
        action=args.action,
        seqs=getattr(args, "seqs", ()),
        every=getattr(args, "all", False),
        consumer=getattr(args, "only", None) or args.consumer,
        last=args.last or None,
    )


async def cmd_search(args: argparse.Namespace, settings: CommonSettings) -> int:
    _, db_url = _urls(settings)
    if not db_url:
        console.print("[red]no database: set TROVE_DATABASE_URL or start `trove up`[/red]")
        return 2
    return await search_command(db_url, " ".join(args.query), args.lang, args.limit, console)


async def cmd_follow(args: argparse.Namespace, settings: CommonSettings) -> int:
    nats_url, _ = _urls(settings)
    if not nats_url:
        console.print("[red]no running stack: set TROVE_NATS_URL or start `trove up`[/red]")
        return 2
    return await follow_command(
        nats_url,
        console,
        instance=args.instance,
        timeline=args.timeline,
        max_depth=getattr(args, "max_depth", None),
        unfollow=args.command == "unfollow",
    )


async def cmd_instances(args: argparse.Namespace, settings: CommonSettings) -> int:
    nats_url, db_url = _urls(settings)
    if not db_url:
        console.print("[red]no database: set TROVE_DATABASE_URL or start `trove up`[/red]")
        return 2
    return await instances_command(db_url, console, nats_url)


async def cmd_domain(args: argparse.Namespace, settings: CommonSettings) -> int:
    nats_url, db_url = _urls(settings)
    if not db_url:
        console.print("[red]no database: set TROVE_DATABASE_URL or start `trove up`[/red]")
        return 2
    return await domain_command(nats_url, db_url, args.host, args.last, console)


async def cmd_exclusions(args: argparse.Namespace, settings: CommonSettings) -> int:
    nats_url, _ = _urls(settings)
    if not nats_url:
        console.print("[red]no running stack: set TROVE_NATS_URL or start `trove up`[/red]")
        return 2
    action = {"exclude": "exclude", "include": "include"}.get(args.command, "list")
    return await exclusions_command(
        nats_url,
        console,
        action=action,
        hosts=getattr(args, "hosts", ()),
        reason=getattr(args, "reason", ""),
    )


def cmd_up(args: argparse.Namespace, settings: CommonSettings) -> int:
    if refused := _half_given(settings) or _not_joined(settings, "up", args.join):
        console.print(Text(refused, "red"))
        return 2
    local = LocalTrove(
        state_dir=settings.state_dir,
        nats_url=settings.nats_url,
        database_url=settings.database_url,
        fresh=args.fresh,
        fetchers=args.fetchers,
        notify=_tell,
        restart_policy=restart_policy(settings),
    )
    with local:
        # Passwords hidden (a terminal's scrollback, a CI log): they are in the
        # deployment's settings, and in stack.json for this user's other commands.
        console.print(Text(f"TROVE_NATS_URL={shown(local.stack.nats_url)}"))
        console.print(Text(f"TROVE_DATABASE_URL={shown(local.stack.database_url)}"))
        console.print(
            f"logs in {settings.state_dir / 'logs'}; a service that dies is restarted "
            "(`trove status` lists restarts); Ctrl-C stops everything"
        )
        if local.ports:
            console.print(
                "/healthz, /readyz and /metrics: "
                + ", ".join(f"{process} on {port}" for process, port in local.ports.items())
            )
        console.print(
            "seed it: trove seed https://example.org/  (or nats -s URL pub "
            f"{SEEDS_SUBJECT} ..., the URL with its password in {settings.state_dir}/stack.json)"
        )
        try:
            while True:
                time.sleep(1)  # the supervisor's thread restarts services that die
                local.stack.check_servers()
        except KeyboardInterrupt:
            console.print("stopping ...")
    return 0


def cmd_migrate(args: argparse.Namespace, settings: CommonSettings) -> int:
    _, db_url = _urls(settings)
    if not db_url:
        console.print("[red]set TROVE_DATABASE_URL (or start `trove up`)[/red]")
        return 2
    upgrade(db_url)
    console.print("database is at the latest schema")
    return 0


def cmd_replay(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Runs the recorder's replay (the CLI never imports a service: it runs it)."""
    if args.database_url:
        # The one given is paired with `trove up`'s broker only if that stack's own.
        settings = settings.model_copy(update={"database_url": args.database_url})
    nats_url, target = _urls(settings)
    if not nats_url and args.database_url:
        console.print(
            "[red]--database-url names another database than `trove up`'s: set "
            "TROVE_NATS_URL to the broker whose events it is to hold[/red]"
        )
        return 2
    if not nats_url or not target:
        console.print("[red]set TROVE_NATS_URL and TROVE_DATABASE_URL (or start `trove up`)[/red]")
        return 2
    console.print(Text(f"replaying the events of {shown(nats_url)} into {shown(target)}"))
    env = {**os.environ, "TROVE_NATS_URL": nats_url, "TROVE_DATABASE_URL": target}
    argv = [sys.executable, "-m", "trove_recorder", "replay"]
    if args.truncate:
        argv.append("--truncate")
    if args.since:
        argv += ["--since", args.since]
    return _run_to_its_end(argv, env)


def _run_to_its_end(argv: list[str], env: dict[str, str]) -> int:
    """Run ``argv`` and return its exit code; a stop (Ctrl-C, SIGTERM, SIGHUP) reaches it
    once, as a SIGINT, and is waited out: a replay's stop releases the retries it holds
    and its lock. ``subprocess.run`` killed it a quarter of a second after a Ctrl-C, in
    the middle of that, and a SIGTERM to this process alone never reached it. In a
    session of its own, a terminal's Ctrl-C does not reach it a second time; a second
    stop kills it."""
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            proc.kill()
            proc.wait()
            return 130
    return 128 - code if code < 0 else code


def cmd_sandbox(args: argparse.Namespace, settings: CommonSettings) -> int:
    from trove_sandbox.__main__ import main as sandbox_main

    return sandbox_main(args.rest)


JOIN_HELP = (
    "with TROVE_NATS_URL and TROVE_DATABASE_URL set: run this machine's services on "
    "those servers, a stack of yours (they take its streams to this shell's settings)"
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trove", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run the whole stack in the foreground")
    up.add_argument("--fresh", action="store_true", help="wipe the state folder first")
    up.add_argument("--fetchers", type=_count(1), default=1)
    up.add_argument("--join", action="store_true", help=JOIN_HELP)

    crawl = sub.add_parser("crawl", help="crawl from seeds with a progress bar and a report")
    crawl.add_argument("seeds", nargs="*")
    crawl.add_argument("--sandbox", action="store_true", help="crawl the local synthetic web")
    crawl.add_argument(
        "--fediverse",
        metavar="POSTS",
        type=_count(0),
        default=None,
        help="with --sandbox: also serve its fediverse instance with POSTS posts, and follow it",
    )
    crawl.add_argument(
        "--follow",
        metavar="URL",
        action="append",
        default=[],
        help="also follow this fediverse instance's local timeline (repeatable)",
    )
    crawl.add_argument(
        "--until-idle",
        action="store_true",
        help="stop when nothing is left to do (as it does anyway: kept for scripts)",
    )
    crawl.add_argument(
        "--max-pages", type=_count(1), default=None, help="stop after N (sooner if idle)"
    )
    crawl.add_argument("--fetchers", type=_count(1), default=1)
    crawl.add_argument("--fresh", action="store_true", help="start from an empty state folder")
    crawl.add_argument(
        "--force",
        action="store_true",
        help="crawl the seeds now, also those an earlier crawl of the state folder knows",
    )
    crawl.add_argument("--join", action="store_true", help=JOIN_HELP)
    crawl.add_argument("--timeout", type=_seconds, default=3600.0)

    seed = sub.add_parser(
        "seed", help="publish seeds to a running stack (like `nats pub trove.seeds`)"
    )
    seed.add_argument("urls", nargs="+")
    seed.add_argument("--request", action="store_true", help="wait for discovery's verdict")
    seed.add_argument(
        "--force",
        action="store_true",
        help="crawl them now, also pages the crawl knows already (a URL each, not JSON)",
    )

    follow = sub.add_parser(
        "follow", help="follow a fediverse instance's timeline (like `nats req trove.follow`)"
    )
    follow.add_argument("instance", metavar="URL", help="the instance, https://social.example")
    follow.add_argument("--timeline", default=None, help="local (the default), public or tag:NAME")
    follow.add_argument(
        "--max-depth",
        type=_count(0),
        default=None,
        help="how far the crawl goes from a shared page, on its host (default 0)",
    )
    unfollow = sub.add_parser("unfollow", help="stop following an instance's timeline")
    unfollow.add_argument("instance", metavar="URL")
    unfollow.add_argument(
        "--timeline", default=None, help="this timeline only (default: every timeline)"
    )
    sub.add_parser("instances", help="the followed fediverse timelines and their state")
    exclude = sub.add_parser(
        "exclude", help="keep Trove away from hosts, and every name below them, within seconds"
    )
    exclude.add_argument("hosts", nargs="+", metavar="HOST", help="a host name or a URL")
    exclude.add_argument("--reason", default="", help="kept as the line's comment")
    include = sub.add_parser("include", help="take hosts off the shared list of excluded hosts")
    include.add_argument("hosts", nargs="+", metavar="HOST")
    sub.add_parser("exclusions", help="the shared list of excluded hosts")
    sub.add_parser("status", help="consumer lag and what the tables hold")
    search = sub.add_parser("search", help="full-text search over the fetched pages")
    search.add_argument("query", nargs="+", help='web search syntax: words, "a phrase", -word, or')
    search.add_argument("--lang", default=None, help="only pages in this language (en, pt-BR)")
    search.add_argument("--limit", type=_count(1, MAX_LIMIT), default=DEFAULT_LIMIT)
    domain = sub.add_parser("domain", help="a host's audit: every request, its result and tags")
    domain.add_argument("host")
    domain.add_argument("--last", type=_count(1), default=DEFAULT_LAST, help="attempts listed")
    dead = sub.add_parser("dead", help="list parked (dead-letter) messages; re-drive or drop them")
    dead.add_argument("--consumer", default=None, help="only this consumer's (e.g. recorder)")
    dead.add_argument(
        "--last",
        type=_count(0),
        default=DEFAULT_LAST_DEAD,
        metavar="N",
        help=f"list the newest N (default {DEFAULT_LAST_DEAD}; 0: all), the others counted",
    )
    dead_sub = dead.add_subparsers(dest="action")
    for action, what in (
        ("redrive", "publish to the original subject, then remove"),
        ("drop", "remove for good (logged)"),
    ):
        act = dead_sub.add_parser(action, help=what)
        act.add_argument(
            "seqs",
            nargs="*",
            type=_count(1, 2**64 - 1),  # a stream's sequences: nats-server refuses others
            metavar="SEQ",
            help="as `trove dead` lists",
        )
        act.add_argument("--all", action="store_true", help="every parked message")
        act.add_argument(
            "--consumer",
            dest="only",
            metavar="CONSUMER",
            default=None,
            help="with --all: only this consumer's",
        )
    sub.add_parser("migrate", help="bring the database schema up to date")
    replay = sub.add_parser("replay", help="rebuild the tables from the event record")
    replay.add_argument("--database-url", default="", help="replay into this database instead")
    window = replay.add_mutually_exclusive_group()
    window.add_argument("--truncate", action="store_true", help="empty the tables first")
    window.add_argument(
        "--since",
        metavar="WHEN",
        help="re-apply the events from then on, into tables that have projections "
        "(2h, 30m, 1d, or 2026-11-28T04:00Z): after a failover that lost recent commits",
    )
    # Its options are the sandbox's own (``trove sandbox --help``): ``main`` hands them over
    # before this parser sees them.
    sub.add_parser(
        "sandbox", help="serve the synthetic small web in the foreground", add_help=False
    )
    return p


def _count(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argument type: a whole number of at least ``minimum`` (and at most ``maximum``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"at least {minimum}, not {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"at most {maximum}, not {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"more than 0, not {text}")
    return value


class _Stops:
    """SIGTERM and SIGHUP stop a command as Ctrl-C does.

    An async command's task is cancelled, as asyncio does on Ctrl-C, so that each part
    stops in turn (the crawl's clients close, then its stack stops); a second signal
    raises at once. A ``KeyboardInterrupt`` raised wherever the signal landed could land
    inside a client's own task (nats-py's reader, say), whose work the stopping then
    waited for in vain: `trove crawl` stopped its stack and hung."""

    def __init__(self) -> None:
        self.task: asyncio.Task[int] | None = None
        self.count = 0

    def __call__(self, signum: int, frame: object) -> None:
        self.count += 1
        task = self.task
        if task is None or task.done() or self.count > 1:
            raise KeyboardInterrupt
        task.cancel()
        task.get_loop().call_soon_threadsafe(lambda: None)  # the loop may be asleep

    async def run(self, command: Coroutine[Any, Any, int]) -> int:
        """``command`` as the task a signal cancels; 130 when one did, as on Ctrl-C."""
        self.task, self.count = asyncio.current_task(), 0
        try:
            return await command
        except asyncio.CancelledError:
            if self.count:
                return 130
            raise
        finally:
            self.task = None


_stops = _Stops()


def take_signals() -> None:
    """SIGTERM, and SIGHUP (a closed terminal, an SSH session dropped: the services run
    in sessions of their own, which the hangup does not reach), stop the command as
    Ctrl-C does; one the process was started ignoring (``nohup``) stays ignored, as
    Python leaves an ignored SIGINT."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _stops)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["sandbox"]:
        # argparse's REMAINDER takes no argument that begins with "-": `trove sandbox
        # --fediverse 40` was refused as an unknown option of trove's own.
        args = argparse.Namespace(command="sandbox", rest=argv[1:])
    else:
        args = parser().parse_args(argv)
    take_signals()
    try:
        check_environment()
        settings = CommonSettings()
        commands = {
            "crawl": cmd_crawl,
            "seed": cmd_seed,
            "status": cmd_status,
            "search": cmd_search,
            "dead": cmd_dead,
            "domain": cmd_domain,
            "follow": cmd_follow,
            "unfollow": cmd_follow,
            "instances": cmd_instances,
            "exclude": cmd_exclusions,
            "include": cmd_exclusions,
            "exclusions": cmd_exclusions,
        }
        if args.command in commands:
            return asyncio.run(_stops.run(commands[args.command](args, settings)))
        sync = {"up": cmd_up, "migrate": cmd_migrate, "sandbox": cmd_sandbox, "replay": cmd_replay}
        return sync[args.command](args, settings)
    except UnknownSetting as exc:  # as a refused value, and as the services say it
        console.print(Text(f"error: settings: {exc}", "red"))
        return 2
    except TroveError as exc:  # as text: a server's log lines ("[123] LOG: ...") are no markup
        console.print(Text.assemble(("error:", "red"), f" {exc}"))
        return 1
    except (sa_exc.DBAPIError, sa_exc.ArgumentError, sa_exc.NoSuchModuleError) as exc:
        # The database's answer, or its URL not one SQLAlchemy can use: said once, no
        # traceback (``trove search``, ``instances``, ``domain``, ``migrate``).
        console.print(Text(f"error: the database: {str(exc).splitlines()[0]}", "red"))
        return 1
    except ModuleNotFoundError as exc:  # postgresql:// names a driver Trove does not use
        console.print(Text(f"error: {exc}: the database URL is postgresql+asyncpg://…", "red"))
        return 1
    except OSError as exc:  # a server refused or unreachable, a file missing
        # A connect's timeout says nothing of itself.
        reason = str(exc) or "no answer in time"
        console.print(Text(f"error: {type(exc).__name__}: {reason}", "red"))
        return 1
    except nats.errors.Error as exc:
        # nats-server answers but cannot serve the command: JetStream not enabled, no
        # meta leader while a cluster elects one, an account without JetStream.
        reason = str(exc).strip() or "no reason given"
        console.print(Text(f"error: NATS: {type(exc).__name__}: {reason}", "red"))
        return 1
    except pydantic.ValidationError as exc:  # a TROVE_* value that does not parse
        console.print(Text(f"error: settings: {settings_problem(exc)}", "red"))
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
