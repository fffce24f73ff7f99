"""Turning a response body into text: which charset, and never an exception.

The order is the HTTP header's ``charset``, a byte order mark, a ``<meta>`` declaration
in the first 2 KB (outside comments), the XML declaration, then a fallback (UTF-8 if
the bytes are UTF-8, else windows-1252). One deviation from a plain "header first": a
BOM beats the header, as it does in browsers (the WHATWG encoding sniffing algorithm).
A BOM is in the bytes themselves, while a header charset is often a server-wide default
nobody checked.

A declared charset that the bytes do not fit is still used, with U+FFFD for the bytes
that do not decode: the usual cause is a body cut at the size limit in the middle of a
character, and re-guessing the whole page from one broken byte would garble the rest.
"""

from __future__ import annotations

import codecs
import encodings
import encodings.aliases
import pkgutil
import re
from collections.abc import Callable

from trove_schema.media import charset_label, media_type

#: How far into the body ``<meta charset>`` is looked for (the HTML spec's prescan uses 1024).
META_SCAN_BYTES = 2048

_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
)

# The HTML standard's prescan, as far as a page's declaration needs it, token by token:
# a comment is skipped (templates keep an old Latin-1 declaration commented out above
# the real one; "<!-->" and "<!--->" end where they begin), a tag's quoted values are
# its own (a "<!--" in a title attribute begins no comment), and a ``content`` is read
# for its charset only on a ``http-equiv="content-type"`` (a description may say
# "charset=big5"). Group 1: a meta tag's attributes.
_PRESCAN = re.compile(
    rb"<!--(?:-?>|.*?-->|.*\Z)"
    rb"|<meta[\s/]((?:[^>\"']|\"[^\"]*\"?|'[^']*'?)*)"
    rb"|</?[A-Za-z](?:[^>\"']|\"[^\"]*\"?|'[^']*'?)*"
    rb"|<[!/?][^>]*",
    re.IGNORECASE | re.DOTALL,
)
_ATTRIBUTE = re.compile(rb"""([^\s"'>/=]+)(?:\s*=\s*(?:"([^"]*)"?|'([^']*)'?|([^\s>]*)))?""")
_CHARSET_IN_CONTENT = re.compile(
    rb"""charset\s*=\s*["']?\s*([A-Za-z0-9_:.+-]{1,40})""", re.IGNORECASE
)
_XML_DECL_ENCODING = re.compile(
    rb"""\A\s*<\?xml\s[^>]{0,200}?encoding\s*=\s*["']([A-Za-z0-9_.:+-]{1,40})["']""",
    re.IGNORECASE,
)

# Codecs Python knows that are no way to read a web page: they raise on any input, would
# turn "\u0041"-style sequences into characters, or are not supported by browsers either.
_REFUSED = frozenset(
    {"undefined", "idna", "punycode", "unicode-escape", "raw-unicode-escape", "utf-7"}
)

# Labels browsers read as a superset encoding (WHATWG), since servers say "iso-8859-1"
# for pages that use the windows-1252 quotes and dashes in 0x80-0x9F.
_SUPERSETS = {"ascii": "cp1252", "iso8859-1": "cp1252", "iso8859-9": "cp1254"}


def _labels(codec: str, labels: str) -> dict[str, str]:
    return dict.fromkeys(labels.split(), codec)


