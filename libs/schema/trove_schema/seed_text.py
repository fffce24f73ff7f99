"""The text form of a seed message: URLs one a line or apart on a line.

Read by discovery (``trove_discovery.seeds``) and written by ``trove seed --force``,
which sends the same URLs in discovery's JSON form: one reading of the text for both.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

#: What ends a line of URLs (LF, CRLF, a lone CR), and what parts two on a line: a space
#: or a tab. Not U+2028, \v or \f, which ``str.splitlines`` and ``str.split`` take for
#: separators: a URL holding one is judged whole (canonicalization escapes or refuses
#: it). A URL holds no space or tab, and the URL parser drops tabs: taken whole, a line
#: "https://a.example<TAB>b.example" was another host.
LINE_ENDS = re.compile(r"\r\n?|\n")
#: The same, in a message not yet decoded (a line that is not UTF-8 is refused alone).
BYTE_LINE_ENDS = re.compile(rb"\r\n?|\n")
_BLANKS = re.compile(r"[ \t]+")


def seed_words(text: str) -> Iterator[str]:
    """The URLs of a text seed message: its lines' words, up to a comment (a word that
    starts with ``#``; a ``#`` inside a URL is part of it)."""
    for line in LINE_ENDS.split(text):
        for word in _BLANKS.split(line.strip()):
            if word.startswith("#"):
                break
            if word:
                yield word
