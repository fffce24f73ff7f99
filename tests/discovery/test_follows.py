"""Following instances: the commands parse or are refused with a reason; a follow starts
one chain of polls, however often it is sent."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import StackUrls, eventually
from tests.discovery.follow_support import (
    BusyReplicas,
    SchedulingBus,
    ask,
    commands_handled,
    pending_poll,
    poll_due_now,
    recorded,
)
from tests.support import send, services
from trove_discovery.follows import (
    MAX_INSTANCES_PER_MESSAGE,
    CommandBatch,
    Follows,
    FollowStore,
    TimelineFollow,
    Verb,
    parse_command,
    reply_json,
    reply_text,
    resume_polls,
    with_timeline,
)
from trove_schema.bus import Bus, Retry
from trove_schema.events import (
    MAX_RECENT_POSTS,
    InstanceFollowed,
    SeedRejected,
    TimelinePollRequested,
)
from trove_schema.exclusions import Exclusions
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import (
    FOLLOW_SUBJECT,
    FOLLOWS_BUCKET,
    UNFOLLOW_SUBJECT,
)

INSTANCE = "https://social.example"


def parse(data: str, verb: Verb = "follow", **overrides: Any) -> CommandBatch:
    # Every field the parser reads is given, so TROVE_* in the environment cannot leak in.
    values: dict[str, Any] = {"max_url_length": 2048, "allowed_networks": ()}
    settings = DiscoverySettings(**(values | overrides))
    return parse_command(data.encode(), verb=verb, settings=settings)


def only_reason(batch: CommandBatch) -> str:
    assert not batch.accepted, batch.accepted
    (rejected,) = batch.rejected
    return rejected.reason


def test_a_plain_url_follows_the_local_timeline_of_its_origin() -> None:
    (command,) = parse("  https://Social.Example:443/ \n").accepted
    assert (command.instance, command.domain, command.timeline) == (
        INSTANCE,
        "social.example",
        "local",
    )
    assert (command.max_depth, command.priority, command.backfill) == (0, 0, 40)


def test_lines_may_name_a_timeline_and_json_sets_the_options() -> None:
    lines = parse(
        f"# instances\r\n{INSTANCE} tag:python\n\nhttps://b.example public\n"
        "https://c.example\tlocal\n"  # a tab, pasted from a sheet: the URL parser drops it
        "https://d.example\u2028public\r"  # whitespace, not a line's end (str.splitlines')
        "https://e.example local\n"  # after a lone CR, as in a seed message
    )
    assert [(c.instance, c.timeline) for c in lines.accepted] == [
        (INSTANCE, "tag:python"),
        ("https://b.example", "public"),
        ("https://c.example", "local"),
        ("https://d.example", "public"),
        ("https://e.example", "local"),
    ]
    assert lines.rejected == ()
    body = {
        "instances": [INSTANCE, "http://c.example:8080"],
        "timeline": "public",
        "max_depth": 2,
        "priority": 7,
        "backfill": 0,
    }
    batch = parse(json.dumps(body))
    assert [
        (c.instance, c.timeline, c.max_depth, c.priority, c.backfill) for c in batch.accepted
    ] == [
        (INSTANCE, "public", 2, 7, 0),
        ("http://c.example:8080", "public", 2, 7, 0),
    ]
    assert [c.instance for c in parse(json.dumps([INSTANCE])).accepted] == [INSTANCE]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ("ftp://social.example", "not http or https"),
        (f"{INSTANCE}/@alice", "an instance is an origin"),
        (f"{INSTANCE}/?local=true", "an instance is an origin"),
        ("https://alice:secret@social.example", "no credentials"),
        # A backslash is a slash, as in a browser: a path, however odd what follows.
        ("https://social.example\\[", "an instance is an origin"),
        ("https://social.example\\]x", "an instance is an origin"),
        ("http://1e1.com\\\uff0f", "an instance is an origin"),
        ("https://10.0.0.1", "private address"),
        ("http://localhost:3000", "private address"),
        (f"{INSTANCE} tag:no-dashes", '"timeline" must be "local", "public" or "tag:NAME"'),
        (f"{INSTANCE} home", '"timeline" must be'),
        (json.dumps({"instance": INSTANCE, "timelines": "local"}), "unknown key(s) 'timelines'"),
        (json.dumps({"instance": INSTANCE, "timeline": None}), '"timeline" must be'),
        ('{"instance": "https://social.example/\\ud800"}', "lone surrogate"),
        (json.dumps({"instance": INSTANCE, "max_depth": 101}), '"max_depth" must be an integer'),
        (json.dumps({"instance": INSTANCE, "backfill": True}), '"backfill" must be an integer'),
        (json.dumps({"instance": INSTANCE, "instances": []}), "exactly one of"),
        ('{"instance": ', "malformed JSON"),
        ("", "empty follow message"),
        ("# nothing\n", "no instances"),
    ],
)
def test_each_bad_follow_is_refused_with_its_reason(data: str, reason: str) -> None:
    assert reason in only_reason(parse(data))


def test_a_private_instance_is_accepted_inside_the_allowed_networks() -> None:
    batch = parse("http://127.0.0.40:8080", allowed_networks=("127.0.0.0/8",))
    assert [c.instance for c in batch.accepted] == ["http://127.0.0.40:8080"]


def test_an_excluded_instance_cannot_be_followed_but_can_be_unfollowed() -> None:
    settings = DiscoverySettings(max_url_length=2048, allowed_networks=())
    rules = Exclusions.of(["example"])
    refused = parse_command(INSTANCE.encode(), verb="follow", settings=settings, exclusions=rules)
    assert only_reason(refused) == "host social.example is excluded by the operator (example)"
    left = parse_command(INSTANCE.encode(), verb="unfollow", settings=settings, exclusions=rules)
    assert [c.instance for c in left.accepted] == [INSTANCE]


def test_an_instance_followed_inside_the_allowed_networks_can_be_unfollowed_outside() -> None:
    # The networks narrowed since the follow: its polls would go on, at their longest
    # pause, with no command left to end them.
    before = DiscoverySettings(max_url_length=2048, allowed_networks=("10.0.0.0/8",))
    followed = parse_command(b"http://10.1.1.1", verb="follow", settings=before)
    assert [c.instance for c in followed.accepted] == ["http://10.1.1.1"]
    now = DiscoverySettings(max_url_length=2048, allowed_networks=())
    refused = parse_command(b"http://10.1.1.1", verb="follow", settings=now)
    assert "private address" in only_reason(refused)
    left = parse_command(b"http://10.1.1.1", verb="unfollow", settings=now)
    assert [c.instance for c in left.accepted] == ["http://10.1.1.1"]


def test_a_tag_is_one_timeline_whatever_its_case() -> None:
    (command,) = parse(f"{INSTANCE} tag:SmallWeb").accepted
    assert command.timeline == "tag:smallweb"
    (command,) = parse(json.dumps({"instance": INSTANCE, "timeline": "tag:IndieWeb"})).accepted
    assert command.timeline == "tag:indieweb"


@pytest.mark.usefixtures("clean")
async def test_a_tag_followed_in_two_cases_is_one_chain_and_one_unfollow_stops_it(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    """Hashtags match whatever their case: one chain, also for a follow an older
    release kept as it was written."""
    store = FollowStore(await bus.js.key_value(FOLLOWS_BUCKET))
    other = "https://other.example"
    legacy = TimelineFollow(follow_id="legacy-follow", followed_at=datetime.now(UTC))
    await store.write(with_timeline((await store.read(other))[0], "tag:Python", legacy), None)
    async with services(stack, state_dir, {}, only=("discovery",)):
        await send(
            stack,
            FOLLOW_SUBJECT,
            f"{INSTANCE} tag:Python".encode(),
            f"{INSTANCE} tag:python".encode(),
            f"{other} tag:python".encode(),
        )
        await send(stack, UNFOLLOW_SUBJECT, f"{other} tag:PYTHON".encode())
        await commands_handled(bus, "the follows handled")
        followed = await recorded(bus, InstanceFollowed)
        record, _ = await store.read(other)
    assert [(f.instance, f.timeline) for f in followed] == [(INSTANCE, "tag:python")]
    assert list(record.timelines) == ["tag:Python"]
    assert not record.timelines["tag:Python"].following


def test_an_unfollow_without_a_timeline_means_every_timeline_and_takes_no_options() -> None:
    (command,) = parse(INSTANCE, "unfollow").accepted
    assert command.timeline is None
    (command,) = parse(f"{INSTANCE} tag:python", "unfollow").accepted
    assert command.timeline == "tag:python"
    body = json.dumps({"instance": INSTANCE, "max_depth": 1})
    assert "unknown key(s) 'max_depth'" in only_reason(parse(body, "unfollow"))


def test_instances_beyond_the_per_message_limit_are_refused_together() -> None:
    # One refusal each would be a log line each: half a million for a megabyte of lines.
    lines = [f"https://i{n}.example" for n in range(MAX_INSTANCES_PER_MESSAGE + 500)]
    batch = parse("\n".join(lines))
    assert len(batch.accepted) == MAX_INSTANCES_PER_MESSAGE
    reason = f"more than {MAX_INSTANCES_PER_MESSAGE} instances in one message"
    assert [(r.raw, r.reason) for r in batch.rejected] == [
        (lines[MAX_INSTANCES_PER_MESSAGE], f"{reason}: 500 from this one on not read")
    ]


def test_replies_say_what_was_accepted_and_why_not() -> None:
    batch = parse(f"{INSTANCE}\nftp://nope.example\n{INSTANCE}/@bob")
    text = reply_text(batch)
    assert text.startswith(f"following 1: {INSTANCE} local\nrejected 2:")
    assert "ftp://nope.example — scheme 'ftp' is not http or https" in text
    assert "/@bob" in text
    body = json.loads(reply_json(parse(json.dumps({"instance": INSTANCE, "timeline": "public"}))))
    assert body["accepted"] == [
        {
            "instance": INSTANCE,
            "timeline": "public",
            "original": INSTANCE,
            "max_depth": 0,
            "priority": 0,
            "backfill": 40,
        }
    ]
    assert reply_text(parse(INSTANCE, "unfollow")) == f"unfollowing 1: {INSTANCE} (every timeline)"


@pytest.mark.usefixtures("clean")
async def test_a_follow_starts_one_chain_of_polls_however_often_it_is_sent(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    async with services(stack, state_dir, {}, only=("discovery",)):
        await send(stack, FOLLOW_SUBJECT, INSTANCE.encode())
        requests = await eventually(
            lambda: recorded(bus, TimelinePollRequested), until=bool, timeout=30, what="a poll"
        )
        (followed,) = await recorded(bus, InstanceFollowed)
        # Again, as a line with the same timeline, and as JSON with other options.
        await send(
            stack,
            FOLLOW_SUBJECT,
            f"{INSTANCE} local\n".encode(),
            json.dumps({"instance": INSTANCE, "priority": 9}).encode(),
        )
        await commands_handled(bus, "the follows handled")
        assert await recorded(bus, InstanceFollowed) == [followed]
        assert await recorded(bus, TimelinePollRequested) == requests
        record, _ = await FollowStore(await bus.js.key_value(FOLLOWS_BUCKET)).read(INSTANCE)
    (request,) = requests
    assert (followed.instance, followed.domain, followed.timeline) == (
        INSTANCE,
        "social.example",
        "local",
    )
    assert followed.provenance.origin == FOLLOW_SUBJECT
    assert (request.follow_id, request.poll, request.cursor, request.backfill) == (
        followed.id,
        1,
        None,
        40,
    )
    assert record.timelines["local"].follow_id == followed.id
    assert record.timelines["local"].priority == 0
    # The first poll fired: nothing is pending on the timeline's schedule subject.
    assert await pending_poll(bus, INSTANCE, "local") is None


@pytest.mark.usefixtures("clean")
async def test_a_follow_request_is_answered_and_refusals_follow_nothing(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    payload = f"{INSTANCE} public\nhttps://10.1.2.3\n{INSTANCE}/about\n".encode()
    async with services(stack, state_dir, {}, only=("discovery",)):
        text = await ask(stack, FOLLOW_SUBJECT, payload)
        structured = await ask(
            stack, FOLLOW_SUBJECT, json.dumps({"instance": INSTANCE, "timeline": "bad"}).encode()
        )
        await commands_handled(bus, "the requests handled")
        followed = await recorded(bus, InstanceFollowed)
        refused = await recorded(bus, SeedRejected)
    assert text.splitlines()[0] == f"following 1: {INSTANCE} public"
    assert "https://10.1.2.3 — host 10.1.2.3 is a private address" in text
    assert "an instance is an origin" in text
    body = json.loads(structured)
    assert (body["accepted_count"], body["rejected_count"]) == (0, 1)
    assert '"timeline" must be' in body["rejected"][0]["reason"]
    # Requests are stored like publishes: each request that stood (the first, once
    # retried until discovery answered) is followed, the refused ones are not.
    assert {(e.instance, e.timeline) for e in followed} == {(INSTANCE, "public")}
    assert len(followed) == 1
    # Each refusal is recorded too, as a refused seed is: a plain publish has no answer.
    assert {(e.raw, e.reason.split(":")[0]) for e in refused} == {
        ("https://10.1.2.3", "follow refused"),
        (f"{INSTANCE}/about", "follow refused"),
        (json.dumps({"instance": INSTANCE, "timeline": "bad"}), "follow refused"),
    }


@pytest.mark.usefixtures("clean")
async def test_a_follow_redelivered_after_its_chain_began_leaves_the_chain_alone(
    bus: Bus,
) -> None:
    """Its ack lost and redelivered past the record's duplicate window, the command's
    first poll would replace the chain's pending one, and its answer be stale."""
    # Far past the seeds stream's own sequence, which purges keep: the ids derived
    # from it are then this test's alone, in the record's duplicate window too.
    seq = 10**9
    spy = SchedulingBus(bus.nc, bus.js)
    spy.scheduled = []
    store = FollowStore(await bus.js.key_value(FOLLOWS_BUCKET))
    follows = Follows(bus=spy, store=store, settings=DiscoverySettings())
    (command,) = parse(INSTANCE).accepted
    assert await follows.follow(command, place=str(seq), origin=FOLLOW_SUBJECT)
    # Redelivered before any poll was handled: the first poll again (the record drops
    # the copy within its window, and it replaces the same first poll after it).
    assert await follows.follow(command, place=str(seq), origin=FOLLOW_SUBJECT)
    assert [r.poll for r in spy.scheduled] == [1, 1]
    record, revision = await store.read(INSTANCE)
    under_way = record.timelines["local"].model_copy(update={"poll": 3})
    await store.write(with_timeline(record, "local", under_way), revision)
    assert await follows.follow(command, place=str(seq), origin=FOLLOW_SUBJECT)
    assert [r.poll for r in spy.scheduled] == [1, 1]


