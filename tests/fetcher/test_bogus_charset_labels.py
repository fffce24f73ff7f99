"""A charset label no codec has leaves nothing behind: Python's codec search remembers
every name it could not find for the life of the process, and pages name what they like."""

from __future__ import annotations

import codecs
import encodings
import encodings.aliases
import uuid

from trove_fetcher.charset import _REFUSED, _SUPERSETS, _WHATWG, decode_body, normalize_charset

LATIN1_CAFE = "café crème".encode("latin-1")


def _misses() -> set[str]:
    """The names Python's codec search remembers it did not find."""
    cache: dict[str, object] = encodings._cache
    return {name for name, found in cache.items() if found is None}


def test_a_bogus_charset_label_from_a_page_is_never_looked_up() -> None:
    remembered = _misses()
    for n in range(100):
        label = f"x-{uuid.uuid4().hex[:16]}.{n}"
        assert normalize_charset(label) is None
        read = [
            decode_body(LATIN1_CAFE, f"text/html; charset={label}"),
            decode_body(f'<meta charset="{label}"><p>'.encode() + LATIN1_CAFE, "text/html"),
            decode_body(
                f'<?xml version="1.0" encoding="{label}"?><rss>'.encode() + LATIN1_CAFE,
                "application/rss+xml",
            ),
        ]
        # Each falls back as an unknown label always did.
        assert all("café crème" in text and codec == "cp1252" for text, codec in read)
    assert _misses() - remembered == set()


def test_every_name_pythons_codecs_know_is_read_as_before() -> None:
    names = set(encodings.aliases.aliases) | set(encodings.aliases.aliases.values())
    spellings = {
        spelling
        for name in names
        for spelling in (name, name.upper(), name.replace("_", "-"), name.replace("_", " "))
    }
    changed: dict[str, tuple[str, str | None]] = {}
    for spelling in sorted(spellings):
        if spelling.lower() in _WHATWG:
            continue  # read as browsers read it, whatever Python calls it
        try:
            wanted = codecs.lookup(spelling).name
            b"".decode(wanted)
        except (LookupError, UnicodeError, ValueError):
            continue  # no codec, or no text codec: never read
        if wanted in _REFUSED:
            continue
        read = normalize_charset(spelling)
        if read != _SUPERSETS.get(wanted, wanted):
            changed[spelling] = (wanted, read)
    assert changed == {}
    assert len(spellings) > 1000
