"""Which language a page is in, with lingua, or None when that is not clear.

Memory decides the configuration. RSS growth of building the detector and classifying
six short texts, measured on Python 3.11 / lingua 2.1:

=====================================  =========
all 75 languages, high accuracy         +1.1 GB  (+1.25 GB with preloading)
the 28 defaults below, high accuracy   +570 MB
all 75 languages, low accuracy          +73 MB
the 28 defaults below, low accuracy     +36 MB  (what Trove uses)
=====================================  =========

(High accuracy loads its 1- to 5-gram models only once a text under 120 characters
comes along; longer texts use trigrams in either mode. A crawler sees short pages.)
Low accuracy mode is weak on a line or two of text but as good as high accuracy on
the paragraphs of a page, and a page sample is 300 characters (1,000 when those leave
it unsure). Models are loaded lazily, on the first detection, not at import, and shared
by every instance.

Low accuracy confidences saturate quickly (a clear paragraph scores 1.0), so the
threshold is high: below ``MIN_CONFIDENCE`` = 0.9 for the best language the detector
counts as unsure; so does a sample with fewer than ``MIN_LETTERS`` = 20 letters. When
the detector is unsure, a well-formed ``<html lang>`` hint is used instead; when it is
sure, it wins over the hint (templates ship ``lang="en"`` whatever the page is in),
unless the hint names a language this detector cannot recognize: one lingua knows but
this detector was not built with, or one of ISO 639-1 lingua does not know
(Luxembourgish would be told German, Galician Portuguese). A hint that names no language
(``und``, ``zxx``, ``mul``, a local-use ``qaa``) is no hint.

**A page its stop words tell needs no detector.** lingua costs 0.7 to 4 ms a page (its
models are cold in the CPU cache when pages come one at a time), more than the rest of
the extraction together. In the six languages with stop words (``keywords.STOP_WORDS``:
en, fr, de, es, nl, it) most pages say what they are in their most common words. So
the sample is first put to a test (``by_stop_words``): at least ``STOP_MIN_WORDS``
words, at least ``STOP_SHARE`` of them one language's stop words and ``STOP_LEAD``
times the share of any other list's, and no letter outside that language's
``LETTERS``. A language that passes is the page's when its ``<html lang>`` is absent or
agrees; anything else (no language passes, or the hint says another) goes to the
detector as before, so a template's ``lang="en"`` over a German page is still found
German by lingua. Portuguese fails the Spanish test by its letters (ã, ç), Afrikaans
the Dutch one by ê only sometimes.

Measured on lingua's own test sentences (``bench/bench_language.py``: 300-character
samples, 24 languages): the test tells 98% of the German samples, 92% of English, 89%
of Dutch, 72% of French, 50% of Spanish and Italian, and never takes a sample of
another of the detector's languages for one of them. It takes 127 of 280 Afrikaans
samples for Dutch, as the default detector, built without Afrikaans, does too; with
looser thresholds Latin passed for Italian and English. A language whose neighbour
(``UNTOLD``) the detector is built with is never told this way. The test costs ~45 µs
a sample, the detector ~740 µs with its models warm.

The detector is shared and thread-safe (lingua's ``LanguageDetector`` is; building it
happens once, under a lock).
"""

from __future__ import annotations

import re
import string
import threading
from collections.abc import Iterable

from lingua import IsoCode639_1, IsoCode639_3, Language, LanguageDetector, LanguageDetectorBuilder

from trove_fetcher.keywords import STOP_WORDS
from trove_schema.text import storable

#: Languages the default detector tells apart (ISO 639-1): Western and Central European
#: languages common on personal sites, plus the big non-Latin scripts. Esperanto and
#: Latin are left out on purpose: their n-gram profiles attract short English snippets.
DEFAULT_LANGUAGES: tuple[str, ...] = (
    "en", "de", "fr", "es", "it", "pt", "nl", "sv", "da", "nb", "fi", "pl", "cs", "sk",
    "hu", "ro", "ca", "tr", "el", "ru", "uk", "ar", "he", "ja", "zh", "ko", "id", "vi",
)  # fmt: skip

