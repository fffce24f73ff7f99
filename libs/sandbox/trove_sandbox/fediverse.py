"""A synthetic fediverse instance: NodeInfo, a Mastodon client API subset and ActivityPub.

People on the instance share links to the pages of a ``SandboxWeb``; the model
knows which of those links a polite follower of the instance may take (public
posts of accounts that did not opt out) and which it must leave alone, so tests
compare what a follower found against ground truth. Test hooks add posts over
time, opt accounts out, rate-limit the API and make it misbehave.
"""

from __future__ import annotations

import bisect
import contextlib
import html
import itertools
import json
import math
import os
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from email.utils import formatdate
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit

from trove_sandbox.response import Headers, Response, not_found, ok, redirect
from trove_sandbox.server import SiteServer, Witness
from trove_sandbox.texts import LANGUAGE_ORDER, TEXTS
from trove_sandbox.web import SandboxWeb

INSTANCE_HOST = "social.trove.test"
INSTANCE_IP = "127.0.0.30"
#: Where remote accounts live; never served, so nothing on it can be fetched.
REMOTE_HOST = "elsewhere.trove.test"
DEFAULT_LIMIT = 20
MAX_LIMIT = 40
#: Size of the answer of a huge API page (``misbehave("huge")``).
HUGE_API_BYTES = 8 * 1024 * 1024
AS_PUBLIC = "https://www.w3.org/ns/activitystreams#Public"
NODEINFO_SCHEMA = "http://nodeinfo.diaspora.software/ns/schema/"

JSON = "application/json; charset=utf-8"
ACTIVITY_JSON = "application/activity+json; charset=utf-8"

Visibility = Literal["public", "unlisted", "private", "direct"]
OptOut = Literal["indexable", "noindex", "discoverable"]
#: ``wrong-types``: statuses with ids as numbers, null content, junk entries;
#: ``html``: an HTML page with status 200; ``endless``: older pages that are the
#: newest page again forever (``max_id`` ignored, and a next Link that leads to it);
#: ``bottomless``: next Links that always reach older (invented) posts;
#: ``redirect``: a 302 off the instance; ``huge``: a page of ``HUGE_API_BYTES``;
#: ``odd-ids``: the page's newest statuses given an id of letters and an id of 250
#: digits, the others as they are; ``renumbered``: every id spelt as text that sorts
#: before any number (other software on the same domain: GoToSocial's ULIDs), and an
#: id parameter of digits read as such text; ``text-ids-after-cursor``: ids as text only
#: on pages asked for with ``min_id``, ``text-ids-behind-cursor`` only on pages asked
#: for with both ``since_id`` and ``max_id``; ``since-links``: prev Links that read on with
#: ``since_id`` (Mastodon before 2.6: the newest posts, not the next ones),
#: ``skipping-links`` with a ``min_id`` a page past the page; ``ignores-lookback``: a
#: query with both ``since_id`` and ``max_id`` answered with the newest posts;
#: ``lookback-422`` / ``lookback-429``: that query refused so; ``old-posts-502`` /
#: ``old-posts-429``: a query with ``max_id`` alone (reading back) refused so,
#: ``old-posts-challenge`` with a CDN's bot challenge sent as a 429, ``old-posts-cut``
#: with a connection reset a few bytes into its answer, ``old-posts-loop`` with a
#: redirect to itself.
Misbehaviour = Literal[
    "wrong-types",
    "html",
    "endless",
    "bottomless",
    "redirect",
    "huge",
    "odd-ids",
    "new-posts-502",
    "links-unscoped",
    "renumbered",
    "text-ids-after-cursor",
    "text-ids-behind-cursor",
    "since-links",
    "skipping-links",
    "ignores-lookback",
    "lookback-422",
    "lookback-429",
    "old-posts-502",
    "old-posts-429",
    "old-posts-challenge",
    "old-posts-cut",
    "old-posts-loop",
]

_LOCAL_NAMES = ("ada", "bruno", "chiara", "dmitri", "elif", "femi", "greta", "hiro")
_REMOTE_NAMES = ("ines", "jonas")
_TAGS = ("smallweb", "indieweb", "blogging", "gardening", "bikes", "bread", "rivers")
_BASE_TIME = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
_ACCOUNT_TIME = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
_OPT_OUTS: dict[int, OptOut] = {3: "indexable", 5: "noindex", 6: "discoverable"}
_VISIBILITIES: tuple[Visibility, ...] = ("public", "unlisted", "private", "direct")
_SHELL_SCRIPTS = ("/packs/js/common.js", "/packs/js/locale/en.js", "/packs/js/application.js")


@dataclass(slots=True, frozen=True)
class Account:
    """A person on the instance (``domain`` None) or on a remote one."""

    username: str
    display_name: str
    language: str
    index: int
    domain: str | None = None
    discoverable: bool = True
    indexable: bool = True
    noindex: bool = False

    @property
    def acct(self) -> str:
        """``name`` for a local account, ``name@domain`` for a remote one (Mastodon's acct)."""
        return self.username if self.domain is None else f"{self.username}@{self.domain}"

    @property
    def local(self) -> bool:
        return self.domain is None

    @property
    def opted_out(self) -> bool:
        """True when the account asked not to be indexed in any of the three ways."""
        return not self.indexable or self.noindex or not self.discoverable

    @property
    def id(self) -> str:
        return str(_snowflake(_ACCOUNT_TIME + timedelta(days=self.index), self.index))


@dataclass(slots=True, frozen=True)
class SharedLink:
    """A link in a post: a page of the sandbox web (``host``, ``path``) or, with
    ``host`` empty, the absolute URL in ``path``."""

    host: str
    path: str


@dataclass(slots=True, frozen=True)
class Card:
    """A post's preview card: the page Mastodon fetched to draw the link preview."""

    link: SharedLink
    title: str
    description: str


@dataclass(slots=True, frozen=True)
class Status:
    """One post, as data; URLs are made when it is served (the port is known then)."""

    id: int
    account: str
    created_at: datetime
    visibility: Visibility
    language: str
    text: str
    links: tuple[SharedLink, ...] = ()
    card: Card | None = None
    #: Paths on the instance itself the post links to (another post, the about page).
    own_links: tuple[str, ...] = ()
    mentions: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    sensitive: bool = False
    spoiler_text: str = ""
    media: bool = False

    @property
    def sid(self) -> str:
        """The id as the API gives it: a string."""
        return str(self.id)


