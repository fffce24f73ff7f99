"""Which spellings of a URL name the same document on a host, learned from its pages.

``trove_schema.urls.canonicalize`` drops what is tracking or a session id on every
host. What else a host ignores (``?ref=``, ``?from=``, a session parameter of its
own, ``/index.html`` after a directory) is learned per host, from two kinds of
evidence its fetched pages give:

* **rel=canonical.** A fetched URL whose canonical is the same URL without parameter
  ``P`` (or without its index file name) confirms that ``P`` does not change the page;
  a canonical that keeps ``P`` contradicts it.
* **Content hashes.** The host's record keeps a small sample of spelling -> content
  hash; two spellings that differ by parameters and hash the same confirm each of
  them, two that differ by one parameter (present in one, or with another value)
  and hash differently contradict it. Each value a parameter name is confirmed for
  keeps its page's hash and the spelling without it (a *proof*), so that two values of
  one spelling whose pages differ contradict the name however many fetches came
  between them (the sample keeps only the newest).

A spelling is learned after ``AliasLimits.confirmations`` confirmations and no
contradiction; one contradiction un-learns it for good on that host. Nothing is ever
merged on a guess: a parameter that changes the page (``?page=2``) is contradicted by
its page's self-canonical or by its content, and a rule can only remove what was
learned. A parameter name is learned for every value once that many *different*
values were confirmed (``?ref=a``, ``?ref=b``); a single value confirmed that many
times is learned for that value alone (``?page=1`` may be the first page, which says
nothing about ``?page=2``).

A page (its content) is one confirmation of a key, however many things say it and in
whichever order its spellings are fetched: its canonical and its page without the
parameter fetched after it, two spellings of it, or one fetched again (changed since,
too), count once (``HostAliases.marks``); a fetch that said nothing then (``silent``)
is confirmed by its page without the parameter, not joined by a second fetch, and a
value that showed another value's page (an echo) is a value of its own once its page
is shown to be the page without it. Counted twice, one page would learn a pair or an
index name, or decide a parameter name on one value and let its links go out
unlearned, depending on which fetch came back first.

Values count as different only where their pages do: two values that showed one and
the same page, which no fetch showed to be the page without the parameter, are one
confirmation (a shop's withdrawn ``?id=101`` and ``?id=102``, both "Product not found"
under the template's canonical, say nothing of ``?id=7``); a tracking parameter shows
the page without it. The second is a fetch of the name that adds no value: the name
stays undecided for up to twice the fetches a rule needs, so that a value on another
page still decides it (``?id=7``, a lamp, says ``id`` changes the page;
``/post/8?ref=latest`` after ``/post/9``'s two ``?ref=`` that ``ref`` does not); one
whose every value shows one page is decided then, unlearned. Once content showed that
a name changes the page, the host's canonical says nothing of any of its values
either: only a page equal to the one without the value confirms it.

A learned name, or a value learned alone, is put to the test again (``Probe``): after
``AliasLimits.max_samples`` fetches of the host, one spelling that carries it, linked
from the page fetched then, is let through ``rewrite`` as it is, and its fetch is
evidence like any other, which may un-learn the rule (two lists' page 2 naming their
page 1 as canonical, each fetched once its page 1 had left the sample, teach
``?page=2``; a list's own page 2, compared with it, takes it back). One is out at a
time, until it comes back however late (a new page is fetched behind its host's whole
queue), or for ``max_samples`` times ``max_samples`` fetches of the host at most (one
never sent, known already, must not stop the tests for ever). The wait doubles with
each probe the rule comes through, up to ``max_samples`` times itself.

Pure: the record is a value, ``observe`` returns the next one, ``rewrite`` applies its
``rules``. Discovery keeps one record per host in the ``trove_url_rules`` bucket.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from trove_schema.events import comparable_hashes, pages_told_apart

#: File names a server may answer for a directory. A rule is learned per name and host.
INDEX_NAMES = frozenset(
    {
        "index.html",
        "index.htm",
        "index.shtml",
        "index.xhtml",
        "index.php",
        "index.asp",
        "index.aspx",
        "index.jsp",
        "index.cgi",
        "default.htm",
        "default.html",
        "default.asp",
        "default.aspx",
    }
)

#: Probes a learned value (``PAIR``) starts as if it had come through: its first test
#: after 256 fetches of its host with the default sample, not 32.
PAIR_HEAD_START = 3
#: Candidate keys: a parameter name (every value), one ``name=value``, an index alias
#: that keeps the directory's slash (``/a/index.html`` -> ``/a/``) or not (-> ``/a``).
NAME, PAIR, INDEX = "q:", "v:", "i:"


@dataclass(frozen=True, slots=True, kw_only=True)
class AliasLimits:
    """How much evidence a rule needs, and how large a host's record may grow."""

    #: Confirmations (different values, for a parameter name) before a rule is learned.
    confirmations: int = 2
    #: Parameters, values and index names tracked per host. Contradicted ones stay (they
    #: must never be learned); open ones are forgotten oldest first to make room.
    max_candidates: int = 64
    #: Spellings whose content hash the record keeps, newest last.
    max_samples: int = 32
    #: Longer parameter names and values are not tracked (nor learned).
    max_value_chars: int = 64
    #: Longer spellings are not sampled.
    max_sample_chars: int = 256
    #: Ids of the events observed last, so a redelivered event is not counted twice.
    max_events: int = 32


DEFAULT_LIMITS = AliasLimits()
#: Characters of a content hash (hex) kept in a sample: 64 bits tell pages apart.
HASH_CHARS = 16
#: Characters (hex) of the hash that names, in a proof, the spelling without the value.
SPELLING_CHARS = 12