@pytest.mark.usefixtures("clean")
async def test_a_command_whose_writes_keep_losing_to_other_replicas_is_handed_back(
    bus: Bus,
) -> None:
    """Replicas busy with the same instance are infrastructure, not a bad command: the
    command waits and comes again, where a failure would park it after five."""
    seq = 10**9 + 100
    instance = "https://busy.example"
    spy = SchedulingBus(bus.nc, bus.js)
    spy.scheduled = []
    kv = await bus.js.key_value(FOLLOWS_BUCKET)
    busy = Follows(bus=spy, store=BusyReplicas(kv), settings=DiscoverySettings())
    (follow,) = parse(instance).accepted
    with pytest.raises(Retry, match="kept changing"):
        await busy.follow(follow, place=str(seq), origin=FOLLOW_SUBJECT)
    calm = Follows(bus=spy, store=FollowStore(kv), settings=DiscoverySettings())
    assert await calm.follow(follow, place=str(seq), origin=FOLLOW_SUBJECT)
    (unfollow,) = parse(instance, verb="unfollow").accepted
    with pytest.raises(Retry, match="kept changing"):
        await busy.unfollow(unfollow, place=str(seq + 1), origin=UNFOLLOW_SUBJECT)
    assert await calm.unfollow(unfollow, place=str(seq + 1), origin=UNFOLLOW_SUBJECT) == ["local"]