class FediverseInstance:
    """A seeded, reproducible Mastodon-like instance that is also its own ground truth.

    Mutable only through the test hooks (``add_post``, ``opt_out``, ``opt_in``,
    ``throttle``, ``misbehave``, ``make_unreadable``, ``make_undecodable``,
    ``fail_nodeinfo``, ``set_robots``) and the port the server binds.
    """

    __slots__ = (
        "_accounts",
        "_huge",
        "_misbehaviour",
        "_nodeinfo_failure",
        "_nodeinfo_retry_after",
        "_numbered",
        "_port",
        "_rate_limit",
        "_rate_used",
        "_rate_window",
        "_rate_window_start",
        "_redirect_to",
        "_rng",
        "_robots",
        "_software",
        "_statuses",
        "_throttle",
        "_undecodable",
        "_unreadable",
        "clock_ahead",
        "host",
        "ip",
        "page_cap",
        "resets",
        "web",
    )

    def __init__(
        self,
        accounts: Iterable[Account],
        statuses: Iterable[Status],
        *,
        web: SandboxWeb,
        seed: int,
        host: str = INSTANCE_HOST,
        ip: str = INSTANCE_IP,
        port: int = 0,
        software: tuple[str, str] = ("mastodon", "4.3.0"),
        rate_limit: int = 300,
        rate_window: float = 300.0,
    ) -> None:
        self.web = web
        self.host = host
        self.ip = ip
        self._port = port
        self._accounts: dict[str, Account] = {a.acct: a for a in accounts}
        self._statuses: list[Status] = sorted(statuses, key=lambda s: s.id)
        self._rng = random.Random(seed)
        self._software = software
        self._rate_limit = rate_limit
        self._rate_window = rate_window
        self._rate_used = 0
        self._rate_window_start = time.monotonic()
        self._throttle: str | None = None
        self._misbehaviour: Misbehaviour | None = None
        #: Ids given by ``add_post_numbered``, not by the time of their post.
        self._numbered: set[int] = set()
        #: How far the instance's clock runs ahead: its timelines' ``Date`` says so.
        self.clock_ahead = 0.0
        #: The most posts a timeline page holds, whatever is asked for (Mastodon's 40;
        #: a server may give fewer).
        self.page_cap = MAX_LIMIT
        #: Each API answer's rate limit: when (``time.time()``) it was answered, the
        #: reset it named (``X-RateLimit-Reset``, on this machine's clock) and the
        #: requests it said were left.
        self.resets: list[tuple[float, float, int]] = []
        self._nodeinfo_failure: int | None = None
        self._nodeinfo_retry_after: int | None = None
        self._unreadable: set[int] = set()
        #: Posts a timeline page carries in Latin-1 (``make_undecodable``).
        self._undecodable: set[int] = set()
        self._redirect_to = f"http://{REMOTE_HOST}/api/v1/timelines/public"
        self._robots: str | None = None
        self._huge: bytes | None = None

    # ------------------------------------------------------------------ building

    @classmethod
    def generate(
        cls,
        web: SandboxWeb | None = None,
        posts: int = 60,
        seed: int = 7,
        *,
        host: str = INSTANCE_HOST,
        ip: str = INSTANCE_IP,
        port: int = 0,
        software: tuple[str, str] = ("mastodon", "4.3.0"),
        rate_limit: int = 300,
        rate_window: float = 300.0,
    ) -> FediverseInstance:
        """Build the instance for ``seed``, its posts sharing pages of ``web``.

        Without ``web`` a small ``SandboxWeb`` of the same seed is made (its
        URLs carry no port unless it is served).
        """
        if posts < 0:
            raise ValueError("posts must be >= 0")
        if not ip.startswith("127."):
            raise ValueError(f"the instance must listen inside 127.0.0.0/8, not {ip}")
        if web is None:
            web = SandboxWeb.generate(hosts=3, pages_per_host=4, seed=seed)
        accounts = [
            Account(
                username=name,
                display_name=name.capitalize(),
                language=LANGUAGE_ORDER[i % len(LANGUAGE_ORDER)],
                index=i,
                discoverable=_OPT_OUTS.get(i) != "discoverable",
                indexable=_OPT_OUTS.get(i) != "indexable",
                noindex=_OPT_OUTS.get(i) == "noindex",
            )
            for i, name in enumerate(_LOCAL_NAMES)
        ]
        accounts.extend(
            Account(
                username=name,
                display_name=name.capitalize(),
                language="en",
                index=len(_LOCAL_NAMES) + j,
                domain=REMOTE_HOST,
            )
            for j, name in enumerate(_REMOTE_NAMES)
        )
        instance = cls(
            accounts,
            (),
            web=web,
            seed=seed,
            host=host,
            ip=ip,
            port=port,
            software=software,
            rate_limit=rate_limit,
            rate_window=rate_window,
        )
        for _ in range(posts):
            instance.add_post()
        return instance

    # ------------------------------------------------------------------ identity

    @property
    def port(self) -> int:
        return self._port

    @port.setter
    def port(self, value: int) -> None:
        self._port = value
        self._huge = None

    @property
    def origin(self) -> str:
        return f"http://{self.host}:{self._port}" if self._port else f"http://{self.host}"

    def url(self, path: str = "/") -> str:
        return self.origin + path

    @property
    def accounts(self) -> tuple[Account, ...]:
        return tuple(self._accounts.values())

    def account(self, acct: str) -> Account:
        return self._accounts[acct]

    @property
    def statuses(self) -> tuple[Status, ...]:
        """Every post, oldest first, whatever its visibility."""
        return tuple(self._statuses)

    def status(self, status_id: int | str) -> Status:
        wanted = int(status_id)
        for status in self._statuses:
            if status.id == wanted:
                return status
        raise KeyError(status_id)

    def status_uri(self, status: Status) -> str:
        """The ActivityPub id of ``status``: ``/users/NAME/statuses/ID`` on its home server."""
        account = self._accounts[status.account]
        return f"{self._home(account)}/users/{account.username}/statuses/{status.id}"

    def status_url(self, status: Status) -> str:
        """The human-facing page of ``status``: ``/@NAME/ID``."""
        account = self._accounts[status.account]
        return f"{self._home(account)}/@{account.username}/{status.id}"

    def actor_uri(self, account: Account) -> str:
        return f"{self._home(account)}/users/{account.username}"

    def profile_url(self, account: Account) -> str:
        return f"{self._home(account)}/@{account.username}"

    def link_url(self, link: SharedLink) -> str:
        return self.web.url(link.host, link.path) if link.host else link.path

    def _home(self, account: Account) -> str:
        return self.origin if account.local else f"http://{account.domain}"

    # ------------------------------------------------------------------ ground truth

    def timeline(self, *, local: bool = True, tag: str | None = None) -> list[Status]:
        """What the public timeline (or a tag's timeline) serves in all, newest first."""
        found = [
            s
            for s in reversed(self._statuses)
            if s.visibility == "public" and (not local or self._accounts[s.account].local)
        ]
        if tag is not None:
            found = [s for s in found if tag.lower() in s.tags]
        return found

    def shared_links(self, status: Status) -> list[str]:
        """The URLs ``status`` shares: the links in its content, then its card's URL.

        Never mentions, hashtags or the instance's own pages. Says nothing of
        whether a follower may take them (see ``expected_links``).
        """
        urls = [self.link_url(link) for link in status.links]
        if status.card is not None:
            urls.append(self.link_url(status.card.link))
        return list(dict.fromkeys(urls))

    def may_share(self, status: Status) -> bool:
        """True for a public post of an account that did not opt out."""
        return status.visibility == "public" and not self._accounts[status.account].opted_out

    def links_by_post(self, *, local: bool = True) -> dict[str, list[str]]:
        """Status id -> the URLs a follower may take from it, for every post that has some."""
        found: dict[str, list[str]] = {}
        for status in self.timeline(local=local):
            urls = self.shared_links(status)
            if urls and self.may_share(status):
                found[status.sid] = urls
        return found

    def expected_links(self, *, local: bool = True) -> dict[str, int]:
        """Each URL a follower of the public timeline may take -> how many posts share it."""
        counts: dict[str, int] = {}
        for urls in self.links_by_post(local=local).values():
            for url in urls:
                counts[url] = counts.get(url, 0) + 1
        return counts

    def forbidden_links(self, *, local: bool = True) -> set[str]:
        """URLs shared only by posts a follower must skip (opted out or not public)."""
        allowed = set(self.expected_links(local=local))
        found: set[str] = set()
        for status in self._statuses:
            if local and not self._accounts[status.account].local:
                continue
            if not self.may_share(status):
                found.update(self.shared_links(status))
        return found - allowed

    def opted_out_posts(self, *, local: bool = True) -> list[Status]:
        """Public-timeline posts whose author opted out, newest first."""
        return [s for s in self.timeline(local=local) if self._accounts[s.account].opted_out]

    def non_public_posts(self) -> list[Status]:
        """Unlisted, followers-only and direct posts: never on a public timeline."""
        return [s for s in reversed(self._statuses) if s.visibility != "public"]

    # ------------------------------------------------------------------ test hooks

    def add_post(
        self,
        account: str | None = None,
        *,
        links: Sequence[str | SharedLink] | None = None,
        visibility: Visibility | None = None,
        card: bool | None = None,
        tags: Sequence[str] | None = None,
    ) -> Status:
        """Publish a post newer than every other one; unset arguments are drawn from the seed.

        ``links`` are absolute URLs or ``SharedLink``s; ``card`` gives the post a
        preview card of its first link.
        """
        rng = self._rng
        locals_ = [a for a in self._accounts.values() if a.local]
        if account is None:
            pool = list(self._accounts.values())
            author = rng.choices(pool, weights=[6 if a.local else 1 for a in pool])[0]
        else:
            author = self._accounts[account]
        if visibility is None:
            visibility = rng.choices(_VISIBILITIES, weights=(70, 12, 10, 8))[0]
            if not author.local:
                # Only public posts of remote people reach the instance unasked.
                visibility = "public"
        newest = self._newest_ordinary()
        last = newest.created_at if newest is not None else _BASE_TIME
        created = last + timedelta(minutes=rng.randint(3, 90), seconds=rng.randint(0, 59))
        if links is None:
            chosen = self._pick_links(rng)
        else:
            chosen = [SharedLink("", link) if isinstance(link, str) else link for link in links]
        make_card = (rng.random() < 0.6) if card is None else card
        preview: Card | None = None
        if chosen and make_card:
            target = chosen[0]
            if target.host and rng.random() < 0.15:
                # The page's canonical URL (og:url) differs from the link posted.
                target = self._canonical_of(target)
            preview = Card(
                link=target,
                title=self._title_of(target),
                description=f"A page on {target.host or 'the web'}",
            )
        others = [a for a in locals_ if a.acct != author.acct]
        mentions = tuple(a.acct for a in rng.sample(others, k=min(len(others), rng.randint(0, 2))))
        if rng.random() < 0.1:
            mentions += (f"{_REMOTE_NAMES[0]}@{REMOTE_HOST}",)
        chosen_tags = (
            tuple(t.lower() for t in tags)
            if tags is not None
            else tuple(rng.sample(_TAGS, k=rng.randint(0, 2)))
        )
        own: tuple[str, ...] = ()
        earlier = [s for s in self._statuses if s.visibility == "public"]
        if author.local and rng.random() < 0.15:
            if earlier and rng.random() < 0.7:
                quoted = rng.choice(earlier)
                own = (f"/@{self._accounts[quoted.account].username}/{quoted.id}",)
            else:
                own = ("/about",)
        text = TEXTS[author.language]
        sensitive = rng.random() < 0.1
        status = Status(
            id=self._next_id(created),
            account=author.acct,
            created_at=created,
            visibility=visibility,
            language=author.language,
            text=rng.choice(text.sentences),
            links=tuple(chosen),
            card=preview,
            own_links=own,
            mentions=mentions,
            tags=chosen_tags,
            sensitive=sensitive,
            spoiler_text=text.topics[0] if sensitive else "",
            media=rng.random() < 0.1,
        )
        # In id order, after any post numbered ahead of its time (``add_post_numbered``).
        bisect.insort(self._statuses, status, key=lambda s: s.id)
        self._huge = None
        return status

    def delete_post(self, status: Status) -> None:
        """``status`` deleted (by its author, a moderator, its account suspended): gone
        from every timeline, its id with it."""
        self._statuses.remove(status)
        self._numbered.discard(status.id)
        self._huge = None

    def add_post_numbered(
        self,
        status_id: int,
        account: str = "ada",
        *,
        tags: Sequence[str] | None = None,
        created_at: datetime | None = None,
    ) -> Status:
        """A public post of ``account`` whose id is ``status_id`` whatever its time: one
        past 64 bits, or a snowflake dated ahead of the instance's clock (a server that
        misbehaves, hosts whose clocks disagree), where that id puts it. ``created_at``:
        when it says it was made (an old post's serial id; else as ``add_post`` says)."""
        status = self.add_post(account, visibility="public", tags=tags)
        self._statuses.remove(status)
        numbered = replace(status, id=status_id, created_at=created_at or status.created_at)
        bisect.insort(self._statuses, numbered, key=lambda s: s.id)
        self._numbered.add(status_id)
        self._huge = None
        return numbered

    def add_late_post(
        self, account: str, *, published_before: timedelta, tags: Sequence[str] | None = None
    ) -> Status:
        """A post of another instance's ``account`` that arrives now, published
        ``published_before`` the newest post: Mastodon gives it the id of its publication
        time (``Mastodon::Snowflake.id_at``), so it lands behind posts already read."""
        newest = self._newest_ordinary()
        assert newest is not None, "a late post comes after others"
        status = self.add_post(account, visibility="public", tags=tags)
        self._statuses.remove(status)
        created = newest.created_at - published_before
        taken = {s.id for s in self._statuses}
        late_id = _snowflake(created, len(self._statuses))
        while late_id in taken:
            late_id += 1
        late = replace(status, id=late_id, created_at=created)
        bisect.insort(self._statuses, late, key=lambda s: s.id)
        self._huge = None
        return late

    def add_posts(self, count: int) -> list[Status]:
        return [self.add_post() for _ in range(count)]

    def opt_out(self, acct: str, how: OptOut = "indexable") -> Account:
        """Make ``acct`` refuse indexing (``indexable: false``, ``noindex: true`` or
        ``discoverable: false``); its posts stay on the public timeline."""
        account = self._accounts[acct]
        if how == "indexable":
            updated = replace(account, indexable=False)
        elif how == "noindex":
            updated = replace(account, noindex=True)
        else:
            updated = replace(account, discoverable=False)
        self._accounts[acct] = updated
        return updated

    def opt_in(self, acct: str) -> Account:
        updated = replace(self._accounts[acct], indexable=True, noindex=False, discoverable=True)
        self._accounts[acct] = updated
        return updated

    def throttle(self, retry_after: int | str | None) -> None:
        """Answer every API request 429 with this Retry-After (None: back to normal)."""
        self._throttle = None if retry_after is None else str(retry_after)

    def misbehave(self, mode: Misbehaviour | None, *, redirect_to: str | None = None) -> None:
        """Make every ``/api/`` answer misbehave in ``mode`` (None: back to normal)."""
        self._misbehaviour = mode
        if redirect_to is not None:
            self._redirect_to = redirect_to

    def make_undecodable(self, status: Status) -> None:
        """Serve ``status`` in every timeline page that holds it with its text in Latin-1,
        not UTF-8: a broken instance's one post, which makes the whole page no JSON."""
        self._undecodable.add(status.id)

    def make_unreadable(self, status: Status) -> None:
        """Serve ``status`` through the API with ``"uri": null``: an entry no client reads."""
        self._unreadable.add(status.id)

    def fail_nodeinfo(self, status: int | None, *, retry_after: int | None = None) -> None:
        """Answer the NodeInfo documents (not their index) with ``status`` (None: as
        normal), and ``Retry-After: retry_after`` when given."""
        self._nodeinfo_failure = status
        self._nodeinfo_retry_after = retry_after

    def set_robots(self, text: str | None) -> None:
        """Serve ``text`` as robots.txt (None restores Mastodon's)."""
        self._robots = text

    def robots_txt(self) -> str:
        if self._robots is not None:
            return self._robots
        return (
            "# See http://www.robotstxt.org/robotstxt.html for documentation on how to use"
            " the robots.txt file\n\n"
            "User-agent: *\nDisallow: /media_proxy/\nDisallow: /interact/\n\n"
            "User-agent: GPTBot\nDisallow: /\n"
        )

    @property
    def rate_limit(self) -> int:
        return self._rate_limit

    # ------------------------------------------------------------------ serving (Site)

    def listen_ips(self) -> list[str]:
        return [self.ip]

    def host_for_ip(self, ip: str) -> str | None:
        return self.host if ip == self.ip else None

    def is_host(self, name: str) -> bool:
        return name.lower().rstrip(".") == self.host

    def respond(self, host: str, path: str, headers: Mapping[str, str]) -> Response:
        """The answer for ``path`` (with query), negotiating ActivityPub by ``Accept``."""
        parts = urlsplit(path)
        bare = parts.path or "/"
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        if bare == "/robots.txt":
            return ok(self.robots_txt(), "text/plain; charset=utf-8")
        if bare.startswith("/api/"):
            return self._api(bare, query)
        if bare == "/.well-known/nodeinfo":
            return _json_response({"links": [
                {"rel": f"{NODEINFO_SCHEMA}2.0", "href": self.url("/nodeinfo/2.0")},
                {"rel": f"{NODEINFO_SCHEMA}2.1", "href": self.url("/nodeinfo/2.1")},
            ]})  # fmt: skip
        if bare in ("/nodeinfo/2.0", "/nodeinfo/2.1"):
            if self._nodeinfo_failure is not None:
                wait = self._nodeinfo_retry_after
                extra = () if wait is None else (("Retry-After", str(wait)),)
                return _json_response(
                    {"error": "Failing"}, status=self._nodeinfo_failure, extra=extra
                )
            return self._nodeinfo(bare.rsplit("/", 1)[1])
        if bare == "/.well-known/webfinger":
            return self._webfinger(query.get("resource", ""))
        wants_ap = _wants_activity_json(headers.get("accept", ""))
        segments = bare.strip("/").split("/")
        if len(segments) in (2, 4) and segments[0] == "users":
            account = self._accounts.get(segments[1])
            if account is None or (len(segments) == 4 and segments[2] != "statuses"):
                return not_found(path)
            if len(segments) == 2:
                return self._actor(account) if wants_ap else self._shell(account)
            return self._status_page(account, segments[3], wants_ap, path)
        if segments[0].startswith("@") and len(segments) in (1, 2):
            account = self._accounts.get(segments[0][1:])
            if account is None:
                return not_found(path)
            if len(segments) == 1:
                return self._actor(account) if wants_ap else self._shell(account)
            return self._status_page(account, segments[1], wants_ap, path)
        if bare in ("/", "/about", "/explore", "/public", "/public/local") or (
            len(segments) == 2 and segments[0] == "tags"
        ):
            return self._shell(None)
        return not_found(path)

    # ------------------------------------------------------------------ the client API

    def _api(self, path: str, query: Mapping[str, str]) -> Response:
        limits = self._rate_headers()
        if self._throttle is not None:
            return _json_response(
                {"error": "Too many requests"},
                status=429,
                extra=(("Retry-After", self._throttle), *_zero_remaining(limits)),
            )
        if int(dict(limits)["X-RateLimit-Remaining"]) < 0:
            retry = max(
                1, math.ceil(self._rate_window_start + self._rate_window - time.monotonic())
            )
            return _json_response(
                {"error": "Too many requests"},
                status=429,
                extra=(("Retry-After", str(retry)), *_zero_remaining(limits)),
            )
        mode = self._misbehaviour
        if mode == "html":
            response = ok(_shell_html(self.host, None), extra=limits)
            return response
        if mode == "redirect":
            moved = redirect(self._redirect_to)
            return replace(moved, headers=moved.headers + limits)
        if path in ("/api/v1/instance", "/api/v2/instance"):
            body = self._instance_v1() if path.endswith("v1/instance") else self._instance_v2()
            return _json_response(body, extra=limits)
        if path.startswith("/api/v1/statuses/"):
            return self._api_status(path.rsplit("/", 1)[1], limits)
        if path == "/api/v1/timelines/public":
            local = _flag(query.get("local")) and not _flag(query.get("remote"))
            posts = self._visible(local=local, remote=_flag(query.get("remote")))
            return self._timeline_response(path, query, posts, limits)
        if path.startswith("/api/v1/timelines/tag/") and path.count("/") == 5:
            tag = path.rsplit("/", 1)[1].lower()
            local = _flag(query.get("local"))
            posts = [s for s in self._visible(local=local, remote=False) if tag in s.tags]
            return self._timeline_response(path, query, posts, limits)
        return _json_response({"error": "Record not found"}, status=404, extra=limits)

    def _rate_headers(self) -> Headers:
        """Count one API request and say what is left of the window, as Mastodon does:
        the reset a time on the instance's own clock, which its ``Date`` tells."""
        now = time.monotonic()
        if now - self._rate_window_start >= self._rate_window:
            self._rate_window_start = now
            self._rate_used = 0
        self._rate_used += 1
        reset_in = self._rate_window_start + self._rate_window - now
        named = time.time()
        self.resets.append((named, named + reset_in, self._rate_limit - self._rate_used))
        reset = datetime.now(UTC) + timedelta(seconds=reset_in + self.clock_ahead)
        return (
            ("X-RateLimit-Limit", str(self._rate_limit)),
            ("X-RateLimit-Remaining", str(self._rate_limit - self._rate_used)),
            ("X-RateLimit-Reset", reset.isoformat(timespec="milliseconds").replace("+00:00", "Z")),
            *self._date(),
        )

    def _visible(self, *, local: bool, remote: bool) -> list[Status]:
        """Public posts, oldest first, of local accounts, remote ones or both."""
        found = []
        for status in self._statuses:
            if status.visibility != "public":
                continue
            is_local = self._accounts[status.account].local
            if (local and not is_local) or (remote and is_local):
                continue
            found.append(status)
        return found

    def _timeline_response(
        self, path: str, query: Mapping[str, str], posts: list[Status], limits: Headers
    ) -> Response:
        limit = min(_limit(query.get("limit")), self.page_cap)
        mode = self._misbehaviour
        read_id = _text_id_param if mode == "renumbered" else _id_param
        max_id = read_id(query.get("max_id"))
        since_id = read_id(query.get("since_id"))
        min_id = read_id(query.get("min_id"))
        if mode == "new-posts-502" and min_id is not None:
            # Overloaded: what is behind a cursor comes from cache, what is new does not.
            return _json_response({"error": "Bad gateway"}, status=502, extra=limits)
        lookback = since_id is not None and max_id is not None
        if mode == "old-posts-502" and max_id is not None and since_id is None:
            # Overloaded the other way: the old pages are what the cache does not hold.
            return _json_response({"error": "Bad gateway"}, status=502, extra=limits)
        if mode == "old-posts-loop" and max_id is not None and since_id is None:
            moved = redirect(self._page_url(path, query, max_id=max_id))
            return replace(moved, headers=moved.headers + limits)
        if mode == "old-posts-cut" and max_id is not None and since_id is None:
            return Response(200, (("Content-Type", JSON), *limits), stream=_cut_short, length=4096)
        if mode == "old-posts-challenge" and max_id is not None and since_id is None:
            return Response(
                429,
                (("Content-Type", "text/html"), ("cf-mitigated", "challenge"), *limits),
                b"<html><title>Just a moment...</title></html>",
            )
        if mode == "old-posts-429" and max_id is not None and since_id is None:
            return _json_response(
                {"error": "Too many requests"}, status=429, extra=(*limits, ("Retry-After", "60"))
            )
        if mode == "lookback-422" and lookback:
            return _json_response({"error": "Invalid pagination"}, status=422, extra=limits)
        if mode == "lookback-429" and lookback:
            return _json_response(
                {"error": "Too many requests"}, status=429, extra=(*limits, ("Retry-After", "60"))
            )
        if mode == "ignores-lookback" and lookback:
            max_id = since_id = None
        if mode == "bottomless" and posts:
            page = self._invented(max_id if max_id is not None else posts[-1].id + 1, limit)
        elif mode == "endless" and min_id is None:
            page = _paginate(posts, limit=limit, max_id=None, since_id=since_id, min_id=None)
        else:
            page = _paginate(posts, limit=limit, max_id=max_id, since_id=since_id, min_id=min_id)
        if mode == "huge":
            return Response(
                200,
                (("Content-Type", JSON), *limits),
                body=self._huge_page(page or posts[-limit:]),
            )
        if mode == "wrong-types":
            return _json_response(
                [self._wrong_types(s) for s in page] + ["status", None, 7], extra=limits
            )
        if (
            mode == "renumbered"
            or (mode == "text-ids-after-cursor" and min_id is not None)
            or (mode == "text-ids-behind-cursor" and since_id is not None and max_id is not None)
        ):
            return _json_response(
                [self._status_json(s) | {"id": _text_id(s.id)} for s in page], extra=limits
            )
        if mode == "odd-ids" and len(page) > 2:
            odd = [self._status_json(s) for s in page]
            odd[0] = odd[0] | {"id": "zz-not-a-number"}
            odd[1] = odd[1] | {"id": 10**249}
            return _json_response(odd, extra=limits)
        links: list[str] = []
        kept = {k: v for k, v in query.items() if k in ("local", "remote", "only_media", "limit")}
        if mode == "links-unscoped":  # GoToSocial 0.12: its Links forgot `local`
            kept = {k: v for k, v in kept.items() if k == "limit"}
        if page:
            next_max = page[-1].id
            if mode == "endless":
                next_max = (posts[-1].id if posts else page[0].id) + 1
            if len(page) == limit or mode in ("endless", "bottomless"):
                links.append(f'<{self._page_url(path, kept, max_id=next_max)}>; rel="next"')
            if mode == "since-links":
                links.append(f'<{self._page_url(path, kept, since_id=page[0].id)}>; rel="prev"')
            elif mode == "skipping-links":
                later = [s.id for s in posts if s.id > page[0].id]
                past = later[min(limit, len(later)) - 1] if later else page[0].id
                links.append(f'<{self._page_url(path, kept, min_id=past)}>; rel="prev"')
            else:
                links.append(f'<{self._page_url(path, kept, min_id=page[0].id)}>; rel="prev"')
        extra = limits + ((("Link", ", ".join(links)),) if links else ())
        if any(s.id in self._undecodable for s in page):
            items = [json.dumps(self._status_json(s)).encode() for s in page]
            items = [
                item.replace(b'"content": "', b'"content": "caf\xe9 ', 1)
                if s.id in self._undecodable
                else item
                for s, item in zip(page, items, strict=True)
            ]
            return Response(200, (("Content-Type", JSON), *extra), b"[" + b",".join(items) + b"]")
        return _json_response([self._status_json(s) for s in page], extra=extra)

    def _date(self) -> Headers:
        """The instance's own ``Date`` when its clock runs ahead (else the server's)."""
        return _now_header(self.clock_ahead) if self.clock_ahead else ()

    def _page_url(self, path: str, kept: Mapping[str, str], **cursor: int) -> str:
        params = dict(kept)
        params.update({k: str(v) for k, v in cursor.items()})
        return self.url(path) + "?" + urlencode(params)

    def _invented(self, below: int, limit: int) -> list[Status]:
        """``limit`` posts with ids just under ``below``: an archive that never ends."""
        template = self._statuses[0]
        return [
            replace(template, id=below - i, links=(), card=None, own_links=())
            for i in range(1, limit + 1)
            if below - i > 0
        ]

    def _api_status(self, status_id: str, limits: Headers) -> Response:
        try:
            status = self.status(status_id)
        except (KeyError, ValueError):
            status = None
        if status is None or status.visibility not in ("public", "unlisted"):
            return _json_response({"error": "Record not found"}, status=404, extra=limits)
        return _json_response(self._status_json(status), extra=limits)

    def _huge_page(self, page: list[Status]) -> bytes:
        if self._huge is None:
            items = [json.dumps(self._status_json(s)).encode() for s in page] or [b"{}"]
            parts: list[bytes] = []
            size = 2
            for item in itertools.cycle(items):
                if size + len(item) + 1 > HUGE_API_BYTES:
                    break
                parts.append(item)
                size += len(item) + 1
            body = b"[" + b",".join(parts) + b"]"
            self._huge = body + b" " * (HUGE_API_BYTES - len(body))
        return self._huge

    # ------------------------------------------------------------------ entities

    def _account_json(self, account: Account) -> dict[str, Any]:
        posts = [s for s in self._statuses if s.account == account.acct]
        last = posts[-1].created_at.date().isoformat() if posts else None
        body: dict[str, Any] = {
            "id": account.id,
            "username": account.username,
            "acct": account.acct,
            "display_name": account.display_name,
            "locked": False,
            "bot": False,
            "discoverable": account.discoverable,
            "indexable": account.indexable,
            "group": False,
            "created_at": _iso(_ACCOUNT_TIME + timedelta(days=account.index)),
            "note": f"<p>{html.escape(TEXTS[account.language].site_intro)}</p>",
            "url": self.profile_url(account),
            "uri": self.actor_uri(account),
            "avatar": self.url("/avatars/original/missing.png"),
            "avatar_static": self.url("/avatars/original/missing.png"),
            "header": self.url("/headers/original/missing.png"),
            "header_static": self.url("/headers/original/missing.png"),
            "followers_count": 3 + account.index,
            "following_count": 5,
            "statuses_count": len(posts),
            "last_status_at": last,
            "hide_collections": False,
            "emojis": [],
            "fields": [],
        }
        if account.local:
            body["noindex"] = account.noindex
        return body

    def _content_html(self, status: Status) -> str:
        words = [html.escape(status.text)]
        words.extend(_link_html(self.link_url(link)) for link in status.links)
        words.extend(_link_html(self.url(path)) for path in status.own_links)
        tail: list[str] = []
        for acct in status.mentions:
            mentioned = self._accounts[acct]
            tail.append(
                '<span class="h-card" translate="no"><a href="'
                + html.escape(self.profile_url(mentioned))
                + '" class="u-url mention">@<span>'
                + html.escape(mentioned.username)
                + "</span></a></span>"
            )
        for tag in status.tags:
            href = html.escape(self.url(f"/tags/{tag}"))
            tail.append(
                f'<a href="{href}" class="mention hashtag" rel="tag">#<span>{tag}</span></a>'
            )
        paragraphs = [" ".join(words)]
        if tail:
            paragraphs.append(" ".join(tail))
        return "".join(f"<p>{p}</p>" for p in paragraphs)

    def _status_json(self, status: Status) -> dict[str, Any]:
        account = self._accounts[status.account]
        card = None
        if status.card is not None:
            card_url = self.link_url(status.card.link)
            card = {
                "url": card_url,
                "title": status.card.title,
                "description": status.card.description,
                "language": status.language,
                "type": "link",
                "author_name": "",
                "author_url": "",
                "provider_name": urlsplit(card_url).hostname or "",
                "provider_url": "",
                "html": "",
                "width": 0,
                "height": 0,
                "image": None,
                "image_description": "",
                "embed_url": "",
                "blurhash": None,
                "published_at": None,
            }
        return {
            "id": status.sid,
            "created_at": _iso(status.created_at),
            "in_reply_to_id": None,
            "in_reply_to_account_id": None,
            "sensitive": status.sensitive,
            "spoiler_text": status.spoiler_text,
            "visibility": status.visibility,
            "language": status.language,
            "uri": None if status.id in self._unreadable else self.status_uri(status),
            "url": self.status_url(status),
            "replies_count": 0,
            "reblogs_count": status.id % 3,
            "favourites_count": status.id % 5,
            "edited_at": None,
            "content": self._content_html(status),
            "reblog": None,
            "account": self._account_json(account),
            "media_attachments": [self._media_json(status)] if status.media else [],
            "mentions": [
                {
                    "id": self._accounts[a].id,
                    "username": self._accounts[a].username,
                    "url": self.profile_url(self._accounts[a]),
                    "acct": a,
                }
                for a in status.mentions
            ],
            "tags": [{"name": t, "url": self.url(f"/tags/{t}")} for t in status.tags],
            "emojis": [],
            "card": card,
            "poll": None,
        }

    def _media_json(self, status: Status) -> dict[str, Any]:
        path = f"/system/media_attachments/files/{status.id}/original/photo.png"
        return {
            "id": status.sid,
            "type": "image",
            "url": self.url(path),
            "preview_url": self.url(path.replace("original", "small")),
            "remote_url": None,
            "description": "A photo",
            "blurhash": None,
        }

    def _wrong_types(self, status: Status) -> dict[str, Any]:
        body = self._status_json(status)
        body.update(
            id=status.id,
            created_at=int(status.created_at.timestamp()),
            content=None,
            account=status.account,
            card=["not", "a", "card"],
            tags="smallweb",
            visibility=1,
        )
        return body

    def _instance_v1(self) -> dict[str, Any]:
        local = [a for a in self._accounts.values() if a.local]
        return {
            "uri": self.host,
            "title": "Trove Social",
            "short_description": "A small instance for people with small websites.",
            "description": "A small instance for people with small websites.",
            "email": f"admin@{self.host}",
            "version": self._software[1],
            "urls": {"streaming_api": f"ws://{self.host}"},
            "stats": {
                "user_count": len(local),
                "status_count": sum(1 for s in self._statuses if self._accounts[s.account].local),
                "domain_count": 1,
            },
            "languages": ["en"],
            "registrations": False,
            "approval_required": False,
            "invites_enabled": False,
            "configuration": {"statuses": {"max_characters": 500}},
            "contact_account": None,
            "rules": [],
        }

    def _instance_v2(self) -> dict[str, Any]:
        local = [a for a in self._accounts.values() if a.local]
        return {
            "domain": self.host,
            "title": "Trove Social",
            "version": self._software[1],
            "source_url": "https://github.com/mastodon/mastodon",
            "description": "A small instance for people with small websites.",
            "usage": {"users": {"active_month": len(local)}},
            "thumbnail": {"url": self.url("/packs/media/images/preview.png")},
            "languages": ["en"],
            "configuration": {
                "urls": {"streaming": f"ws://{self.host}"},
                "statuses": {"max_characters": 500, "max_media_attachments": 4},
            },
            "registrations": {"enabled": False, "approval_required": False, "message": None},
            "contact": {"email": f"admin@{self.host}", "account": None},
            "rules": [],
        }

    def _nodeinfo(self, version: str) -> Response:
        local = [a for a in self._accounts.values() if a.local]
        name, release = self._software
        software: dict[str, str] = {"name": name, "version": release}
        if version == "2.1":
            software["repository"] = "https://github.com/mastodon/mastodon"
            software["homepage"] = "https://joinmastodon.org"
        body = {
            "version": version,
            "software": software,
            "protocols": ["activitypub"],
            "services": {"outbound": [], "inbound": []},
            "usage": {
                "users": {
                    "total": len(local),
                    "activeMonth": len(local),
                    "activeHalfyear": len(local),
                },
                "localPosts": sum(1 for s in self._statuses if self._accounts[s.account].local),
            },
            "openRegistrations": False,
            "metadata": {"nodeName": "Trove Social", "nodeDescription": "A small instance."},
        }
        content_type = f'application/json; profile="{NODEINFO_SCHEMA}{version}#"'
        return ok(json.dumps(body), content_type)

    def _webfinger(self, resource: str) -> Response:
        name = resource.removeprefix("acct:").split("@", 1)
        account = self._accounts.get(name[0])
        if account is None or (len(name) == 2 and name[1] != self.host):
            return _json_response({"error": "Not found"}, status=404)
        body = {
            "subject": f"acct:{account.username}@{self.host}",
            "aliases": [self.actor_uri(account), self.profile_url(account)],
            "links": [
                {
                    "rel": "http://webfinger.net/rel/profile-page",
                    "type": "text/html",
                    "href": self.profile_url(account),
                },
                {
                    "rel": "self",
                    "type": "application/activity+json",
                    "href": self.actor_uri(account),
                },
            ],
        }
        return ok(json.dumps(body), "application/jrd+json; charset=utf-8")

    # ------------------------------------------------------------------ ActivityPub

    def _actor(self, account: Account) -> Response:
        uri = self.actor_uri(account)
        body = {
            "@context": [
                "https://www.w3.org/ns/activitystreams",
                "https://w3id.org/security/v1",
                {
                    "toot": "http://joinmastodon.org/ns#",
                    "discoverable": "toot:discoverable",
                    "indexable": "toot:indexable",
                    "manuallyApprovesFollowers": "as:manuallyApprovesFollowers",
                },
            ],
            "id": uri,
            "type": "Person",
            "following": f"{uri}/following",
            "followers": f"{uri}/followers",
            "inbox": f"{uri}/inbox",
            "outbox": f"{uri}/outbox",
            "preferredUsername": account.username,
            "name": account.display_name,
            "summary": f"<p>{html.escape(TEXTS[account.language].site_intro)}</p>",
            "url": self.profile_url(account),
            "manuallyApprovesFollowers": False,
            "discoverable": account.discoverable,
            "indexable": account.indexable,
            "published": _iso(_ACCOUNT_TIME + timedelta(days=account.index)),
            "endpoints": {"sharedInbox": self.url("/inbox")},
        }
        return _activity_response(body)

    def _status_page(self, account: Account, status_id: str, wants_ap: bool, path: str) -> Response:
        try:
            status = self.status(status_id)
        except (KeyError, ValueError):
            return not_found(path)
        if status.account != account.acct or status.visibility not in ("public", "unlisted"):
            return not_found(path)
        if not wants_ap:
            return self._shell(account)
        return _activity_response(self._note(status))

    def _note(self, status: Status) -> dict[str, Any]:
        account = self._accounts[status.account]
        actor = self.actor_uri(account)
        public = status.visibility == "public"
        content = self._content_html(status)
        tags: list[dict[str, str]] = [
            {
                "type": "Mention",
                "href": self.actor_uri(self._accounts[a]),
                "name": "@" + a,
            }
            for a in status.mentions
        ]
        tags.extend(
            {"type": "Hashtag", "href": self.url(f"/tags/{t}"), "name": f"#{t}"}
            for t in status.tags
        )
        attachment = []
        if status.media:
            media = self._media_json(status)
            attachment.append(
                {
                    "type": "Document",
                    "mediaType": "image/png",
                    "url": media["url"],
                    "name": media["description"],
                }
            )
        return {
            "@context": [
                "https://www.w3.org/ns/activitystreams",
                {"sensitive": "as:sensitive", "Hashtag": "as:Hashtag"},
            ],
            "id": self.status_uri(status),
            "type": "Note",
            "summary": status.spoiler_text or None,
            "inReplyTo": None,
            "published": _iso(status.created_at, millis=False),
            "url": self.status_url(status),
            "attributedTo": actor,
            "to": [AS_PUBLIC] if public else [f"{actor}/followers"],
            "cc": [f"{actor}/followers"] if public else [AS_PUBLIC],
            "sensitive": status.sensitive,
            "atomUri": self.status_uri(status),
            "content": content,
            "contentMap": {status.language: content},
            "attachment": attachment,
            "tag": tags,
        }

    def _shell(self, account: Account | None) -> Response:
        noindex = account is not None and account.noindex
        return ok(_shell_html(self.host, "noindex, noarchive" if noindex else None), extra=(
            ("Vary", "Accept"),
        ))  # fmt: skip

    # ------------------------------------------------------------------ generation

    def _next_id(self, created: datetime) -> int:
        candidate = _snowflake(created, len(self._statuses))
        newest = self._newest_ordinary()
        if newest is not None and candidate <= newest.id:
            candidate = newest.id + 1
        return candidate

    def _newest_ordinary(self) -> Status | None:
        """The newest post numbered by its time (not by ``add_post_numbered``)."""
        return next((s for s in reversed(self._statuses) if s.id not in self._numbered), None)

    def _pages(self) -> list[tuple[str, str, str]]:
        """(host, path, title) of every home page and article the web has."""
        return [
            (spec.host, spec.path, spec.title)
            for spec in self.web.page_specs()
            if spec.kind in ("home", "article")
        ]

    def _pick_links(self, rng: random.Random) -> list[SharedLink]:
        pages = self._pages()
        if not pages:
            return []
        count = rng.choices((0, 1, 2, 3), weights=(25, 45, 20, 10))[0]
        # A few pages are popular: weights fall with the rank so some URLs are shared often.
        weights = [1.0 / (rank + 1) for rank in range(len(pages))]
        picked = rng.choices(pages, weights=weights, k=count)
        return list(dict.fromkeys(SharedLink(host, path) for host, path, _ in picked))

    def _canonical_of(self, link: SharedLink) -> SharedLink:
        same_host = [(h, p) for h, p, _ in self._pages() if h == link.host and p != link.path]
        return SharedLink(*same_host[0]) if same_host else link

    def _title_of(self, link: SharedLink) -> str:
        for host, path, title in self._pages():
            if (host, path) == (link.host, link.path):
                return title
        return link.path