@dataclass(frozen=True, slots=True)
class Rules:
    """What ``rewrite`` removes on one host."""

    #: Parameter names ignored whatever their value.
    names: frozenset[str] = frozenset()
    #: ``name=value`` parameters ignored (exactly as written in a canonical URL).
    pairs: frozenset[str] = frozenset()
    #: Index file names dropped: ``index.html/`` keeps the slash, ``index.html`` does not.
    index: frozenset[str] = frozenset()
    #: URLs left as they are, each to put a learned parameter name to the test (``Probe``).
    probes: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.names or self.pairs or self.index)

    def describe(self) -> list[str]:
        """The rules in words for an operator: ``?ref=*``, ``?from=sidebar``, ``/index.html``."""
        found = [f"?{name}=*" for name in sorted(self.names)]
        found += [f"?{pair}" for pair in sorted(self.pairs)]
        for name in sorted(self.index):
            slash = name.endswith("/")
            found.append(f"dir/{name.rstrip('/')} -> dir{'/' if slash else ''}")
        found += [f"probe {url}" for url in sorted(self.probes)]
        return found


NO_RULES = Rules()


def rewrite(rules: Rules, url: str) -> str:
    """``url`` (canonical) without what the host's ``rules`` say does not change the page."""
    if not rules or url in rules.probes:
        return url
    head, mark, query = url.partition("?")
    if mark and (rules.names or rules.pairs):
        kept = [p for p in query.split("&") if not _ignored(rules, p)]
        query = "&".join(kept)
    if rules.index:
        head = _strip_index(rules.index, head)
    return f"{head}?{query}" if query else head


def could_alias(url: str) -> bool:
    """True when some rule could rewrite ``url`` (a query, or an index file name)."""
    return "?" in url or url[url.rfind("/") + 1 :] in INDEX_NAMES


def undecided(record: HostAliases, url: str, limits: AliasLimits = DEFAULT_LIMITS) -> list[str]:
    """What in ``url`` (rewritten) the host's record cannot yet say is an alias or not.

    A parameter name never contradicted, an index file name with a style still open,
    while fewer fetches carried it than a rule needs (``_open``; a value that showed
    another value's page counts for less): the keys a fetch of ``url`` may still teach.
    Once that many were fetched and it is not learned, waiting for more would teach
    nothing sooner; untrackable names count as decided too.
    """
    if not could_alias(url):
        return []
    spelling = _Spelling.of(url)
    if spelling is None:
        return []
    found: list[str] = []
    candidates = record.candidates
    # A full record with nothing it may forget tracks no new key: a key it does not
    # hold could never be learned, and waiting on it would hold the host's links for
    # ever.
    trackable = _has_room(candidates, limits)
    for parameter in spelling.params:
        name = parameter.partition("=")[0]
        key = NAME + name
        if len(name) <= limits.max_value_chars and key not in found:
            candidate = candidates.get(key)
            if candidate is None and not trackable:
                continue
            candidate = candidate or Candidate()
            if not candidate.contradicted and _open(candidate, limits):
                found.append(key)
    name = spelling.path[spelling.path.rfind("/") + 1 :]
    if name in INDEX_NAMES:
        held = [candidates.get(INDEX + name + "/"), candidates.get(INDEX + name)]
        # One the record has no room for can never be learned: as good as contradicted.
        missing = Candidate() if trackable else Candidate(0, True, (), 0)
        slash, bare = (c or missing for c in held)
        # A style contradicted, the fetches of the name count on the other (``_hush``).
        tried = slash.tried() + bare.tried()
        open_ = not (slash.contradicted and bare.contradicted) and tried < limits.confirmations
        if open_:
            found.append(INDEX + name)
    return found


def untaught(
    before: HostAliases, after: HostAliases, url: str, limits: AliasLimits = DEFAULT_LIMITS
) -> list[str]:
    """The parameter names of ``url`` its fetch (``before`` -> ``after``) left undecided
    without a value: a value that showed another value's page, or a page counted for it
    already (under another spelling). A probe spent on them taught nothing, and another
    spelling may go out in its place, until the name is closed (``_open``). None for a
    fetch observed already (``after`` is ``before``)."""
    if after is before:
        return []
    was, now = before.candidates, after.candidates
    owed = []
    for key in undecided(after, url, limits):
        old, new = was.get(key) or Candidate(), now.get(key) or Candidate()
        if key.startswith(NAME) and (new.echoed > old.echoed or new.tried() == old.tried()):
            owed.append(key)
    return owed


def _open(candidate: Candidate, limits: AliasLimits) -> bool:
    """Whether a parameter name's fetches may still teach it: fewer than a rule needs
    said something or nothing, and fewer than twice that carried it at all. A value that
    showed another value's page (``echoed``) counts only in the latter, so that another
    page's value still decides the name; and a name whose every value shows one page is
    closed, unlearned, rather than holding its links back for ever."""
    return (
        candidate.confirmed + candidate.silent < limits.confirmations
        and candidate.tried() < 2 * limits.confirmations
    )


def _ignored(rules: Rules, parameter: str) -> bool:
    return parameter.partition("=")[0] in rules.names or parameter in rules.pairs


def _strip_index(index: frozenset[str], head: str) -> str:
    """``head`` without the index file names its rules drop, however many are nested
    (``/a/index.html/index.html``): rewriting a rewritten URL changes nothing."""
    while (stripped := _strip_one_index(index, head)) != head:
        head = stripped
    return head


