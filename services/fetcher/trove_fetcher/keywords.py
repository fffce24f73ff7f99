"""A page's keywords: a bounded bag of terms for a Postgres tsvector.

Trove stores signals, not content, so the result is chosen to be useless for rebuilding
the page: distinct terms only, sorted alphabetically, without counts or positions, at
most ``MAX_KEYWORDS`` of them.

Terms are lower-cased runs of Unicode letters, 3 to 40 long, minus the stop words of
the page's language (English, French, German, Spanish, Dutch and Italian have a list;
other languages lose none). Title terms are always kept; the rest of the room goes to
the most frequent body terms, ties broken alphabetically.

Scripts written without spaces between words (Chinese, Japanese kana, Thai, Lao,
Khmer, Myanmar, Tibetan) yield no terms: without a dictionary a run of them is a
phrase, often a whole sentence, which is exactly what must not be stored.
"""

from __future__ import annotations

import heapq
import re
import unicodedata
from collections import Counter

from trove_schema.events import MAX_KEYWORDS

MIN_TERM_LENGTH = 3
MAX_TERM_LENGTH = 40

_UNSEGMENTED = (
    "\u0e00-\u0eff"  # Thai, Lao
    "\u0f00-\u0fff"  # Tibetan
    "\u1000-\u109f"  # Myanmar
    "\u1780-\u17ff"  # Khmer
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # Han
    "\U00020000-\U0003134f"  # Han, supplementary planes
)
# A run of letters: word characters that are not digits, "_" or from _UNSEGMENTED.
_LETTERS = re.compile(rf"[^\W\d_{_UNSEGMENTED}]+")
# ASCII non-letters to spaces, as a byte table over UTF-8 (its multi-byte sequences are
# all >= 0x80 and pass through): then an ASCII word is a run of letters and needs only
# str.split. bytes.translate is a table look-up per byte; str.translate with a dict is
# ~20x slower, and a regular expression over the whole text ~3x.
_ASCII_SEPARATORS = bytes(c if c >= 128 or chr(c).isalpha() else 32 for c in range(256))


def _words(*lines: str) -> frozenset[str]:
    return frozenset(word for line in lines for word in line.split())


STOP_WORDS: dict[str, frozenset[str]] = {
    "en": _words(
        "the and for are but not you all any can had her was one our out has him his how",
        "its now who did she too about above after",
        "again against also because been before being below between both could does doing",
        "down during each few from further have having here hers herself himself into",
        "itself just more most myself nor off once only other ours ourselves over own same",
        "should some such than that their theirs them themselves then there these they",
        "this those through under until very were what when where which while whom why",
        "will with would yours yourself yourselves your yes upon",
    ),
    "fr": _words(
        "les des une est pas que qui dans pour par sur avec son ses aux ces mais ont",
        "sont elle elles ils nous vous leur leurs lui cette cet tout tous toute toutes",
        "plus moins comme fait faire être avoir été était étaient sera seront ainsi",
        "aussi bien encore entre sans sous chez donc alors car dont notre nos votre vos",
        "mon mes ton tes même mêmes quand peu très leurs celui celle ceux celles ici",
        "avait avons avez ont suis êtes sommes quoi quel quelle quels quelles",
    ),
    "de": _words(
        "der die das und ist nicht ein eine einer eines einem einen den dem des mit von",
        "für auf sich auch als aus bei nach wie wird werden wurde wurden sind sein seine",
        "ihre ihr ihm ihn ich wir sie hat haben hatte oder aber wenn noch nur schon über",
        "unter vor durch zum zur dass daß was wer hier dort dann denn doch sehr mehr",
        "kann können muss müssen soll sollen will diese dieser dieses diesem diesen",
        "jede jeder jedes man mein meine dein deine unser unsere euer eure alle alles",
        "keine kein bis ohne gegen zwischen sowie bereits immer wieder",
    ),
    "es": _words(
        "los las una uno unos unas del que por con para como más pero sus les este esta",
        "estos estas ese esa esos esas aquel aquella son está están fue ser sido era han",
        "hay muy sin sobre entre también cuando donde quien quienes cual cuales todo",
        "todos toda todas nos nosotros vosotros ellos ellas ella porque desde hasta",
        "otro otra otros otras mismo misma tiene tienen hace puede ese sea",
    ),
    "nl": _words(
        "een het van die dat met voor zijn niet aan ook als maar bij nog wel naar dan",
        "kan uit dit deze hij zij wij jij ons onze hun haar hem mijn jouw was werd",
        "worden wordt zal zou zullen heeft hebben had hadden over door toen tot",
        "geen meer veel wat wie waar hoe omdat want alle alles iets niets moet",
    ),
    "it": _words(
        "che non per una uno del della delle dei degli dello con sono come più anche",
        "gli alla alle allo agli nel nella nelle nei negli sul sulla sui dal dalla",
        "dai questo questa questi queste quello quella quelli quelle suo sua suoi sue",
        "loro lui lei noi voi essere stato stata era erano sia hanno abbiamo avere",
        "fare tra fra dove quando perché molto tutto tutti tutte ogni",
    ),
}