def _snowflake(when: datetime, sequence: int) -> int:
    """Mastodon's id layout: milliseconds since the epoch above 16 bits of sequence."""
    return (int(when.timestamp() * 1000) << 16) | (sequence & 0xFFFF)


def _iso(when: datetime, *, millis: bool = True) -> str:
    spec = "milliseconds" if millis else "seconds"
    return when.astimezone(UTC).isoformat(timespec=spec).replace("+00:00", "Z")


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1", "on")


def _limit(value: str | None) -> int:
    try:
        number = abs(int(value or ""))
    except ValueError:
        return DEFAULT_LIMIT
    return min(number, MAX_LIMIT) if number else DEFAULT_LIMIT


def _id_param(value: str | None) -> int | None:
    if value is None or not value.isdigit():
        return None
    return int(value)


#: The prefix of ids spelt as text: "0" before any digit but "0", as a ULID's "01".
_TEXT_ID_PREFIX = "0t"


async def _cut_short() -> AsyncGenerator[bytes, None]:
    """A body whose connection is reset a few bytes in (the server aborts it)."""
    yield b'[{"id": "'
    raise ConnectionResetError("the answer's connection reset")


def _now_header(clock_ahead: float) -> Headers:
    return (("Date", formatdate(time.time() + clock_ahead, usegmt=True)),)