#: Characters of body text the detector looks at first, from the start. lingua's time
#: grows with the sample: on the sandbox's pages (low accuracy mode, 28 languages, models
#: hot in the CPU cache) 1.65 ms at 2000 characters, 1.13 ms at 1000, 0.83 ms at 600,
#: 0.45 ms at 300, with the same confident answer for all 200 pages at each size. Inside
#: ``extract``, between lxml and the keywords, the models are cold and each costs about
#: twice that. 300 characters is about fifty words, several sentences: past the length
#: from which lingua is reliable.
SAMPLE_CHARS = 300
#: When the first sample leaves the detector unsure, it looks again at this many.
WIDE_SAMPLE_CHARS = 1000
#: Fewer letters than this and the detector is not asked.
MIN_LETTERS = 20
#: The best language's confidence (0..1) must reach this for the detector to be trusted.
MIN_CONFIDENCE = 0.9

#: The stop-word test wants a sample of at least this many words...
STOP_MIN_WORDS = 20
#: ... of which at least this share are one language's stop words...
STOP_SHARE = 0.15
#: ... at least this many times the share of any other language's (so at most one passes).
STOP_LEAD = 2.0
_ASCII = frozenset(string.ascii_lowercase)
#: The letters of each language with stop words (lower case). A sample with another
#: letter (Portuguese ã, Danish ø, Afrikaans ê) is left to the detector.
LETTERS: dict[str, frozenset[str]] = {
    "en": _ASCII | frozenset("é"),
    "fr": _ASCII | frozenset("àâæçéèêëîïôœùûüÿ"),
    "de": _ASCII | frozenset("äöüßé"),
    "es": _ASCII | frozenset("áéíóúüñ"),
    "nl": _ASCII | frozenset("áéíóúàèëïöü"),
    "it": _ASCII | frozenset("àèéìíîòóùú"),
}
#: Languages whose samples pass for a listed one's in the measurement above: when the
#: detector is built with one of them, the listed language is always left to it.
UNTOLD: dict[str, frozenset[str]] = {
    "nl": frozenset({"af"}),
    "it": frozenset({"la"}),
    "en": frozenset({"la"}),
}
_WORD = re.compile(r"[^\W\d_]+")


def _listed_in() -> dict[str, tuple[str, ...]]:
    listed: dict[str, list[str]] = {}
    for code, words in STOP_WORDS.items():
        for word in words:
            listed.setdefault(word, []).append(code)
    return {word: tuple(codes) for word, codes in listed.items()}


#: Each stop word and the languages that list it.
_LISTED_IN = _listed_in()

_LANG_TAG = re.compile(r"\A([A-Za-z]{2,3})(?:[-_][A-Za-z0-9]{1,8})*\Z")
# Deprecated ISO 639-1 codes still seen in lang attributes; and Norwegian, which lingua
# tells by its written forms: Bokmål, what nine in ten write.
_RENAMED = {"iw": "he", "in": "id", "ji": "yi", "jw": "jv", "mo": "ro", "no": "nb"}
#: ISO 639-2's codes that name no language: undetermined, no linguistic content,
#: several, uncoded; and the range reserved for local use.
_NO_LANGUAGE = frozenset({"und", "zxx", "mul", "mis"})
_LOCAL_USE = re.compile(r"\Aq[a-t][a-z]\Z")
#: ISO 639-1: a two-letter hint is a language's only if it is one of these.
_ISO_639_1_CODES = (
    "aa ab ae af ak am an ar as av ay az ba be bg bi bm bn bo br bs ca ce ch co cr cs cu "
    "cv cy da de dv dz ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he "
    "hi ho hr ht hu hy hz ia id ie ig ii ik io is it iu ja jv ka kg ki kj kk kl km kn ko "
    "kr ks ku kv kw ky la lb lg li ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd "
    "ne ng nl nn no nr nv ny oc oj om or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd se "
    "sg si sk sl sm sn so sq sr ss st su sv sw ta te tg th ti tk tl tn to tr ts tt tw ty "
    "ug uk ur uz ve vi vo wa wo xh yi yo za zh zu"
)
_ISO_639_1 = frozenset(_ISO_639_1_CODES.split())


