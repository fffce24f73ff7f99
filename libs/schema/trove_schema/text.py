"""Storable text: outside text made fit for Postgres (and JSON) where it enters an event.

Seeds, titles, error messages, headers, keywords and URLs come from outside, and some
of what comes is text Postgres cannot store: a NUL byte (``invalid byte sequence for
encoding "UTF8": 0x00``), a lone surrogate (which cannot even be written as UTF-8, so
the event could not be serialized), or a value longer than its column. Every event
field that carries such text has one of the types below, which clean the value on
validation: an event built by a producer and an event decoded by a consumer (old ones
in the stream included) carry only storable text, and no projection has to think
about it.

Cleaning keeps what the operator needs to recognise the input:

* NUL becomes ``␀`` (U+2400 SYMBOL FOR NULL), visible where it was;
* a surrogate code point (never valid on its own in UTF-8) becomes U+FFFD;
* a value over its field's limit is cut and ends with ``…`` (``CUT_MARK``).

Other control characters are stored as they are: Postgres takes them, and they are
what was sent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

#: What a NUL character is shown as.
NUL_MARK = "\u2400"
#: What a surrogate code point is replaced with.
SURROGATE_MARK = "\ufffd"
#: The last character of a value that was cut to its field's limit.
CUT_MARK = "\u2026"

_UNSTORABLE_RE = re.compile("[\x00\ud800-\udfff]")


def _mark(match: re.Match[str]) -> str:
    return NUL_MARK if match.group() == "\x00" else SURROGATE_MARK


def storable(value: str, max_length: int | None = None) -> str:
    """``value`` with NULs and surrogates marked, cut to ``max_length`` (ending in ``…``)."""
    # str.isascii() is O(1) in CPython: most values skip the regex.
    if "\x00" in value or (not value.isascii() and _UNSTORABLE_RE.search(value)):
        value = _UNSTORABLE_RE.sub(_mark, value)
    if max_length is not None and len(value) > max_length:
        value = value[: max_length - len(CUT_MARK)] + CUT_MARK
    return value


def is_storable(value: str) -> bool:
    """True when ``value`` holds no character Postgres refuses (length aside)."""
    return "\x00" not in value and (value.isascii() or _UNSTORABLE_RE.search(value) is None)


@dataclass(frozen=True, slots=True)
class Storable:
    """Field metadata for text from outside: ``Annotated[str, Storable(512)]``.

    The value is cleaned (see the module) before pydantic's own string validation,
    which still checks ``max_length``: with ``cut`` (the default) a longer value is cut
    to fit; without (URLs) it is refused, because a cut URL would name another page.
    Every producer canonicalizes URLs first (``trove_schema.urls``), which never gives
    one over the limit, nor a NUL or a surrogate: their marking is for hand-made and
    old events.
    """

    max_length: int
    cut: bool = True

    def clean(self, value: Any) -> Any:
        # Anything but a string is left to the string validation (and its error).
        if not isinstance(value, str):
            return value
        return storable(value, self.max_length if self.cut else None)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(
            self.clean, core_schema.str_schema(max_length=self.max_length)
        )


@dataclass(frozen=True, slots=True)
class StorableTerms:
    """Field metadata for a bag of short strings (keywords): each cleaned and cut (how
    many the bag holds is the field's own bound).

    Checked after pydantic built the tuple, in one pass over the joined terms: cleaning
    before validation made pydantic turn the JSON array into Python objects first
    (three times slower).
    """

    max_length: int

    def clean(self, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or (is_storable("".join(value)) and max(map(len, value)) <= self.max_length):
            return value
        return tuple(storable(term, self.max_length) for term in value)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        terms = core_schema.tuple_variable_schema(core_schema.str_schema())
        return core_schema.no_info_after_validator_function(self.clean, terms)


@dataclass(frozen=True, slots=True)
class StorableItems:
    """Field metadata for a tuple of dataclass records with one URL-like text ``key`` each
    (links).

    Checked after the records are validated, in one pass over the joined values: a
    validator call per record cost a fifth of decoding a page's ``CrawlCompleted`` (100
    links), and cleaning before validation made pydantic build every record from Python
    objects instead of straight from the JSON (twice as slow). The key is cleaned, never
    cut (see ``Storable``). A surrogate cannot reach it this way, as pydantic's string
    validation refuses one in a length-checked field; producers canonicalize URLs first,
    which percent-encodes everything but ASCII.
    """

    key: str

    def clean(self, value: Any) -> Any:
        texts = [getattr(item, self.key) for item in value]
        if is_storable("".join(texts)):
            return value
        return tuple(
            item if is_storable(text) else replace(item, **{self.key: storable(text)})
            for item, text in zip(value, texts, strict=True)
        )

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.clean, handler(source))
