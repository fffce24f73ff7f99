"""Canonical URLs: the one spelling under which Trove knows a page.

``canonicalize`` turns every spelling of a URL that points at the same resource into
one string, so that "seen", politeness and the database all agree on a page's identity.
url-normalize does the RFC 3986 work (case, dot segments, percent-encoding, IDNA,
default ports, empty path); Trove adds its own rules on top:

* only ``http`` and ``https``; a host is required; ``user:pass@`` is dropped;
* the fragment is dropped, hash-bang (``#!``) fragments included (no
  ``_escaped_fragment_`` rewriting: that AJAX scheme is long dead);
* ``\\`` before the query is read as ``/`` and tabs and newlines are dropped, as
  browsers do;
* the host is checked: labels of ``[a-z0-9_-]``, 63 characters each, 253 in all; IPv6
  literals are written in compressed form; a name with an internationalized label
  (``bücher.example``, written ``xn--bcher-kva.example``) must be valid IDNA 2008 with
  UTS-46 mapping, as the ``idna`` package that httpx uses judges it (see ``fetchable``);
  hosts ending in a number are parsed as IPv4 the way browsers do (``0x7f.1`` is
  ``127.0.0.1``) and written dotted-quad, so the private-address check cannot be
  dodged by spelling;
* tracking parameters (``TRACKING_PARAMETERS``, any ``utm_*``) and session ids
  (``SESSION_PARAMETERS``, ``aspsessionid*``, ``SESSION_VALUES``; path parameters
  ``;jsessionid=``, ``;phpsessid=``, a ``;sid=`` that looks like one; ASP.NET's
  cookieless path segment ``/(S(...))``) are removed, matching names case-insensitively;
* the remaining query parameters are sorted by name (stable: repeated names keep their
  order, so ``?a=2&a=1`` stays as it is); an empty query is dropped;
* the result may be at most ``max_length`` characters.

Deliberately kept distinct: path case (``/About`` vs ``/about``), query values and
their case, and a trailing slash on a non-root path (``/blog`` vs ``/blog/``): servers
may and do treat those as different resources. url-normalize also collapses empty path
segments (``/a//b`` is ``/a/b``) and turns a stray ``%`` into ``%25``; both are kept.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

import idna
from url_normalize import url_normalize

from trove_schema.addresses import (
    IPAddress,
    parse_address,
    parse_nat64_prefixes,
    parse_networks,
    refusal,
)
from trove_schema.errors import InvalidURL
from trove_schema.events import MAX_URL_LENGTH

if TYPE_CHECKING:
    import tldextract

#: Query parameters that only say where a visitor came from (names compared lower-case).
TRACKING_PARAMETERS = frozenset(
    {
        "fbclid",  # Facebook
        "gclid",  # Google Ads
        "dclid",  # Google Display
        "msclkid",  # Microsoft Ads
        "mc_cid",  # Mailchimp campaign
        "mc_eid",  # Mailchimp recipient
        "yclid",  # Yandex
        "_ga",  # Google Analytics cross-domain
        "_hsenc",  # HubSpot
        "_hsmi",  # HubSpot
        "igshid",  # Instagram
        "ref_src",  # Twitter/X
    }
)
#: Any parameter whose lower-case name starts with one of these is tracking too.
TRACKING_PREFIXES = ("utm_",)
#: Query parameters that carry a session id (names compared lower-case): PHP's, Java's,
#: generic names, and those shop software hands every cookieless visitor afresh
#: (osCommerce's ``osCsid``, Zen Cart's ``zenid``, ColdFusion's ``CFID``/``CFTOKEN``),
#: each making every link of every visit a new URL.
SESSION_PARAMETERS = frozenset(
    {
        "phpsessid",
        "jsessionid",
        "sessionid",
        "session_id",
        "oscsid",
        "zenid",
        "cfid",
        "cftoken",
        "xtcsid",
    }
)
#: A session id's value: 20 or more letters and digits, both among them (phpBB's 32
#: hex digits, PHP's 26 or 32 characters), not a slug's words and hyphens nor a number.
_SESSION_VALUE = r"(?=[A-Za-z]*[0-9])(?=[0-9]*[A-Za-z])[0-9A-Za-z]{20,128}"
#: Names that are a session id when their value looks like one: vBulletin's ``s`` of 32
#: hex digits (WordPress names its search so), and ``sid`` (PHP-Nuke and Slash name
#: their stories so: ``?sid=1``, ``?sid=04/01/01/1234``). A site that keeps no cookie of
#: a crawler puts a new one in every link of every page: each page a new URL at every
#: visit. What a host's other parameters say, its URL rules learn (``aliases``).
SESSION_VALUES = {
    "s": re.compile(r"[0-9a-fA-F]{32}\Z"),
    "sid": re.compile(_SESSION_VALUE + r"\Z"),
}
#: IIS classic ASP appends random letters: ASPSESSIONIDQQGGQRST.
SESSION_PREFIXES = ("aspsessionid",)
#: Path parameters (``/page;jsessionid=...``) that carry a session id, whatever their
#: value; ``;sid=`` one whose value looks like one.
SESSION_PATH_PARAMETERS = ("jsessionid", "phpsessid")

#: ASP.NET's cookieless session (and anonymous id, forms ticket) path segment:
#: ``/(S(lit3py55t21z5v55vlm25s55))/default.aspx``, new at every visit, so a site's
#: every link a new URL, every cycle.
_COOKIELESS_RE = re.compile(r"/\((?:[A-Z]\([A-Za-z0-9_-]{0,1000}\))+\)(?=/|\Z)")
_DROP_PARAMETERS = TRACKING_PARAMETERS | SESSION_PARAMETERS
_DROP_PREFIXES = TRACKING_PREFIXES + SESSION_PREFIXES
_SESSION_PATH_RE = re.compile(
    r";(?:(?:" + "|".join(SESSION_PATH_PARAMETERS) + r")=[^;/]*"
    r"|sid=" + _SESSION_VALUE + r"(?=[;/]|\Z))",
    re.IGNORECASE,
)
#: Browsers strip C0 controls and spaces around a URL.
_SURROUNDING = "".join(chr(c) for c in range(0x21))
#: A raw input this many times longer than the cap cannot shrink back under it sensibly;
#: refusing it early keeps a hostile page from making us normalize megabytes.
_INPUT_SLACK = 4
_HOST_RE = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\Z")
#: What urlsplit's errors quote of the URL (a netloc with its user:pass@, say): from the
#: first quote to the last, as a password may hold a quote of its own.
_QUOTED_RE = re.compile(r"'.*'", re.S)
_DECIMAL_RE = re.compile(r"[0-9]+\Z")
_HEX_RE = re.compile(r"0[xX][0-9a-fA-F]*\Z")
_OCTAL_RE = re.compile(r"[0-7]+\Z")
#: The most significant digits of an IPv4 number, by base: 4294967295, 0o37777777777,
#: 0xffffffff (a browser reads zeros in front of octal and hex as padding).
_MAX_DIGITS = {10: 10, 8: 11, 16: 8}
_BEFORE_QUERY_RE = re.compile(r"[^?#]*")


#: URLs that are canonical as they stand: plain http(s), a lower-case ASCII host whose last
#: label starts with a letter (so not a numeric IPv4 spelling) and no label is punycode,
#: an explicit non-default port at most, a path of unreserved characters with no empty,
#: "." or ".." segment, a plain query at most, no fragment. Most links on the small web look
#: like this; canonicalizing them the long way cost ~50 us each, a third of a fetcher's
#: CPU per page (measured by bench/bench_fetcher.py with py-spy).
#: Possessive: a name never holds "=" or "&", a value never "&", so nothing is given
#: back, and a long query that fails is read once.
_PLAIN_PARAMETER = r"[A-Za-z0-9._~-]++(?:=[A-Za-z0-9._~+,:/@!$'()*;-]*+)?+"
_CANONICAL_RE = re.compile(
    r"(?P<scheme>https?)://"
    r"(?P<host>(?:(?!xn--)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*"
    r"(?!xn--)[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?)"
    r"(?::(?P<port>[1-9][0-9]{0,4}))?"
    r"(?P<path>(?:/[A-Za-z0-9_~-][A-Za-z0-9._~-]*|/\.[A-Za-z0-9_~-][A-Za-z0-9._~-]*"
    r"|/\.\.[A-Za-z0-9._~-]+)*/?)"
    # A query of parameters named in unreserved characters, whose values hold only what
    # url-normalize leaves as it is (no "%", no "="): canonical when no parameter is one
    # to drop and they are in order already (``_query_canonical``).
    rf"(?:\?(?P<query>{_PLAIN_PARAMETER}(?:&{_PLAIN_PARAMETER})*+))?"
)


def already_canonical(url: str, max_length: int = MAX_URL_LENGTH) -> bool:
    """True when ``canonicalize(url)`` would return ``url`` unchanged (a cheap, safe test)."""
    return _plainly_canonical(url, max_length) == url


def _plainly_canonical(url: str, max_length: int) -> str | None:
    """``canonicalize(url)`` when ``url`` is canonical but for its plain query's
    parameters to drop (``utm_source``, a session id) or to put in order, worked out
    without the long way (~55 us); None for any other URL."""
    if len(url) > max_length:
        return None
    match = _CANONICAL_RE.fullmatch(url)
    if match is None or not match.group("path") or len(match.group("host")) > 253:
        return None
    port = match.group("port")
    if port is not None:
        number = int(port)
        default = 80 if match.group("scheme") == "http" else 443
        if number == default or number > 65535:
            return None
    query = match.group("query")
    if query is None or _query_canonical(query):
        return url
    # Its values hold nothing url-normalize changes: the long way's query is this one
    # without the parameters it drops, in order of their names.
    kept = _clean_query(query)
    head = url[: match.start("query") - 1]
    return f"{head}?{kept}" if kept else head


#: What ends a URL's authority, and so its userinfo: a backslash too, which
#: ``canonicalize`` reads as a slash.
_AUTHORITY_ENDS = r"/\\?#\r\n"
#: A URL's userinfo (``user:password@``, a token): from ``//`` (``\\``, or JSON's
#: ``\/\/``) to the last ``@`` of the authority, where ``urlsplit`` finds the host.
_USERINFO = re.compile(rf"((?:\\?/|\\){{2}})[^{_AUTHORITY_ENDS}]*@")
#: An authority with no "@" that is no host[:port] ("admin:Zm9v", where a password's
#: "/" ended it early), and the rest of its word to its last "@": the password's rest.
_CUT_USERINFO = re.compile(
    rf"((?:\\?/|\\){{2}})(?![^{_AUTHORITY_ENDS}@]*@)"
    rf"(?!\[[^\]\s]*\](?::\d{{0,5}})?[{_AUTHORITY_ENDS}]|[^{_AUTHORITY_ENDS}:\[\]\s]*(?::\d{{0,5}})?(?:[{_AUTHORITY_ENDS}]|\s|$))"
    r"[^\s\"'<>]*@"
)


def masked(text: str) -> str:
    """``text`` with each URL's userinfo written ``***``, however the URL is spelled."""
    if "@" not in text:
        return text
    return _CUT_USERINFO.sub(r"\1***@", _USERINFO.sub(r"\1***@", text))