def _text_id(status_id: int) -> str:
    """A status id as software whose ids are text spells it (sorting as the number)."""
    return f"{_TEXT_ID_PREFIX}{status_id:020d}"


def _text_id_param(value: str | None) -> int | None:
    """An id parameter read as such software reads it: compared as text, a number
    (Mastodon's, from before) sorts after every id it gives."""
    if value is None:
        return None
    if value.isdigit():
        return 1 << 80
    digits = value.removeprefix(_TEXT_ID_PREFIX)
    return int(digits) if value.startswith(_TEXT_ID_PREFIX) and digits.isdigit() else None


def _paginate(
    posts: list[Status],
    *,
    limit: int,
    max_id: int | None,
    since_id: int | None,
    min_id: int | None,
) -> list[Status]:
    """Mastodon's id pagination over ``posts`` (oldest first); the page is newest first.

    ``max_id`` keeps older posts, ``since_id`` newer ones (the newest ``limit``
    of them), ``min_id`` the ``limit`` posts immediately after it.
    """
    found = posts
    if max_id is not None:
        found = [s for s in found if s.id < max_id]
    if min_id is not None:
        return list(reversed([s for s in found if s.id > min_id][:limit]))
    if since_id is not None:
        found = [s for s in found if s.id > since_id]
    return list(reversed(found[-limit:]))