#: Characters composed (NFC) at a time: CPython orders a run of combining marks by
#: insertion sort, so a page of one mark after another took minutes, the GIL held; in
#: slices, a megabyte of them takes 0.3 s, and a page's ordinary text some 50 µs more.
_NFC_SLICE = 256
#: How far past a slice's end its cut looks for a space, so that no word's letter is
#: cut from its accent (decomposed Vietnamese, Korean jamo).
_NFC_REACH = 64


def _composed(text: str) -> str:
    """``text`` in NFC, a slice at a time, each cut at a space (a run of marks with no
    space in reach, only a hostile text's, is cut where it is)."""
    if text.isascii():
        return text
    normalize = unicodedata.normalize
    parts = []
    at, size = 0, len(text)
    while at < size:
        end = at + _NFC_SLICE
        if end < size:
            space = text.find(" ", end, end + _NFC_REACH)
            end = space if space != -1 else end
        parts.append(normalize("NFC", text[at:end]))
        at = end
    return "".join(parts)


def terms(text: str) -> list[str]:
    """The text's terms in order: lower-cased letter runs of 3 to 40 characters."""
    text = (
        _composed(text)
        .lower()
        .encode("utf-8", "surrogatepass")
        .translate(_ASCII_SEPARATORS)
        .decode("utf-8", "surrogatepass")
    )
    words = text.split()
    if text.isascii():
        return [word for word in words if MIN_TERM_LENGTH <= len(word) <= MAX_TERM_LENGTH]
    found: list[str] = []
    for word in words:
        if word.isascii():
            if MIN_TERM_LENGTH <= len(word) <= MAX_TERM_LENGTH:
                found.append(word)
        elif len(word) >= MIN_TERM_LENGTH:
            found.extend(
                term
                for term in _LETTERS.findall(word)
                if MIN_TERM_LENGTH <= len(term) <= MAX_TERM_LENGTH
            )
    return found


def _by_count(counts: Counter[str], limit: int) -> list[str]:
    best = heapq.nsmallest(limit, counts.items(), key=lambda item: (-item[1], item[0]))
    return [term for term, _ in best]


def keywords(
    text: str,
    *,
    title: str | None = None,
    language: str | None = None,
    limit: int = MAX_KEYWORDS,
) -> tuple[str, ...]:
    """Up to ``limit`` distinct terms of ``title`` and ``text``, sorted alphabetically."""
    if limit <= 0:
        return ()
    stop = STOP_WORDS.get((language or "").lower().split("-", 1)[0], frozenset())
    counts = Counter(terms(text))
    title_terms = set(terms(title or "")) - stop
    for word in stop:
        counts.pop(word, None)
    # A title longer than the limit keeps its terms that the body uses most.
    chosen = _by_count(Counter({term: counts[term] for term in title_terms}), limit)
    for term in chosen:
        counts.pop(term, None)
    chosen += _by_count(counts, limit - len(chosen))
    return tuple(sorted(chosen))