# The WHATWG Encoding Standard's labels whose encoding is not the codec Python gives the
# same name: Japanese, Korean, Chinese and Thai pages are written in Microsoft's
# supersets ("Shift_JIS" pages hold cp932's ①, "gb2312" ones GBK's characters), which
# browsers decode them with, and some labels Python does not know at all.
_WHATWG = {
    **_labels("cp932", "csshiftjis ms932 ms_kanji shift-jis shift_jis sjis windows-31j x-sjis"),
    **_labels(
        "cp949",
        "cseuckr csksc56011987 euc-kr iso-ir-149 korean ks_c_5601-1987 ks_c_5601-1989 "
        "ksc5601 ksc_5601 windows-949",
    ),
    **_labels(
        "gb18030",
        "chinese csgb2312 csiso58gb231280 gb2312 gb_2312 gb_2312-80 gbk iso-ir-58 x-gbk gb18030",
    ),
    **_labels("big5hkscs", "big5 big5-hkscs cn-big5 csbig5 x-x-big5"),
    **_labels("cp874", "dos-874 iso-8859-11 iso8859-11 iso885911 tis-620 windows-874"),
    **_labels("euc_jp", "cseucpkdfmtjapanese euc-jp x-euc-jp"),
    **_labels(
        "cp1252",
        "ansi_x3.4-1968 ascii cp1252 cp819 csisolatin1 ibm819 iso-8859-1 iso-ir-100 "
        "iso8859-1 iso88591 iso_8859-1 iso_8859-1:1987 l1 latin1 us-ascii windows-1252 "
        "x-cp1252",
    ),
    **_labels(
        "cp1254",
        "cp1254 csisolatin5 iso-8859-9 iso-ir-148 iso8859-9 iso88599 iso_8859-9 "
        "iso_8859-9:1989 l5 latin5 windows-1254 x-cp1254",
    ),
    **_labels("utf-8", "unicode-1-1-utf-8 unicode11utf8 unicode20utf8 utf-8 utf8 x-unicode20utf8"),
    **{f"x-cp125{n}": f"cp125{n}" for n in range(9)},
    **{f"iso8859{n}": f"iso8859_{n}" for n in (2, 3, 4, 5, 6, 7, 8, 10, 13, 14, 15)},
    **_labels("iso8859_6", "csiso88596e csiso88596i iso-8859-6-e iso-8859-6-i"),
    **_labels("iso8859_7", "sun_eu_greek"),
    # The -i (logical) and -e (visual) forms only tell a renderer the text's direction:
    # the bytes map to the same characters.
    **_labels("iso8859_8", "csiso88598e csiso88598i iso-8859-8-e iso-8859-8-i logical visual"),
    **_labels("iso8859_15", "csisolatin9"),
    **_labels("koi8_r", "cskoi8r koi koi8"),
    **_labels("koi8_u", "koi8-ru"),
    **_labels("mac_roman", "csmacintosh mac macintosh x-mac-roman"),
    **_labels("mac_cyrillic", "x-mac-cyrillic x-mac-ukrainian"),
    # Windows' names for UTF-16, which browsers read as little-endian without a BOM.
    **_labels("utf-16-be", "unicodefffe"),
    **_labels("utf-16-le", "csunicode iso-10646-ucs-2 ucs-2 unicode unicodefeff utf-16"),
}

# Every name Python's codec search finds a codec by (its aliases and its codec modules),
# spelled as the search spells a label (``codecs.lookup``: runs of anything but ASCII
# letters, digits and dots become one "_", lower case). Only these are looked up: the
# search remembers each name it did not find for the life of the process
# (``encodings._cache``, after a failed import), and pages can name any of billions.
_CODEC_ALIASES = frozenset(encodings.aliases.aliases)
_CODEC_NAMES = _CODEC_ALIASES | {module.name for module in pkgutil.iter_modules(encodings.__path__)}
_NOT_IN_CODEC_NAMES = re.compile(r"[^A-Za-z0-9.]+")

_XML_TYPES = frozenset(
    {"application/xml", "text/xml", "application/rss+xml", "application/atom+xml"}
)


def normalize_charset(label: str | None) -> str | None:
    """Python's codec name for a charset label, or None if it is not a usable text codec."""
    if not label:
        return None
    label = label.strip().strip("\"'").strip()
    if not label or len(label) > 40:
        return None
    whatwg = _WHATWG.get(label.lower())
    if whatwg is not None:
        return whatwg
    key = _NOT_IN_CODEC_NAMES.sub("_", label).strip("_").lower()
    if key not in _CODEC_NAMES and key.replace(".", "_") not in _CODEC_ALIASES:
        return None
    try:
        name = codecs.lookup(key).name
        b"".decode(name)  # raises LookupError for bytes-to-bytes codecs (base64, zlib, ...)
    except (LookupError, UnicodeError, ValueError):
        return None
    if name in _REFUSED:
        return None
    return _SUPERSETS.get(name, name)


