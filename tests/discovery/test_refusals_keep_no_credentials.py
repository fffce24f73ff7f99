"""A refused seed or follow is logged and recorded for good: the password or token in
its URL is not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import StackUrls, eventually
from tests.discovery.follow_support import ask, commands_handled, recorded
from tests.support import services
from trove_discovery.follows import parse_command
from trove_discovery.replies import MAX_RAW_LENGTH, Refused
from trove_discovery.seeds import parse_seeds, reply_json
from trove_schema.bus import Bus
from trove_schema.events import SeedRejected
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import FOLLOW_SUBJECT, SEEDS_SUBJECT

# Every field the parsers read is given, so TROVE_* in the environment cannot leak in.
SETTINGS = DiscoverySettings(
    max_url_length=2048, allowed_networks=(), default_scope="host", max_depth=5
)


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("http://admin:hunter2@192.168.1.1/", "http://***@192.168.1.1/"),
        ("https://hunter2token@10.0.0.1", "https://***@10.0.0.1"),
        ("http://:hunter2@10.0.0.1/", "http://***@10.0.0.1/"),
        # urlsplit finds the host after the last "@": all before it is the password.
        ("http://admin:hunt@er2@10.0.0.1/a@b", "http://***@10.0.0.1/a@b"),
        ("http://admin:hun ter2@10.0.0.1/", "http://***@10.0.0.1/"),
        # canonicalize reads backslashes as slashes; JSON may escape its slashes.
        ("http:\\\\admin:hunter2@10.0.0.1", "http:\\\\***@10.0.0.1"),
        ('["http:\\/\\/admin:hunter2@10.0.0.1"]', '["http:\\/\\/***@10.0.0.1"]'),
        (
            "https://admin:hunter2@social.example tag:python",
            "https://***@social.example tag:python",
        ),
        ("mailto:admin@example.org", "mailto:admin@example.org"),
        ("https://social.example/@alice", "https://social.example/@alice"),
        # A password's "/", "?" or "#" ends the authority early ("admin:Zm9v" is no
        # host:port): masked to the last "@" of its word.
        ("https://admin:Zm9v/YmFy@example.org/", "https://***@example.org/"),
        ("https://admin:12345678/x@h.org/", "https://***@h.org/"),
        ("https://a:p?w@h/ https://b:c#d@i", "https://***@h/ https://***@i"),
        (
            "http://[::1]/@x https://example.org:8080/a@b",
            "http://[::1]/@x https://example.org:8080/a@b",
        ),
    ],
)
def test_a_refusal_keeps_no_credentials(sent: str, kept: str) -> None:
    assert Refused(sent, "because").raw == kept


@pytest.mark.parametrize("password", ["hunter2" * 10, "S3cretPassw0rd/xyz"])
def test_a_password_the_cut_goes_through_is_masked_too(password: str) -> None:
    sent = "x" * (MAX_RAW_LENGTH - 20) + "http://admin:" + password + "@10.0.0.1/"
    raw = Refused(sent, "because").raw
    assert raw == "x" * (MAX_RAW_LENGTH - 20) + "http://***@"
    assert password[:4] not in raw


def test_refused_seeds_and_follows_keep_no_credentials() -> None:
    seeds = parse_seeds(
        b"http://admin:hunter2@192.168.1.1/\nftp://admin:hunter2@example.org/",
        origin="trove.seeds",
        settings=SETTINGS,
    )
    assert [seed.raw for seed in seeds.rejected] == [
        "http://***@192.168.1.1/",
        "ftp://***@example.org/",
    ]
    # An accepted seed's reply says what was sent, without its password.
    accepted = parse_seeds(
        b"https://admin:hunter2@example.org/\nhttps:" + b"\\" * 2 + b"admin:hunter2@example.org/x",
        origin="trove.seeds",
        settings=SETTINGS,
    )
    assert len(accepted.accepted) == 2
    assert b"hunter2" not in reply_json(accepted)
    # A password with a "/": the URL is refused for its "port", which is not quoted.
    for password in ("Zm9v/YmFy", "12345678/x"):
        sent = f"https://admin:{password}@example.org/".encode()
        (cut,) = parse_seeds(sent, origin="trove.seeds", settings=SETTINGS).rejected
        assert password[:4] not in f"{cut.raw} {cut.reason}", cut
        assert "port is not a number" in cut.reason
    follows = parse_command(
        b"https://admin:hunter2@social.example", verb="follow", settings=SETTINGS
    )
    (refused,) = follows.rejected
    assert (refused.raw, refused.reason) == (
        "https://***@social.example",
        "an instance URL carries no credentials",
    )


@pytest.mark.usefixtures("clean")
async def test_a_refused_seed_or_follow_is_recorded_and_logged_without_its_password(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    log = state_dir / "logs" / "discovery-0.log"

    async def logged() -> str:
        return log.read_text() if log.exists() else ""

    async with services(stack, state_dir, {}, only=("discovery",)):
        seed_reply = await ask(stack, SEEDS_SUBJECT, b"http://admin:hunter2@192.168.1.1/")
        follow_reply = await ask(stack, FOLLOW_SUBJECT, b"https://admin:hunter2@social.example")
        rejections = await eventually(
            lambda: recorded(bus, SeedRejected),
            until=lambda found: len({event.raw for event in found}) == 2,
            timeout=30,
            what="both refusals recorded",
        )
        await commands_handled(bus)
        text = await eventually(
            logged,
            until=lambda text: "seed rejected" in text and "follow refused" in text,
            timeout=30,
            what="the refusals logged",
        )
    reasons = {event.raw: event.reason for event in rejections}
    assert set(reasons) == {"http://***@192.168.1.1/", "https://***@social.example"}
    assert "host 192.168.1.1 is a private address" in reasons["http://***@192.168.1.1/"]
    assert reasons["https://***@social.example"].startswith("follow refused: ")
    assert "http://***@192.168.1.1/" in seed_reply
    assert "https://***@social.example" in follow_reply
    refusals = [
        entry
        for entry in (json.loads(line) for line in text.splitlines() if line.startswith("{"))
        if entry.get("message") in ("seed rejected", "follow refused")
    ]
    assert {entry["raw"] for entry in refusals} == {
        "http://***@192.168.1.1/",
        "https://***@social.example",
    }
    assert "hunter2" not in text