def _strip_one_index(index: frozenset[str], head: str) -> str:
    path_at = head.find("/", head.find("://") + 3)
    if path_at < 0:
        return head
    name_at = head.rfind("/") + 1
    name = head[name_at:]
    if name not in INDEX_NAMES:
        return head
    at_root = name_at == path_at + 1
    if name + "/" in index or (at_root and name in index):
        return head[:name_at]
    if name in index:
        return head[: name_at - 1]
    return head


@dataclass(frozen=True, slots=True)
class Candidate:
    """The evidence about one key on one host."""

    #: Pages that confirmed the key (each once: ``HostAliases.marks``).
    confirmed: int = 0
    contradicted: bool = False
    #: For a parameter name: the different values confirmed (at most ``confirmations``).
    values: tuple[str, ...] = ()
    #: Fetches carrying the key that said nothing either way (no canonical, no sample).
    silent: int = 0
    #: For a parameter name: what each confirmed value's fetch showed (``_proofs``), as
    #: ``values`` is ordered; empty where it was not known.
    proofs: tuple[str, ...] = ()
    #: For a parameter name contradicted: whether content showed it changes the page
    #: (a canonical that dropped it then says nothing of any of its values either).
    by_content: bool = False
    #: For a parameter name: fetches of another value that showed a confirmed value's
    #: page, never shown to be the page without it (``_one_page``), so added no value.
    echoed: int = 0

    def tried(self) -> int:
        """Fetches that carried the key (a pair's confirmations count in its name's)."""
        return self.confirmed + self.silent + self.echoed


@dataclass(frozen=True, slots=True)
class Probe:
    """When a learned parameter name (or value) is put to the test again, and by which
    spelling.

    Learned from two pages, a name is never fetched again: every spelling that carries
    it is rewritten before the seen check, so nothing could contradict it. One spelling
    at a time goes out as it is, chosen among the links of the page fetched when the
    wait is over; the wait starts again when its fetch comes back, or when it never did.
    """

    #: Fetches of the host before a probe is chosen, or, while ``url`` is out, before it
    #: is given up (``_longest_wait``).
    wait: int
    #: Probes the name came through; each doubles the wait (``_probe_wait``).
    passed: int = 0
    #: The URL ``rewrite`` leaves as it is until its fetch is observed.
    url: str = ""
    #: The content hash of ``url``'s page without the parameter, when the record had one
    #: (so that the probe is compared with it however late it is fetched).
    bare: str = ""


@dataclass(frozen=True, slots=True)
class HostAliases:
    """One host's record: the evidence per candidate and a sample of content hashes."""

    candidates: Mapping[str, Candidate] = field(default_factory=dict)
    #: (path and query, content hash prefix), newest last.
    samples: tuple[tuple[str, str], ...] = ()
    #: Event ids observed last (prefixes), newest last.
    events: tuple[str, ...] = ()
    #: Per learned parameter name (its candidate key), when it is put to the test again.
    probes: Mapping[str, Probe] = field(default_factory=dict)
    #: Per sampled page (its content hash), the keys it was counted for already
    #: (``COUNTED``): a page is one confirmation of a key, however often it is fetched and
    #: whichever of its spellings comes first.
    marks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def rules(self, limits: AliasLimits = DEFAULT_LIMITS) -> Rules:
        names: set[str] = set()
        pairs: set[str] = set()
        index: set[str] = set()
        for key, candidate in self.candidates.items():
            if candidate.contradicted:
                continue
            kind, subject = key[:2], key[2:]
            if kind == NAME and len(candidate.values) >= limits.confirmations:
                names.add(subject)
            elif kind == PAIR and candidate.confirmed >= limits.confirmations:
                pairs.add(subject)
            elif kind == INDEX and candidate.confirmed >= limits.confirmations:
                index.add(subject)
        if not (names or pairs or index):
            return NO_RULES
        probes = {
            p.url
            for key, p in self.probes.items()
            if p.url and key[2:] in (names if key.startswith(NAME) else pairs)
        }
        return Rules(frozenset(names), frozenset(pairs), frozenset(index), frozenset(probes))

    def to_json(self) -> bytes:
        candidates: dict[str, list[Any]] = {}
        for key, c in self.candidates.items():
            # 2: contradicted by content (a release before reads any true value alike).
            entry: list[Any] = [c.confirmed, 2 if c.by_content else int(c.contradicted)]
            optional: list[Any] = [list(c.values), c.silent, list(c.proofs), c.echoed]
            while optional and not optional[-1]:
                optional.pop()
            candidates[key] = entry + optional
        body: dict[str, Any] = {
            "c": candidates,
            "s": [list(s) for s in self.samples],
            "e": list(self.events),
        }
        if self.probes:
            body["p"] = {k: [p.wait, p.passed, p.url, p.bare] for k, p in self.probes.items()}
        if self.marks:
            # A field of its own: a release before reads the record without it.
            body["m"] = {page: list(keys) for page, keys in self.marks.items()}
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | None) -> HostAliases:
        """The record as stored; an unreadable one reads as empty (it is only evidence)."""
        if not data:
            return EMPTY
        try:
            body = json.loads(data)
            candidates = {
                str(key): Candidate(
                    int(entry[0]),
                    bool(entry[1]),
                    tuple(str(v) for v in (entry[2] if len(entry) > 2 else ())),
                    int(entry[3]) if len(entry) > 3 else 0,
                    tuple(str(p) for p in (entry[4] if len(entry) > 4 else ())),
                    entry[1] == 2,
                    int(entry[5]) if len(entry) > 5 else 0,
                )
                for key, entry in body.get("c", {}).items()
            }
            samples = tuple((str(u), str(h)) for u, h in body.get("s", ()))
            events = tuple(str(e) for e in body.get("e", ()))
            probes = {
                str(key): Probe(int(wait), int(passed), str(url), str(bare))
                for key, (wait, passed, url, bare) in body.get("p", {}).items()
            }
            marks = {
                str(local): tuple(str(k) for k in keys) for local, keys in body.get("m", {}).items()
            }
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return EMPTY
        return cls(candidates, samples, events, probes, marks)