def _wants_activity_json(accept: str) -> bool:
    for item in accept.split(","):
        media = item.split(";", 1)[0].strip().lower()
        if media == "application/activity+json":
            return True
        if media == "application/ld+json":
            return True
    return False


def _json_response(body: Any, *, status: int = 200, extra: Headers = ()) -> Response:
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    return Response(status, (("Content-Type", JSON), ("Cache-Control", "no-store"), *extra), data)


def _activity_response(body: dict[str, Any]) -> Response:
    return ok(json.dumps(body, ensure_ascii=False), ACTIVITY_JSON, extra=(("Vary", "Accept"),))


def _zero_remaining(limits: Headers) -> Headers:
    return tuple((k, "0") if k == "X-RateLimit-Remaining" else (k, v) for k, v in limits)


def _link_html(url: str) -> str:
    """A link as Mastodon writes it: the scheme hidden, long paths ellipsised."""
    scheme, _, rest = url.partition("://")
    shown, hidden = rest[:30], rest[30:]
    return (
        f'<a href="{html.escape(url)}" target="_blank" rel="nofollow noopener" translate="no">'
        f'<span class="invisible">{html.escape(scheme)}://</span>'
        f'<span class="{"ellipsis" if hidden else ""}">{html.escape(shown)}</span>'
        f'<span class="invisible">{html.escape(hidden)}</span></a>'
    )