def header_charset(content_type: str | None) -> str | None:
    """The charset parameter of a Content-Type header (of the value its media type is
    taken from: ``trove_schema.media``), if usable."""
    return normalize_charset(charset_label(content_type))


def bom_charset(body: bytes) -> tuple[str, int] | None:
    """The charset a byte order mark announces, and the BOM's length."""
    for bom, name in _BOMS:
        if body.startswith(bom):
            return name, len(bom)
    return None


def _declared(attributes: bytes) -> bytes | None:
    """The charset label one ``<meta>`` tag declares: its ``charset``, or the charset in
    the ``content`` of a ``http-equiv="content-type"``; the first of a name counts."""
    found: dict[bytes, bytes] = {}
    for match in _ATTRIBUTE.finditer(attributes):
        value = next((v for v in match.group(2, 3, 4) if v is not None), b"")
        found.setdefault(match.group(1).lower(), value)
    if b"charset" in found:
        return found[b"charset"].strip() or None
    if found.get(b"http-equiv", b"").strip().lower() != b"content-type":
        return None
    label = _CHARSET_IN_CONTENT.search(found.get(b"content", b""))
    return label.group(1) if label is not None else None


def meta_charset(body: bytes) -> str | None:
    """The charset of the first ``<meta>`` declaration in the first 2 KB, outside
    comments, if usable."""
    for token in _PRESCAN.finditer(body, 0, META_SCAN_BYTES):
        attributes = token.group(1)
        if attributes is not None and (label := _declared(attributes)) is not None:
            break
    else:
        return None
    name = normalize_charset(label.decode("ascii", "replace"))
    # A page whose meta we could read as ASCII is not UTF-16/32 (WHATWG says: use UTF-8).
    if name is not None and name.startswith(("utf-16", "utf-32")):
        return "utf-8"
    return name


def xml_declared_charset(body: bytes) -> str | None:
    """The encoding of a leading ``<?xml ... encoding="..."?>`` declaration, if usable."""
    match = _XML_DECL_ENCODING.match(body, 0, 512)
    if match is None:
        return None
    name = normalize_charset(match.group(1).decode("ascii", "replace"))
    if name is not None and name.startswith(("utf-16", "utf-32")):
        return "utf-8"
    return name


def _decode(body: bytes, encoding: str) -> str | None:
    try:
        return body.decode(encoding)
    except UnicodeDecodeError:
        pass
    except (LookupError, UnicodeError, ValueError):
        return None
    try:
        return body.decode(encoding, "replace")
    except (LookupError, UnicodeError, ValueError):
        return None


def _fallback(body: bytes) -> tuple[str, str]:
    # Incremental, so a body cut inside a multi-byte character still counts as UTF-8.
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        text = decoder.decode(body, final=False)
    except UnicodeDecodeError:
        return body.decode("cp1252", "replace"), "cp1252"
    if decoder.getstate()[0]:
        text += "\ufffd"
    return text, "utf-8"


def decode_body(body: bytes, content_type: str | None) -> tuple[str, str]:
    """Decode a response body: returns the text and the codec used. Never raises."""
    bom = bom_charset(body)
    if bom is not None:
        name, skip = bom
        return body[skip:].decode(name, "replace"), name

    # Looked for in turn: a page whose header says needs no scan of its head.
    declared: list[Callable[[], str | None]] = [lambda: header_charset(content_type)]
    if media_type(content_type) not in _XML_TYPES:
        declared.append(lambda: meta_charset(body))
    declared.append(lambda: xml_declared_charset(body))
    for candidate in declared:
        label = candidate()
        if label is None:
            continue
        text = _decode(body, label)
        if text is not None:
            return text, label
    return _fallback(body)