def primary_tag(lang: str | None) -> str | None:
    """The lower-case primary subtag of a well-formed language tag ("en-GB" -> "en");
    None for one that names no language ("und", "zxx", "mul", "qaa")."""
    if not lang:
        return None
    match = _LANG_TAG.match(lang.strip())
    if match is None:
        return None
    primary = match.group(1).lower()
    if primary in _NO_LANGUAGE or _LOCAL_USE.match(primary):
        return None
    if len(primary) == 3:
        # BCP-47 wants the two-letter code where one exists ("eng" -> "en").
        try:
            language = Language.from_iso_code_639_3(IsoCode639_3.from_str(primary))
        except ValueError:
            return primary
        return language.iso_code_639_1.name.lower()
    return _RENAMED.get(primary, primary)


def _names_a_language(code: str) -> bool:
    """Whether ``code`` is a language lingua knows, or one of ISO 639-1 it does not
    (Luxembourgish, Frisian, Galician...): a language this detector cannot recognize."""
    try:
        IsoCode639_1.from_str(code)
    except ValueError:
        return code in _ISO_639_1
    return True


class LanguageIdentifier:
    """A lazily built lingua detector over a fixed set of languages."""

    def __init__(
        self,
        languages: Iterable[str] = DEFAULT_LANGUAGES,
        *,
        min_confidence: float = MIN_CONFIDENCE,
        min_letters: int = MIN_LETTERS,
        sample_chars: int = SAMPLE_CHARS,
        wide_sample_chars: int = WIDE_SAMPLE_CHARS,
        low_accuracy: bool = True,
        stop_words: bool = True,
    ) -> None:
        codes: list[IsoCode639_1] = []
        for code in languages:
            try:
                iso = IsoCode639_1.from_str(code.strip().lower())
            except ValueError:
                raise ValueError(f"unknown language code {code!r} (want ISO 639-1)") from None
            if iso not in codes:
                codes.append(iso)
        if len(codes) < 2:
            raise ValueError("language detection needs at least two languages")
        self.languages: frozenset[str] = frozenset(code.name.lower() for code in codes)
        self.min_confidence = min_confidence
        self.min_letters = min_letters
        self.sample_chars = sample_chars
        self.wide_sample_chars = max(wide_sample_chars, sample_chars)
        self.low_accuracy = low_accuracy
        #: The languages the stop-word test may tell (see the module's docstring).
        self.told_by_stop_words: frozenset[str] = frozenset(
            code
            for code in STOP_WORDS.keys() & LETTERS.keys() & self.languages
            if stop_words and not UNTOLD.get(code, frozenset()) & self.languages
        )
        self._codes = tuple(codes)
        self._detector: LanguageDetector | None = None
        self._lock = threading.Lock()

    @property
    def built(self) -> bool:
        """Whether the lingua detector exists yet (it is built on the first detection)."""
        return self._detector is not None

    def detector(self) -> LanguageDetector:
        """The lingua detector, built on first use."""
        detector = self._detector
        if detector is None:
            with self._lock:
                detector = self._detector
                if detector is None:
                    builder = LanguageDetectorBuilder.from_iso_codes_639_1(*self._codes)
                    if self.low_accuracy:
                        builder = builder.with_low_accuracy_mode()
                    detector = self._detector = builder.build()
        return detector

    def warm(self) -> None:
        """Build the detector and load its models now.

        lingua loads a detector's models on its first detection, for ~0.3 s that hold
        the GIL: on a page mid-crawl, that stalls the event loop and every lease and
        timer in it. A service pays it at start instead.
        """
        self.detector().compute_language_confidence_values("warm")

    def sample(self, text: str, chars: int | None = None) -> str:
        """The start of ``text``, whitespace collapsed, at most ``chars`` long.

        ``chars`` defaults to ``sample_chars``. Whitespace does not count against it: a
        page's text is its text nodes joined, indentation and all, and a paragraph
        twenty indented ``<div>`` deep starts past its first thousand characters.
        """
        chars = self.sample_chars if chars is None else chars
        # Twice the sample holds it in ordinary text; more only after runs of space.
        window = chars * 2
        while True:
            sample = " ".join(text[:window].split())
            if len(sample) > chars or window >= len(text):
                return sample[:chars]
            window *= 4

    def detect_text(self, text: str) -> str | None:
        """The detector's language for the start of ``text``, or None if it is unsure.

        It looks at ``sample_chars`` first and, when that leaves it unsure and the text
        has more, once more at ``wide_sample_chars``.
        """
        sample = self.sample(text)
        code = self._confident(sample)
        if code is None and self.sample_chars < self.wide_sample_chars:
            wide = self.sample(text, self.wide_sample_chars)
            if len(wide) > len(sample):
                code = self._confident(wide)
        return code

    def by_stop_words(self, text: str) -> str | None:
        """The language whose stop words and letters the start of ``text`` is written
        in, when the test tells one (see the module's docstring); None otherwise."""
        if not self.told_by_stop_words:
            return None
        sample = self.sample(text).lower()
        words = _WORD.findall(sample)
        if len(words) < STOP_MIN_WORDS:
            return None
        counts = dict.fromkeys(STOP_WORDS, 0)
        for word in words:
            for code in _LISTED_IN.get(word, ()):
                counts[code] += 1
        code = max(counts, key=counts.__getitem__)
        own = counts.pop(code)
        if (
            code not in self.told_by_stop_words
            or own < STOP_SHARE * len(words)
            or any(own < STOP_LEAD * other for other in counts.values())
            or not set(filter(str.isalpha, sample)) <= LETTERS[code]
        ):
            return None
        return code

    def _confident(self, sample: str) -> str | None:
        if sum(map(str.isalpha, sample)) < self.min_letters:
            return None
        # lingua takes only what UTF-8 can encode: a lone surrogate (a PDF's, a JSON
        # escape's) raises there.
        values = self.detector().compute_language_confidence_values(storable(sample))
        if not values or values[0].value < self.min_confidence:
            return None
        code: str = values[0].language.iso_code_639_1.name.lower()
        return code

    def detect(self, text: str, *, hint: str | None = None) -> str | None:
        """BCP-47 language of ``text``, using ``hint`` (an ``<html lang>``) when unsure;
        without the detector when the stop-word test tells it and the hint agrees."""
        hinted = primary_tag(hint)
        told = self.by_stop_words(text)
        if told is not None and hinted in (None, told):
            return told
        detected = self.detect_text(text)
        if detected is None:
            return hinted
        if (
            hinted is not None
            and hinted != detected
            and hinted not in self.languages
            and _names_a_language(hinted)
        ):
            return hinted
        return detected


_default = LanguageIdentifier()
_default_lock = threading.Lock()


def configure(
    languages: Iterable[str] = DEFAULT_LANGUAGES,
    *,
    min_confidence: float = MIN_CONFIDENCE,
    low_accuracy: bool = True,
) -> LanguageIdentifier:
    """Replace the shared identifier (at service start, from settings). Raises ValueError."""
    global _default
    identifier = LanguageIdentifier(
        languages, min_confidence=min_confidence, low_accuracy=low_accuracy
    )
    with _default_lock:
        _default = identifier
    return identifier


def default_identifier() -> LanguageIdentifier:
    return _default


def detect_language(text: str, *, hint: str | None = None) -> str | None:
    """BCP-47 language of ``text`` with the shared identifier; see the module docstring."""
    return _default.detect(text, hint=hint)