def _shell_html(host: str, robots: str | None) -> str:
    """Mastodon's web app page: an empty mount point and scripts, no text of the post."""
    meta = f'<meta name="robots" content="{robots}">' if robots else ""
    scripts = "".join(
        f'<script src="{src}" crossorigin="anonymous" type="module"></script>'
        for src in _SHELL_SCRIPTS
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{meta}<title>{html.escape(host)}</title>"
        '<link rel="stylesheet" href="/packs/css/common.css">'
        f"{scripts}</head>"
        '<body class="app-body"><div class="app-holder" id="mastodon" '
        'data-props="{&quot;locale&quot;:&quot;en&quot;}"></div></body></html>'
    )


@dataclass(slots=True, frozen=True)
class RunningInstance:
    """A served instance: where it listens and what it saw."""

    instance: FediverseInstance
    port: int
    witness: Witness

    @property
    def host(self) -> str:
        return self.instance.host

    @property
    def base_url(self) -> str:
        """``http://host:port``, the URL a crawler resolving ``resolve_map`` uses."""
        return self.instance.origin

    def url(self, path: str = "/") -> str:
        return self.instance.url(path)

    def ip_url(self, path: str = "/") -> str:
        """The same URL addressed by IP (send ``Host: host`` with it)."""
        return f"http://{self.instance.ip}:{self.port}{path}"

    @property
    def resolve_map(self) -> dict[str, str]:
        return {self.instance.host: self.instance.ip}


@contextlib.asynccontextmanager
async def serve_instance(
    instance: FediverseInstance,
    *,
    port: int | None = None,
    witness: Witness | None = None,
    witness_path: str | os.PathLike[str] | None = None,
    idle_timeout: float = 30.0,
) -> AsyncIterator[RunningInstance]:
    """Serve ``instance`` on its IP for the life of the block.

    ``port`` defaults to ``instance.port``; 0 picks a free one. Pass the
    ``witness`` of a running sandbox web (and its port) to serve the instance
    alongside it, every request in one log.
    """
    if witness is not None and witness_path is not None:
        raise ValueError("give a witness or a witness_path, not both")
    own_witness = witness is None
    log = Witness(witness_path) if witness is None else witness
    server = SiteServer(instance, log, idle_timeout)
    try:
        await server.start(instance.port if port is None else port)
        instance.port = server.port
        yield RunningInstance(instance=instance, port=server.port, witness=log)
    finally:
        await server.close()
        if own_witness:
            log.close()
