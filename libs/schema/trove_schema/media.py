"""A response's media type and charset, as its Content-Type header gives them.

A header sent twice reaches the client joined (``text/html, text/html; charset=utf-8``).
It is read as browsers read it (WHATWG's "extract a MIME type"): value by value, commas
inside quotes kept; the last value that is a type counts, with its own charset, or the
charset of an earlier value of the same type when it gives none. Else every page of
such a server would go unread, or be decoded with the charset of a value that lost.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

#: A value's ``charset`` parameter (quoted or not).
_CHARSET = re.compile(r"""charset\s*=\s*["']?\s*([^"';,\s]+)""", re.IGNORECASE)


#: Media types a gzip file is served as: its own, the old one, and the types servers give
#: a file whose extension they do not know (nginx's ``default_type``, S3's default).
GZIP_TYPES = frozenset(
    {"application/gzip", "application/x-gzip", "application/octet-stream", "binary/octet-stream"}
)
#: Types a ``.xml.gz`` is also served as: by the name inside (Python's ``mimetypes`` gives
#: ``text/xml`` and the coding apart, and uploaders that keep only the first send it so).
_XML_TYPES = frozenset({"application/xml", "text/xml"})


def is_gzipped_xml(kind: str | None, url: str) -> bool:
    """Whether an answer of media type ``kind`` from ``url`` is named as a gzip file of XML:
    a path ending ``.xml.gz`` served as one of ``GZIP_TYPES`` or as XML. Sitemaps are
    often served so (the protocol allows it, and a site's list of 50,000 URLs compresses
    tenfold); the body's first bytes tell whether it is still packed. Any other ``.gz``
    (a release's ``.tar.gz``, a dump) is a download, never read."""
    if kind not in GZIP_TYPES and kind not in _XML_TYPES:
        return False
    try:
        path = urlsplit(url).path
    except ValueError:
        return False
    return path.lower().endswith(".xml.gz")


def media_type(content_type: str | None) -> str | None:
    """The lower-cased ``type/subtype`` of a Content-Type header (``text/html`` from
    ``Text/HTML; charset=utf-8``), without parameters; None when absent or empty."""
    return _parsed(content_type)[0]


def charset_label(content_type: str | None) -> str | None:
    """The charset label the header gives its media type, as it was written."""
    return _parsed(content_type)[1]


def _parsed(content_type: str | None) -> tuple[str | None, str | None]:
    if not content_type:
        return None, None
    if "," not in content_type:  # one value, nearly always
        value = content_type.split(";", 1)[0].strip().lower() or None
        match = _CHARSET.search(content_type)
        return value, (match.group(1) if match else None)
    essence: str | None = None
    charset: str | None = None
    for value in _values(content_type):
        kind = value.split(";", 1)[0].strip().lower()
        if "/" not in kind:
            continue  # not a type: passed over, as browsers do
        match = _CHARSET.search(value)
        if kind != essence:
            essence, charset = kind, (match.group(1) if match else None)
        elif match:
            charset = match.group(1)
    if essence is None:  # no value is a type: what the header says, as it says it
        return content_type.split(";", 1)[0].strip().lower() or None, None
    return essence, charset


def _values(header: str) -> list[str]:
    """The comma-separated values of a joined header; a comma inside quotes is text."""
    values: list[str] = []
    current: list[str] = []
    quoted = False
    for char in header:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            values.append("".join(current))
            current = []
        else:
            current.append(char)
    values.append("".join(current))
    return values
