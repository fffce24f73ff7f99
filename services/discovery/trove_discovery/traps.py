"""Crawler-trap defences that need nothing but the URL.

Traps are endless URL spaces: relative links that nest forever (``/a/b/a/b/a/b/...``,
``/x/x/x/...``), generated paths, and faceted searches that pile up query parameters.
These checks catch their shape; depth (``Scope.max_depth``) and the per-host page budget
(kept in NATS KV by the service) catch the rest, such as calendars that go on month
after month with URLs that each look fine.
"""

from __future__ import annotations

import re
from collections import Counter
from urllib.parse import urlsplit

#: More path segments than this is a trap (real sites nest far less).
MAX_PATH_SEGMENTS = 30
#: More query parameters than this is a trap (faceted search run wild).
MAX_QUERY_PARAMETERS = 20

#: The path and query of an ASCII http(s) URL as urlsplit reads them, without its cost
#: (~2.5 us a link not in its cache, which every link of a page is): a lower-case
#: scheme, an authority without brackets, no tab or newline (which urlsplit drops).
#: Any other goes to urlsplit.
_PLAIN_URL = re.compile(
    r"https?://[^/?#\[\]\t\r\n]*+(/[^?#\t\r\n]*+)?+(?:\?([^#\t\r\n]*+))?+(?:#[^\t\r\n]*+)?+\Z"
)


def url_trap_reason(
    url: str,
    *,
    max_length: int,
    max_path_repetitions: int,
    max_path_segments: int = MAX_PATH_SEGMENTS,
    max_query_parameters: int = MAX_QUERY_PARAMETERS,
) -> str | None:
    """Why ``url`` looks like a crawler trap, or None when it does not.

    A path segment that occurs more than ``max_path_repetitions`` times anywhere in the
    path trips the check (``/a/b/a/b/a/b/a/b`` with the default 3), so dates such as
    ``/2024/01/01/`` do not. Segments are compared exactly: path case matters.
    """
    if len(url) > max_length:
        return f"URL longer than {max_length} characters"
    plain = _PLAIN_URL.match(url) if url.isascii() else None
    if plain is not None:
        path, query = plain.group(1) or "", plain.group(2) or ""
    else:
        try:
            _scheme, _netloc, path, query, _fragment = urlsplit(url)
        except ValueError:
            return "unparsable URL"
    segments = [segment for segment in path.split("/") if segment]
    if len(segments) > max_path_segments:
        return f"{len(segments)} path segments (more than {max_path_segments})"
    # Only a path with that many repeats in all can repeat one segment that often: most
    # have none, and skip the count.
    if segments and len(segments) - len(set(segments)) >= max_path_repetitions:
        segment, count = Counter(segments).most_common(1)[0]
        if count > max_path_repetitions:
            return (
                f"path segment {segment!r} repeated {count} times"
                f" (more than {max_path_repetitions})"
            )
    parameters = sum(1 for parameter in query.split("&") if parameter)
    if parameters > max_query_parameters:
        return f"{parameters} query parameters (more than {max_query_parameters})"
    return None