def without_userinfo(url: str) -> str:
    """``url`` without a ``user:pass@`` (or a token's ``name@``): an HTTP client sends it
    on as an Authorization header, and no URL Trove follows or keeps carries one."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _unparsable(exc: ValueError) -> str:
    """urlsplit's complaint without what it quotes of the URL: a refusal's reason is
    kept and logged, and a netloc it quotes may hold a user:pass@."""
    return "unparsable URL: " + _QUOTED_RE.sub("…", str(exc))


def canonicalize(url: str, *, base: str | None = None, max_length: int = MAX_URL_LENGTH) -> str:
    """Return the canonical form of ``url`` (resolved against ``base`` when given).

    Raises InvalidURL, whose ``reason`` says why, for anything Trove will not crawl.
    Idempotent: ``canonicalize(canonicalize(u)) == canonicalize(u)``.
    """
    if base is None:
        # A fragment (``#comments``, a skip link's ``#content``: a tenth of a blog's
        # links) is only dropped: the long way drops it before anything else reads the
        # URL, and refuses only an input this long.
        head, hashmark, _ = url.partition("#")
        if not hashmark or len(url) <= _INPUT_SLACK * max_length:
            plain = _plainly_canonical(head, max_length)
            if plain is not None:
                return plain
    return _canonicalize(url, base=base, max_length=max_length)


def _query_canonical(query: str) -> bool:
    """Whether ``_clean_query`` keeps ``query`` (a ``_CANONICAL_RE`` query) as it is: no
    parameter to drop (nor one dropped for its value) and the names in order."""
    last = ""
    for parameter in query.split("&"):
        name, _, value = parameter.partition("=")
        lowered = name.lower()
        if lowered in _DROP_PARAMETERS or lowered.startswith(_DROP_PREFIXES) or name < last:
            return False
        session = SESSION_VALUES.get(lowered)
        if session is not None and session.match(value):
            return False
        last = name
    return True


def _canonicalize(url: str, *, base: str | None, max_length: int) -> str:
    if len(url) > _INPUT_SLACK * max_length:
        raise InvalidURL(f"URL longer than {max_length} characters")
    text = url.strip(_SURROUNDING).replace("\t", "").replace("\n", "").replace("\r", "")
    if not text and base is None:
        raise InvalidURL("empty URL")
    text = backslashes_as_slashes(text)
    try:
        if base is not None:
            text = urljoin(base, text)
        scheme, netloc, path, query, _fragment = urlsplit(text)
    except ValueError as exc:
        raise InvalidURL(_unparsable(exc)) from None
    scheme = scheme.lower()
    if not scheme:
        raise InvalidURL("no scheme (expected http:// or https://)")
    if scheme not in ("http", "https"):
        raise InvalidURL(f"scheme {scheme!r} is not http or https")
    # An "@" further on: the "port" may be a password cut short by its "/", "?" or "#",
    # and a refusal is logged and recorded for good.
    host, port = _split_authority(netloc, quote_port="@" not in f"{path}{query}{_fragment}")
    if not host:
        raise InvalidURL("no host")
    _fits_dns_before_idna(host)
    authority = f"{host}:{port}" if port else host
    try:
        parts = urlsplit(_url_normalize(urlunsplit((scheme, authority, path, query, ""))))
    except ValueError as exc:  # UnicodeError (IDNA) is a ValueError
        raise InvalidURL(f"host {host!r} is not a valid host name ({exc})") from None
    canonical_host = _canonical_host(parts.hostname or "", bracketed=host.startswith("["))
    canonical_port = f":{parts.port}" if parts.port else ""
    path = parts.path
    if ";" in path:
        stripped = _SESSION_PATH_RE.sub("", path)
        if stripped != path:
            # Removing a parameter can expose a dot segment ("/a/.;sid=1/b"): once more.
            path = urlsplit(_url_normalize(f"{scheme}://{canonical_host}{stripped}")).path
    if "/(" in path:  # after the parameters: "/(S(x));jsessionid=1/" is a segment then
        path = _COOKIELESS_RE.sub("", path) or "/"
    result = urlunsplit(
        (scheme, canonical_host + canonical_port, path, _clean_query(parts.query), "")
    )
    if len(result) > max_length:
        raise InvalidURL(f"URL longer than {max_length} characters")
    return result


def backslashes_as_slashes(url: str) -> str:
    """``url`` with each backslash before its query or fragment a slash, as the URL
    standard and browsers read an http(s) URL (Windows-made paths; two of them begin
    another host): urlsplit and urljoin do not."""
    if "\\" not in url:
        return url
    head = _BEFORE_QUERY_RE.match(url)
    assert head is not None  # [^?#]* always matches
    return head.group().replace("\\", "/") + url[head.end() :]


def _url_normalize(url: str) -> str:
    normalized = url_normalize(url)
    assert normalized is not None  # only None for None
    return normalized


def _split_authority(netloc: str, *, quote_port: bool = True) -> tuple[str, str]:
    """Host and port of ``[userinfo@]host[:port]``; the port without a default check.
    ``quote_port``: a port that is no port is quoted in the refusal; when not, the
    refusal says why without it (it may be a password cut short by its "/")."""
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):
        end = hostport.find("]")
        host, rest = hostport[: end + 1], hostport[end + 1 :]
        if end < 0 or (rest and not rest.startswith(":")):
            raise InvalidURL(f"host {hostport!r} is not a valid IPv6 literal")
        port = rest[1:]
    else:
        host, _, port = hostport.partition(":")
    if port:
        # Before int(), which refuses more than 4,300 digits with a ValueError.
        number = int(port) if port.isascii() and port.isdigit() and len(port) <= 5 else -1
        if not 0 < number <= 65535:
            if not quote_port:
                raise InvalidURL(
                    "the port is not a number from 1 to 65535"
                    " (a password's / ? or # is written %2F %3F %23)"
                )
            if number == 0 or number > 65535:
                raise InvalidURL(f"port {number} is out of range")
            if port.isascii() and port.isdigit():
                raise InvalidURL(f"port {port[:20]!r}... is longer than 5 digits")
            raise InvalidURL(f"port {port[:20]!r} is not a number")
        port = str(number)
    return host, port


#: The dots IDNA reads as label separators.
_IDNA_DOTS = re.compile("[.\u3002\uff0e\uff61]")
#: What IDNA's mapping drops from a name (stringprep's table B.1: soft hyphen, joiners,
#: variation selectors...), and its default ignorables, which UTS 46 drops too.
_IDNA_DROPPED = re.compile(
    "[\u00ad\u034f\u1806\u180b-\u180f\u200b-\u200d\u2060-\u2064\ufe00-\ufe0f\ufeff"
    "\U000e0000-\U000e0fff]"
)


def _fits_dns_before_idna(host: str) -> None:
    """Refuse an internationalized host longer than DNS allows before it is encoded:
    encoding costs ~10 µs a character (a seed of 10,000 hosts of 2,000 characters held
    discovery's loop for minutes). The name is first mapped as IDNA maps it, at C's
    speed (NFKC composes letters and folds full-width ones; what it drops, dropped), and
    its ASCII form is never shorter than the characters left (Punycode writes each
    one), so the check after encoding would refuse it anyway."""
    if host.isascii() and "%" not in host:
        # As refused after normalizing, which encodes each label with idna (a host of a
        # thousand labels: 3 ms, and a page may hold a thousand such links).
        name = host.rstrip(".")
    else:
        name = _IDNA_DROPPED.sub("", unicodedata.normalize("NFKC", unquote(host)))
    if len(name) > 253 or any(len(label) > 63 for label in _IDNA_DOTS.split(name)):
        raise InvalidURL(f"host {name[:100]!r}... is too long for DNS")


def _canonical_host(host: str, *, bracketed: bool) -> str:
    if bracketed:
        if "%" in host:
            raise InvalidURL("IPv6 zone identifiers are not allowed")
        try:
            return f"[{ipaddress.IPv6Address(host).compressed}]"
        except ValueError:
            raise InvalidURL(f"host [{host}] is not a valid IPv6 address") from None
    if not host:
        raise InvalidURL("no host")
    if _ends_in_number(host):
        address = _parse_ipv4(host)
        if address is None:
            raise InvalidURL(f"host {host} is not a valid IPv4 address")
        return str(address)
    if not _HOST_RE.match(host):
        raise InvalidURL(f"host {host!r} has characters not allowed in a host name")
    if len(host) > 253 or any(len(label) > 63 for label in host.split(".")):
        raise InvalidURL(f"host {host!r} is too long for DNS")
    _check_idna(host)
    return host


def _check_idna(host: str) -> None:
    """Refuse an internationalized name that httpx would refuse when fetching it.

    url-normalize falls back to Python's IDNA 2003 codec for what IDNA 2008 refuses, so
    ``💩.la`` comes out as ``xn--ls8h.la``, which httpx cannot decode (its ``URL.host``
    applies ``idna.decode``): the page could never be fetched, and the failure looked
    like a site that was down. A plain ASCII name is left as it is, as httpx leaves it
    (``r3---sn-x.example``, ``a_b.example`` are fetched by every browser and by httpx;
    IDNA's hyphen and letter rules are for internationalized names).
    """
    if not (host.startswith("xn--") or ".xn--" in host):
        return
    try:
        idna.decode(host)
        idna.encode(host, uts46=True)
    except idna.IDNAError as exc:  # InvalidCodepoint and friends are IDNAErrors
        raise InvalidURL(
            f"host {host!r} is not a valid internationalized name (IDNA 2008): {exc}"
        ) from None


def _ends_in_number(host: str) -> bool:
    last = host.rstrip(".").rpartition(".")[2]
    return bool(_DECIMAL_RE.match(last) or _HEX_RE.match(last))


def _parse_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """Parse an IPv4 host the way the WHATWG URL standard (so every browser) does.

    ``127.1``, ``0x7f.0.0.1``, ``0177.0.0.1`` and ``2130706433`` are all 127.0.0.1.
    """
    labels = host.rstrip(".").split(".")
    if len(labels) > 4:
        return None
    numbers: list[int] = []
    for label in labels:
        if _HEX_RE.match(label):
            digits, base = label[2:].lstrip("0"), 16
        elif len(label) > 1 and label[0] == "0" and _OCTAL_RE.match(label):
            digits, base = label[1:].lstrip("0"), 8
        elif _DECIMAL_RE.match(label):
            digits, base = label, 10
        else:
            return None
        if len(digits) > _MAX_DIGITS[base]:
            # Too big for an address however it is read, and int() refuses a decimal
            # string of more than 4,300 digits with a ValueError.
            return None
        numbers.append(int(digits or "0", base))
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(numbers)):
        return None
    value = last
    for index, number in enumerate(head):
        value += number * 256 ** (3 - index)
    return ipaddress.IPv4Address(value)


def _clean_query(query: str) -> str:
    if not query:
        return ""
    kept: list[tuple[str, str]] = []
    for parameter in query.split("&"):
        if not parameter:
            continue
        name, _, value = parameter.partition("=")
        lowered = name.lower()
        if lowered in _DROP_PARAMETERS or lowered.startswith(_DROP_PREFIXES):
            continue
        session = SESSION_VALUES.get(lowered)
        if session is not None and session.match(value):
            continue
        kept.append((name, parameter))
    kept.sort(key=lambda pair: pair[0])  # sort is stable: equal names keep their order
    return "&".join(parameter for _, parameter in kept)


#: A lower-case name with at most a numeric port and nothing else in the authority: its
#: host is the match, as urlsplit would say (a test holds the two to each other). Its
#: last label starts with a letter, so it is no address (which ends in a number) and
#: needs no other look; a trailing dot is left to urlsplit. Possessive, so that a
#: hostile authority is read once, not backtracked over.
_PLAIN_NAME = re.compile(r"https?://((?:[a-z0-9-]*+\.)*+[a-z][a-z0-9-]*+)(?::[0-9]+)?(?=[/?#]|\Z)")


def domain_of(url: str) -> str:
    """The lower-case host of a URL (IPv6 without brackets): the politeness key.

    The port is not part of it: two ports of one host are one server to be polite to,
    nor a trailing dot (``example.com.`` is ``example.com``). A redirect hop is not
    canonicalized, and may name its server in any spelling of its address
    (``1572395042``, ``0x5db8d822``, ``93.0xb8.216.34``; ``2001:0db8:0:0::1``): an
    address is given as a canonical URL writes it, so that every spelling waits for the
    one server's gap. Discovery asks this of every link: plain authorities skip
    urlsplit, and a host whose last label starts with a letter is no address. A host
    longer than DNS allows that is no address names no server: InvalidURL, as no host.
    """
    plain = _PLAIN_NAME.match(url)
    if plain is not None:
        key = plain.group(1)
    else:
        try:
            host = urlsplit(url).hostname or ""
        except ValueError as exc:
            raise InvalidURL(_unparsable(exc)) from None
        host = host.rstrip(".")
        if not host:
            raise InvalidURL("no host")
        key = _address_key(host)
    if len(key) > 253:
        raise InvalidURL(f"host {key[:100]!r}... is too long for DNS")
    return key


def _address_key(host: str) -> str:
    """The canonical spelling of the address ``host`` writes, or ``host`` if it is none."""
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host).compressed
        except ValueError:
            return host
    address = _parse_ipv4(host) if _ends_in_number(host) else None
    return host if address is None else str(address)


@functools.cache
def _extractor() -> tldextract.TLDExtract:
    # Imported here: only discovery asks for registrable domains, and tldextract brings
    # requests with it: 6 MB of a fetcher's or a recorder's memory, for nothing.
    import tldextract

    # No suffix_list_urls and no cache_dir: the snapshot bundled with tldextract, never
    # the network and never the disk. Private suffixes (github.io, blogspot.com) count,
    # so a DOMAIN scope on one user's site does not spread to every user's.
    return tldextract.TLDExtract(
        suffix_list_urls=(), cache_dir=None, include_psl_private_domains=True
    )


@functools.lru_cache(maxsize=65_536)
def registrable_domain(host: str) -> str:
    """The registrable domain of ``host``: ``blog.example.co.uk`` -> ``example.co.uk``.

    Uses the public suffix list snapshot bundled with tldextract (offline), private
    suffixes included (``alice.github.io`` stays ``alice.github.io``). An IP address is
    its own registrable domain; a host without a known suffix (``*.test``, ``localhost``,
    a bare public suffix) gives its last two labels, or itself when it has fewer.
    """
    name = host.lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if _ip_address(name) is not None:
        return name
    domain = _extractor().extract_str(name).top_domain_under_public_suffix
    if domain:
        return domain
    return ".".join(name.split(".")[-2:])


#: What ``localhost`` and ``*.localhost`` resolve to in the fetcher (``trove_fetcher.dns``),
#: which refuses a name when any of its addresses is refused.
_LOCALHOST_ADDRESSES = (ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1"))


def is_private_host(host: str, allowed: Sequence[str] = (), nat64: Sequence[str] = ()) -> bool:
    """True when the fetcher would refuse ``host`` under the ``allowed`` networks.

    Discovery and the timeline reader drop such a URL rather than queue a page that
    could never be fetched (each a failed attempt, retried and rechecked for weeks).
    ``host`` is a literal: an IP address (IPv6 with or without brackets, IPv4 also in
    the forms browsers accept), judged by the fetcher's own rule
    (``trove_schema.addresses.refusal``), or a name. Names are not resolved here, the
    fetcher checks the addresses it connects to; only ``localhost`` and ``*.localhost``
    are known without a lookup: the fetcher resolves them to both 127.0.0.1 and ::1, so
    they are private unless ``allowed`` opens both. ``allowed`` holds CIDRs and
    ``nat64`` the network's NAT64 prefixes (``TROVE_NAT64_PREFIXES``; ValueError if one
    is not, when an address is asked about).
    """
    name = host.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name == "localhost" or name.endswith(".localhost"):
        networks = parse_networks(tuple(allowed))
        return any(refusal(address, networks) is not None for address in _LOCALHOST_ADDRESSES)
    if ":" not in name and not _ends_in_number(name):
        return False  # a name: no address is written so (and ip_address's refusal is dear)
    address = _written_address(name)
    if address is None:
        return False
    prefixes = parse_nat64_prefixes(tuple(nat64))
    return refusal(address, parse_networks(tuple(allowed)), prefixes) is not None


def _written_address(name: str) -> IPAddress | None:
    """The address ``name`` writes, as the fetcher reads it (an IPv6 zone dropped), or
    None for a name."""
    try:
        return parse_address(name)
    except ValueError:
        pass
    return _parse_ipv4(name) if _ends_in_number(name) else None


def _ip_address(name: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        pass
    if _ends_in_number(name):
        return _parse_ipv4(name)
    return None


def canonicalize_or_none(url: str, *, base: str | None = None) -> str | None:
    """The canonical form, or None for a URL Trove will not crawl (links found on pages)."""
    if not url:
        return None
    try:
        return canonicalize(url, base=base)
    except InvalidURL:
        return None


def fetchable(url: str) -> str | None:
    """Why ``url`` cannot be fetched, or None when it can.

    The one definition of a fetchable URL, shared by discovery (seeds and links go
    through ``canonicalize``) and the fetcher, whose work may come from events written
    before a rule was added (an emoji host accepted once): a URL is fetchable when
    ``canonicalize`` accepts it. Its spelling may differ from today's canonical one.
    """
    try:
        canonicalize(url)
    except InvalidURL as exc:
        return exc.reason
    return None


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of a canonical URL: the scope of its robots.txt."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