EMPTY = HostAliases()


def observe(
    record: HostAliases,
    *,
    url: str,
    canonical: str | None,
    content_hash: str | None,
    links: Iterable[str] = (),
    event_id: str = "",
    limits: AliasLimits = DEFAULT_LIMITS,
) -> HostAliases:
    """The host's record after a successful fetch of ``url`` (canonical URLs only).

    ``links`` are the page's links: a plain page is sampled once its host shows other
    spellings (a record, or such a link), so that a variant fetched later is compared
    with it; a host without any costs nothing. A probe of a learned name is chosen among
    them (``Probe``). Returns ``record`` itself when the fetch says nothing new (on a
    host with a learned name, every fetch brings its next probe nearer).
    """
    seen = event_id[:HASH_CHARS]
    if seen and seen in record.events:
        return record  # a redelivery: already counted
    fetched = _Spelling.of(url)
    if fetched is None:
        return record
    links = tuple(links)
    said: dict[str, bool] = {}  # by the canonical
    if canonical:
        target = _Spelling.of(canonical)
        if target is not None and target.host == fetched.host:
            _canonical_votes(fetched, target, said)
    hashed: dict[str, bool] = {}  # by content
    equal: dict[str, str] = {}  # keys whose page is the page without them: their proof
    digest = content_hash[:HASH_CHARS] if content_hash else ""
    # This spelling's page as it was when last sampled: other spellings sampled showing
    # that are this page as it was, and, the page changed since (a home page's next
    # post), say nothing of what tells them from it.
    before = dict(record.samples).get(fetched.local) if digest else None
    changed = before if before is not None and before != digest else None
    if digest:
        # A probe come back is compared with its page without the parameter, sampled or
        # not; sampled, as it is now (the hash kept with the probe may be older).
        back = record.probes.items()
        as_now = {s for s, h in record.samples if pages_told_apart(h, digest) is not None}
        bare = [
            found
            for k, p in back
            if p.url == url
            and (found := _probe_bare(fetched, k, p, record.candidates, digest))[1]
            and found[0] not in as_now
        ]
        for spelling, sampled in (*record.samples, *bare):
            other = _Spelling.local_to(fetched.host, spelling)
            # A sample hashed by its bytes (a release before) tells nothing: a
            # difference would un-learn a rule for good. One hashed by its markup beside
            # one by what it says is another page: two values of one parameter so
            # hashed, under a canonical that drops it, are two pages.
            apart = pages_told_apart(sampled, digest)
            if other.local != fetched.local and apart is not None and sampled != changed:
                alone = _hash_votes(fetched, other, same=not apart, votes=hashed)
                if alone is not None:
                    equal[alone[0]] = _proof(alone[1], digest, equal=True)
    votes = dict(said)
    for key, confirm in hashed.items():
        _put(votes, key, confirm)
    candidates = dict(record.candidates)
    proofs = _proofs(fetched, digest, votes) | {k: p for k, p in equal.items() if votes[k]}
    for key, proof in proofs.items():
        name, _, value = key[len(PAIR) :].partition("=")
        named = candidates.get(NAME + name)
        if votes[key] and _disproved(named, value[: limits.max_value_chars], proof):
            votes[key] = hashed[key] = False
    # Every confirmation is about the page fetched: by its canonical, or by a spelling
    # sampled before that showed the same content. What that page was counted for, and
    # this spelling's page as it was when last sampled (a re-crawl of a page that
    # changed, a comment or a price, is the same page):
    counted: tuple[str, ...] = ()
    if digest:
        counted = record.marks.get(digest, ())
        if changed is not None:
            counted += tuple(m for m in record.marks.get(changed, ()) if m not in counted)
    silent: list[tuple[str, str]] = []  # keys of the page's silent fetch besides its own
    for key, confirm in votes.items():
        mark = _mark(key, limits)
        if confirm and mark in counted:
            # This page confirmed the key already: fetched again, under another spelling,
            # or as the page without the key after it. Counted twice, one page would
            # learn a pair or an index name, or decide a parameter name on one value.
            counted = (*(m for m in counted if m != mark), mark)  # the newest kept
            continue
        if confirm and ECHOED + mark in counted:
            # Its value showed another value's page; now shown to be the page without
            # it, it is a value of its own, as it would have been in the other order.
            if key in equal and _unecho(candidates, key, equal[key], limits):
                counted = (*(m for m in counted if m != ECHOED + mark), mark)
            continue
        by_content = hashed.get(key) is False
        kind = _vote(candidates, key, confirm, limits, proofs.get(key), by_content, key in equal)
        style = candidates.get(key)
        toggled = key.removesuffix("/") if key.endswith("/") else key + "/"
        contradicted = kind is None and style is not None and style.contradicted
        if confirm and key.startswith(INDEX) and contradicted and toggled not in votes:
            # A style contradicted: the fetch tried the name and said nothing of the
            # other style, where it counts as such (or the name would stay open for ever).
            silent.append((INDEX + key[len(INDEX) :].removesuffix("/") + "/", mark))
        if kind is not None:
            hushed = HUSHED + _hush_mark(mark)
            if hushed in counted:
                # Its fetch said nothing then (no canonical, nothing sampled to compare):
                # what it says now is that fetch's word, not another's.
                _unhush(candidates, key)
            counted = (*(m for m in counted if m != hushed), kind + mark)
    for key, mark in (*_silent_keys(fetched, votes, limits), *silent):
        # The same page saying nothing again, or once more after it said something, is
        # no new fetch of it.
        alike = _hush_mark(mark)
        if not any(m in counted for m in (HUSHED + alike, alike, ECHOED + alike, mark)):
            _hush(candidates, key, limits)
            counted = (*counted, HUSHED + alike)
    marks = dict(record.marks)
    if digest:
        # The newest marks a page (a page under ever new spellings, each a mark): one
        # that fell out counts that spelling again, as before marks were kept.
        marks[digest] = tuple(m for m in counted if len(m) <= MARK_CHARS)[-MAX_MARKS:]
    _forget_pairs_of_learned_names(candidates, limits)
    samples = record.samples
    worth_sampling = fetched.variant or candidates or samples or _shows_variants(fetched, links)
    if digest and worth_sampling and len(fetched.local) <= limits.max_sample_chars:
        # The other spellings sampled showing this page as it was are dropped with it:
        # compared with it as it is now, each would contradict what it is an alias of.
        kept = [s for s in samples if s[0] != fetched.local and s[1] != changed]
        kept.append((fetched.local, digest))
        samples = tuple(kept[-limits.max_samples :])
    # Only a sampled page is compared again, or known when it comes back.
    sampled_now = {page for _, page in samples}
    marks = {page: keys for page, keys in marks.items() if keys and page in sampled_now}
    probes = _next_probes(record.probes, candidates, fetched, url, samples, links, limits)
    if (
        candidates == record.candidates
        and samples == record.samples
        and probes == record.probes
        and marks == record.marks
    ):
        return record
    events = record.events
    if seen:
        events = (*events, seen)[-limits.max_events :]
    return HostAliases(candidates, samples, events, probes, marks)


