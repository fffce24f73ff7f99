"""A response's media type, as its Content-Type header gives it."""

from __future__ import annotations


def media_type(content_type: str | None) -> str | None:
    """The lower-cased ``type/subtype`` of a Content-Type header (``text/html`` from
    ``Text/HTML; charset=utf-8``), without parameters; None when absent or empty.

    A header sent twice reaches the client joined (``text/html, text/html;
    charset=utf-8``): as browsers do (WHATWG's "extract a MIME type"), the last value
    that is a type counts, else every page of such a server would go unread."""
    if not content_type:
        return None
    values = content_type.split(",") if "," in content_type else [content_type]
    types = [value for value in values if "/" in value.split(";", 1)[0]]
    value = (types[-1] if types else values[-1]).split(";", 1)[0].strip().lower()
    return value or None