@pytest.mark.usefixtures("clean")
async def test_a_follow_record_with_more_recent_ids_than_this_release_keeps_still_polls(
    bus: Bus,
) -> None:
    # Written by a release with a higher limit, then rolled back: the poll request is
    # built from the newest ids this one keeps, not refused at every try.
    recent = [str(n) for n in range(2 * MAX_RECENT_POSTS)]
    written = {
        "follow_id": "follow-1",
        "followed_at": "2026-01-01T00:00:00Z",
        "poll": 7,
        "cursor": "900",
        "recent": recent,
    }
    follow = TimelineFollow.model_validate_json(json.dumps(written))
    await resume_polls(
        bus, "https://social.example", "social.example", "local", follow, id="poll-8"
    )
    request = await poll_due_now(bus, "https://social.example", "local")
    assert request.recent == tuple(recent[-MAX_RECENT_POSTS:])


@pytest.mark.usefixtures("clean")
async def test_a_resumed_chain_carries_the_backfill_left_and_its_pages_refused(bus: Bus) -> None:
    # A chain resumed from its progress record reads on back where it was, with the
    # refusals it counted: not from the newest posts, nor with a count started again.
    written = {
        "follow_id": "follow-1",
        "followed_at": "2026-01-01T00:00:00Z",
        "poll": 7,
        "cursor": "900",
        "back_from": "700",
        "back_left": 12,
        "back_failures": 2,
    }
    follow = TimelineFollow.model_validate_json(json.dumps(written))
    # Its own instance and request id: the events stream drops an id seen before.
    await resume_polls(
        bus, "https://backfill.example", "backfill.example", "local", follow, id="backfill-8"
    )
    request = await poll_due_now(bus, "https://backfill.example", "local")
    assert (request.back_from, request.back_left, request.back_failures) == ("700", 12, 2)