@dataclass(frozen=True, slots=True)
class _Spelling:
    host: str
    path: str
    params: tuple[str, ...]

    @classmethod
    def of(cls, url: str) -> _Spelling | None:
        scheme_end = url.find("://")
        if scheme_end < 0:
            return None
        rest = url[scheme_end + 3 :]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        return cls.local_to(rest[:cut].lower(), rest[cut:])

    @classmethod
    def local_to(cls, host: str, local: str) -> _Spelling:
        path, _, query = local.partition("?")
        return cls(host, path or "/", tuple(p for p in query.split("&") if p))

    @property
    def local(self) -> str:
        return f"{self.path}?{'&'.join(self.params)}" if self.params else self.path

    @property
    def variant(self) -> bool:
        return bool(self.params) or self.path[self.path.rfind("/") + 1 :] in INDEX_NAMES


def _shows_variants(page: _Spelling, links: Iterable[str]) -> bool:
    for link in links:
        if "?" in link or link[link.rfind("/") + 1 :] in INDEX_NAMES:
            other = _Spelling.of(link)
            if other is not None and other.host == page.host:
                return True
    return False


def _index_relation(longer: str, shorter: str) -> str | None:
    """How path ``shorter`` relates to ``longer``: the same, its directory (the index key
    that drops the name), or not at all (None)."""
    if longer == shorter:
        return ""
    name_at = longer.rfind("/") + 1
    name = longer[name_at:]
    if name not in INDEX_NAMES:
        return None
    if shorter == longer[:name_at]:
        return INDEX + name + "/"
    if name_at > 1 and shorter == longer[: name_at - 1]:
        return INDEX + name
    return None


def _put(votes: dict[str, bool], key: str, confirm: bool) -> None:
    """A contradiction outweighs any confirmation from the same fetch."""
    votes[key] = votes.get(key, True) and confirm


def _canonical_votes(fetched: _Spelling, canonical: _Spelling, votes: dict[str, bool]) -> None:
    relation = _index_relation(fetched.path, canonical.path)
    if relation is None:
        return  # the canonical names another document: nothing to learn about spellings
    if relation:
        _put(votes, relation, True)
    else:
        name = fetched.path[fetched.path.rfind("/") + 1 :]
        if name in INDEX_NAMES:  # the canonical keeps the index name
            _put(votes, INDEX + name + "/", False)
            _put(votes, INDEX + name, False)
    kept = {p.partition("=")[0] for p in canonical.params}
    for parameter in fetched.params:
        _put(votes, PAIR + parameter, parameter.partition("=")[0] not in kept)


def _hash_votes(
    a: _Spelling, b: _Spelling, *, same: bool, votes: dict[str, bool]
) -> tuple[str, _Spelling] | None:
    """Votes on what tells ``a`` from ``b``. Returns, when one is the other with one more
    parameter and their pages are one, its key and the spelling without it."""
    for longer, shorter in ((a, b), (b, a)):
        relation = _index_relation(longer.path, shorter.path)
        if relation is None or not set(shorter.params) <= set(longer.params):
            continue
        differ = [PAIR + p for p in longer.params if p not in shorter.params]
        if relation:
            differ.append(relation)
        if same:
            for key in differ:
                _put(votes, key, True)
            if len(differ) == 1 and not relation:
                return differ[0], shorter
        elif len(differ) == 1:  # with two or more, the hash cannot say which one matters
            _put(votes, differ[0], False)
        return None
    if not same and a.path == b.path:
        # Two values of one parameter, the rest alike, and two pages: the parameter
        # changes the page, whatever a canonical that drops it says (``?id=5`` and
        # ``?id=6`` of a template whose canonical is the bare path).
        only_a = [p for p in a.params if p not in b.params]
        only_b = [p for p in b.params if p not in a.params]
        if (
            len(only_a) == 1
            and len(only_b) == 1
            and only_a[0].partition("=")[0] == only_b[0].partition("=")[0]
        ):
            _put(votes, PAIR + only_a[0], False)
    return None


def _proofs(fetched: _Spelling, digest: str, votes: Mapping[str, bool]) -> dict[str, str]:
    """For each parameter of ``fetched`` this fetch votes on, what the fetch showed: the
    spelling without it (hashed) and the page's hash."""
    if not digest:
        return {}
    proofs: dict[str, str] = {}
    for parameter in fetched.params:
        if PAIR + parameter in votes:
            without = _Spelling(
                fetched.host, fetched.path, tuple(p for p in fetched.params if p != parameter)
            )
            proofs[PAIR + parameter] = _proof(without, digest, equal=False)
    return proofs


def _proof(without: _Spelling, digest: str, *, equal: bool) -> str:
    """A proof: the spelling without the value (hashed), then ``=`` where the page was
    shown to be that spelling's too, else ``:``, then the page's hash."""
    spelling = hashlib.blake2b(without.local.encode(), digest_size=SPELLING_CHARS // 2)
    return f"{spelling.hexdigest()}{'=' if equal else ':'}{digest}"


def _read_proof(proof: str) -> tuple[str, str, bool]:
    """(spelling, page hash, shown equal to the spelling) of a proof; empty if unknown."""
    mark = proof[SPELLING_CHARS : SPELLING_CHARS + 1]
    if mark not in (":", "="):
        return "", "", False
    return proof[:SPELLING_CHARS], proof[SPELLING_CHARS + 1 :], mark == "="


def _disproved(named: Candidate | None, value: str, proof: str) -> bool:
    """Whether another value confirmed before, on the same spelling otherwise, showed
    another page than ``proof`` does: the parameter changes the page, whatever a
    canonical says."""
    if named is None:
        return False
    spelling, digest, equal = _read_proof(proof)
    for other, kept in zip(named.values, named.proofs, strict=False):
        kept_spelling, kept_digest, kept_equal = _read_proof(kept)
        if (
            other != value
            and kept_spelling == spelling
            # Both shown to be the page without the value, each when it was fetched:
            # two pages there say that page changed between (a home page's next post).
            and not (equal and kept_equal)
            and pages_told_apart(kept_digest, digest)
        ):
            return True
    return False


def _one_page(proof: str | None, kept_proofs: Iterable[str]) -> bool:
    """Whether ``proof`` shows the very page another value's did, and no fetch showed it
    to be the page without the parameter: a soft 404 or an empty list served for any
    value, which is no second value of a parameter that changes nothing."""
    spelling, digest, equal = _read_proof(proof or "")
    if not digest or equal:
        return False
    for kept in kept_proofs:
        kept_spelling, kept_digest, kept_equal = _read_proof(kept)
        # A page shown equal to its spelling without the value is that spelling's.
        if kept_digest == digest and not (kept_equal and kept_spelling == spelling):
            return True
    return False


def _silent_keys(
    fetched: _Spelling, votes: Mapping[str, bool], limits: AliasLimits
) -> list[tuple[str, str]]:
    """The keys ``fetched`` carried that this fetch taught nothing about, each with its
    page's mark of it (``_mark``)."""
    keys = [
        (NAME + p.partition("=")[0], _mark(PAIR + p, limits))
        for p in fetched.params
        if PAIR + p not in votes
    ]
    name = fetched.path[fetched.path.rfind("/") + 1 :]
    if name in INDEX_NAMES and INDEX + name + "/" not in votes and INDEX + name not in votes:
        keys.append((INDEX + name + "/", INDEX + name + "/"))
    return keys


#: A page's marks (``HostAliases.marks``): a key (a pair, or an index key) it was counted
#: for; with one of these before it, counted as silent, or as a value that showed
#: another value's page.
COUNTED, HUSHED, ECHOED = "", "~", "^"
#: Marks kept a page, and the longest kept (a pair key of the longest name and value
#: tracked; a longer one is never a candidate).
MAX_MARKS = 8
MARK_CHARS = 1 + len(PAIR) + 2 * DEFAULT_LIMITS.max_value_chars + 1


def _mark(key: str, limits: AliasLimits) -> str:
    """What a page is marked with for ``key``: a pair's value cut as its name tracks it."""
    if not key.startswith(PAIR):
        return key
    name, _, value = key[len(PAIR) :].partition("=")
    return f"{PAIR}{name}={value[: limits.max_value_chars]}"


def _hush_mark(mark: str) -> str:
    """The mark (after ``HUSHED``) of a page whose fetch said nothing of ``mark``'s key:
    an index name's is one, whichever style, as its ``silent`` is counted on one key."""
    if mark.startswith(INDEX):
        return mark.removesuffix("/") + "/"
    return mark


def _unhush(candidates: dict[str, Candidate], key: str) -> None:
    """Take back the ``silent`` a page counted for ``key``, which it now confirms."""
    if key.startswith(INDEX):
        targets = [key.removesuffix("/") + "/", key.removesuffix("/")]  # as ``_hush``
    else:
        targets = [NAME + key[len(PAIR) :].partition("=")[0]]
    for target in targets:
        old = candidates.get(target)
        if old is not None and old.silent > 0 and not old.contradicted:
            candidates[target] = replace(old, silent=old.silent - 1)
            return


def _unecho(candidates: dict[str, Candidate], key: str, proof: str, limits: AliasLimits) -> bool:
    """Count as a value of its own one a page counted as an echo (``_one_page``), now
    that its page was shown to be the page without it."""
    name, _, value = key[len(PAIR) :].partition("=")
    named = candidates.get(NAME + name)
    value = value[: limits.max_value_chars]
    if named is None or named.contradicted or named.echoed <= 0 or value in named.values:
        return False
    if len(named.values) >= limits.confirmations:
        return False
    proofs = (*named.proofs, *([""] * (len(named.values) - len(named.proofs))), proof)
    candidates[NAME + name] = replace(
        named,
        confirmed=named.confirmed + 1,
        values=(*named.values, value),
        proofs=proofs,
        echoed=named.echoed - 1,
    )
    return True


def _hush(candidates: dict[str, Candidate], key: str, limits: AliasLimits) -> None:
    if len(key) > len(NAME) + limits.max_value_chars:
        return
    if key.startswith(INDEX) and (slash := candidates.get(key)) and slash.contradicted:
        # The directory's slash is not the name's alias: the fetch said nothing of the
        # style still open either, and counts there, so that the name is decided in time
        # (where the record has room: never in place of another key still open).
        key = key.removesuffix("/")
        if key not in candidates and len(candidates) >= limits.max_candidates:
            return
    old = candidates.get(key)
    if old is None:
        if not _make_room(candidates, limits):
            return
        old = Candidate()
    if not old.contradicted:
        candidates[key] = replace(old, silent=old.silent + 1)


def _vote(
    candidates: dict[str, Candidate],
    key: str,
    confirm: bool,
    limits: AliasLimits,
    proof: str | None = None,
    by_content: bool = False,
    equal: bool = False,
) -> str | None:
    """``by_content``: a contradiction content showed; ``equal``: a confirmation by the
    page without the parameter, which showed the same content. How a confirmation was
    counted (``COUNTED`` or ``ECHOED``), None if it was not."""
    if key.startswith(INDEX):
        return _count(candidates, key, confirm, limits, value=None)
    parameter = key[len(PAIR) :]
    name, _, value = parameter.partition("=")
    if len(name) > limits.max_value_chars:
        return None
    counted = _count(
        candidates,
        NAME + name,
        confirm,
        limits,
        value=value[: limits.max_value_chars],
        proof=proof,
        by_content=by_content,
    )
    named = candidates.get(NAME + name)
    if not confirm and key not in candidates and named is not None and named.contradicted:
        # The name's contradiction says it already: an entry for each of a forum's
        # `?t=` values would fill the record, and nothing more would be learned.
        return counted
    if confirm and not equal and named is not None and named.by_content:
        # The canonical that dropped the name while its values showed other pages says
        # nothing of one value either (``?id=1`` is not ``/item`` for being fetched twice).
        return counted
    if len(value) <= limits.max_value_chars and not (confirm and _learned(named, NAME, limits)):
        paired = _count(candidates, key, confirm, limits, value=None)
        counted = counted if counted is not None else paired
    return counted


def _count(
    candidates: dict[str, Candidate],
    key: str,
    confirm: bool,
    limits: AliasLimits,
    *,
    value: str | None,
    proof: str | None = None,
    by_content: bool = False,
) -> str | None:
    """How a confirmation was counted (``COUNTED`` or ``ECHOED``), None if it was not."""
    old = candidates.get(key)
    if old is None:
        if not _make_room(candidates, limits):
            return None  # untracked, so never learned
        old = Candidate()
    if old.contradicted:
        if not confirm and by_content and not old.by_content:
            candidates[key] = replace(old, by_content=True)
        return None
    if not confirm:
        candidates[key] = Candidate(old.confirmed, True, old.values, old.silent, (), by_content)
        return None
    values, proofs = old.values, old.proofs
    if value is not None and value not in values and len(values) < limits.confirmations:
        if _one_page(proof, proofs):
            # No second value, nor a fetch that decides the name: the key stays open a
            # while (``_open``), so that a value on another page (a probe) may teach it.
            candidates[key] = replace(old, echoed=old.echoed + 1)
            return ECHOED
        # Proofs stay in step with the values (an unknown one as ""), so each is its own.
        proofs = (*proofs, *([""] * (len(values) - len(proofs))), proof or "")
        values = (*values, value)
    candidates[key] = replace(old, confirmed=old.confirmed + 1, values=values, proofs=proofs)
    return COUNTED


def _learned(candidate: Candidate | None, kind: str, limits: AliasLimits) -> bool:
    if candidate is None or candidate.contradicted:
        return False
    if kind == NAME:
        return len(candidate.values) >= limits.confirmations
    return candidate.confirmed >= limits.confirmations


def _has_room(candidates: Mapping[str, Candidate], limits: AliasLimits) -> bool:
    """Whether ``_make_room`` would find room for a new key."""
    if len(candidates) < limits.max_candidates:
        return True
    return any(
        not candidate.contradicted and not _learned(candidate, key[:2], limits)
        for key, candidate in candidates.items()
    )


def _make_room(candidates: dict[str, Candidate], limits: AliasLimits) -> bool:
    if len(candidates) < limits.max_candidates:
        return True
    for key, candidate in candidates.items():
        if not candidate.contradicted and not _learned(candidate, key[:2], limits):
            del candidates[key]
            return True
    return False


def _forget_pairs_of_learned_names(candidates: dict[str, Candidate], limits: AliasLimits) -> None:
    """Once a name is learned for every value, its single values need no entries."""
    learned = {
        key[len(NAME) :]
        for key, c in candidates.items()
        if key.startswith(NAME) and _learned(c, NAME, limits)
    }
    if not learned:
        return
    for key in [k for k, c in candidates.items() if k.startswith(PAIR) and not c.contradicted]:
        if key[len(PAIR) :].partition("=")[0] in learned:
            del candidates[key]


def _next_probes(
    probes: Mapping[str, Probe],
    candidates: Mapping[str, Candidate],
    fetched: _Spelling,
    url: str,
    samples: tuple[tuple[str, str], ...],
    links: tuple[str, ...],
    limits: AliasLimits,
) -> dict[str, Probe]:
    """Each learned name's probe after a fetch of ``url``: one fetch nearer, come back,
    given up, or chosen among the page's ``links``."""
    found: dict[str, Probe] = {}
    rules: Rules | None = None
    for key, candidate in candidates.items():
        if key.startswith(INDEX) or not _learned(candidate, key[:2], limits):
            continue
        probe = probes.get(key)
        if probe is None:  # learned by this fetch (or before the record kept probes)
            # A value folds one spelling, not a name's every value: its first test can
            # wait as if it had come through a few (each is a request for a page known).
            head_start = 0 if key.startswith(NAME) else PAIR_HEAD_START
            found[key] = Probe(_probe_wait(head_start, limits), head_start)
        elif probe.url == url:  # come back: what its page showed is counted above
            passed = min(probe.passed + 1, limits.max_samples)
            found[key] = Probe(_probe_wait(passed, limits), passed)
        elif probe.wait > 1:
            found[key] = replace(probe, wait=probe.wait - 1)
        elif probe.url:
            # Never come back (known already, refused, failed): a wait again before the
            # next, so that two are never out at once.
            found[key] = Probe(_probe_wait(probe.passed, limits), probe.passed)
        else:
            rules = rules if rules is not None else HostAliases(candidates).rules(limits)
            chosen = _choose_probe(key, rules, fetched.host, samples, links, limits)
            # Out until it comes back, or for the longest wait: a new page, it is fetched
            # behind the host's whole queue (one given up sooner would come back compared
            # with nothing, while another is out), and one never fetched (known already)
            # must not block for ever.
            wait = _longest_wait(limits) if chosen else 0
            found[key] = Probe(wait, probe.passed, *(chosen or ("", "")))
    return found


def _probe_wait(passed: int, limits: AliasLimits) -> int:
    """Fetches of the host before a learned name is put to the test again: a sample's
    worth at first (the spellings it was learned from have left the sample by then),
    doubled for each probe it came through, up to ``_longest_wait``."""
    return min(limits.max_samples << min(passed, limits.max_samples), _longest_wait(limits))


def _longest_wait(limits: AliasLimits) -> int:
    """``max_samples`` samples' worth of fetches: for a rule that holds, one request in a
    thousand with the defaults; and every rule is asked again within that."""
    return limits.max_samples**2


def _choose_probe(
    key: str,
    rules: Rules,
    host: str,
    samples: tuple[tuple[str, str], ...],
    links: tuple[str, ...],
    limits: AliasLimits,
) -> tuple[str, str] | None:
    """A link to put ``key`` (a learned name, or a learned value of one) to the test,
    and the hash of its page without it if the sample has it: one that the rules would
    rewrite by one value of the name alone (that value, for a value), so that its fetch
    speaks of that; first one whose page without it is sampled (the page itself, a list
    linking to its own ``?sort=`` or ``?page=2``), which its fetch is compared with."""
    subject = key[2:]
    name = subject.partition("=")[0]
    hashes = dict(samples)
    first: tuple[str, str] | None = None
    for link in links:
        if "?" not in link:
            continue
        spelling = _Spelling.of(link)
        if spelling is None or spelling.host != host:
            continue
        if len(spelling.local) > limits.max_sample_chars:
            continue
        dropped = [p for p in spelling.params if _ignored(rules, p)]
        if len(dropped) != 1 or dropped[0].partition("=")[0] != name:
            continue
        if key.startswith(PAIR) and dropped[0] != subject:
            continue
        head = link.partition("?")[0]
        if rules.index and _strip_index(rules.index, head) != head:
            continue
        kept = tuple(p for p in spelling.params if p != dropped[0])
        without = _Spelling(host, spelling.path, kept).local
        if without in hashes:
            return link, hashes[without]
        first = first or (link, "")
    return first


def _probe_bare(
    fetched: _Spelling,
    key: str,
    probe: Probe,
    candidates: Mapping[str, Candidate],
    digest: str,
) -> tuple[str, str]:
    """The spelling of a probe come back (``fetched``) without its name, and the hash its
    page had when the probe was chosen: a sample that the record's may no longer hold.

    Chosen when that page had left the sample, it is compared with the page a value of
    the name was shown to be on that spelling, if the probe's page (``digest``) is
    hashed the other way (by its markup, by its text): a "not found" page of a few
    words that dead values showed, against a real post, which would otherwise pass the
    probe for ever. Of one kind, that page may only have changed since (a home page's
    next post): a difference would un-learn a true rule for good."""
    name = key[2:].partition("=")[0]
    kept = tuple(p for p in fetched.params if p.partition("=")[0] != name)
    without = _Spelling(fetched.host, fetched.path, kept)
    if probe.bare:
        return without.local, probe.bare
    named = candidates.get(NAME + name)
    spelling = _read_proof(_proof(without, "", equal=True))[0]
    for kept_proof in named.proofs if named is not None else ():
        kept_spelling, shown, equal = _read_proof(kept_proof)
        if equal and kept_spelling == spelling and not comparable_hashes(shown, digest):
            return without.local, shown
    return without.local, ""
