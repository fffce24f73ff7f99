"""Keywords: a bounded, sorted bag of terms, never text the page could be rebuilt from."""

from __future__ import annotations

import random
import re
import unicodedata

from trove_fetcher.extract import extract
from trove_fetcher.keywords import _UNSEGMENTED, STOP_WORDS, keywords, terms
from trove_schema.events import MAX_KEYWORDS

SENTENCE = "The cat sat on the mat because the mat was warm and the cat was tired"


def words(count: int) -> list[str]:
    """Distinct made-up words: 'waaa', 'waab', ..."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [
        "w" + letters[i // 676 % 26] + letters[i // 26 % 26] + letters[i % 26] for i in range(count)
    ]


def test_keywords_are_bounded() -> None:
    assert len(keywords(" ".join(words(1000)))) == MAX_KEYWORDS
    assert len(keywords(" ".join(words(50)), limit=10)) == 10
    assert keywords(SENTENCE, limit=0) == ()


def test_keywords_are_distinct_and_sorted_without_counts() -> None:
    result = keywords(SENTENCE + " " + SENTENCE, language="en")
    assert result == ("cat", "mat", "sat", "tired", "warm")
    assert list(result) == sorted(set(result))


def test_stop_words_of_the_language_are_dropped() -> None:
    result = keywords(SENTENCE, language="en")
    assert not set(result) & {"the", "and", "because", "was"}
    assert not set(keywords("les chats et les chiens dans la maison", language="fr")) & {
        "les",
        "dans",
    }
    assert "und" not in keywords("Katzen und Hunde und Mäuse", language="de-AT")


def test_without_a_known_language_no_stop_words_are_dropped() -> None:
    assert "the" in keywords(SENTENCE, language=None)
    assert "the" in keywords(SENTENCE, language="sv")


def test_most_frequent_terms_win_ties_alphabetically() -> None:
    text = "zebra zebra zebra yak yak apple banana cherry"
    assert keywords(text, limit=3) == ("apple", "yak", "zebra")
    assert keywords(text, limit=2) == ("yak", "zebra")


def test_title_words_are_always_kept() -> None:
    frequent = " ".join(w for w in words(MAX_KEYWORDS * 2) for _ in range(3))
    result = keywords(frequent + " rare", title="Rare Orchids of the Alps", language="en")
    assert len(result) == MAX_KEYWORDS
    assert {"rare", "orchids", "alps"} <= set(result)
    assert "the" not in result


def test_a_title_longer_than_the_limit_keeps_its_most_used_terms() -> None:
    title = " ".join(words(30))
    result = keywords("waac waac wabd", title=title, limit=3)
    assert result == ("waaa", "waac", "wabd")


def test_terms_are_lower_cased_letter_runs_of_3_to_40() -> None:
    text = "Go BIG or go home, it's 2024: e-mail_me x" + " a" * 3
    assert terms(text) == ["big", "home", "mail"]
    assert terms("a" * 40 + " " + "b" * 41) == ["a" * 40]
    assert terms("Straße ÉCOLE naïve Ελληνικά русский 한국어") == [
        "straße",
        "école",
        "naïve",
        "ελληνικά",
        "русский",
        "한국어",
    ]


def test_terms_match_their_definition_on_random_mixed_text() -> None:
    # The definition, as one regular expression over the whole text: maximal runs of
    # letters (not digits, "_" or unsegmented scripts), 3 to 40 long. terms() takes
    # shortcuts for ASCII; they must not change the answer.
    letter_runs = re.compile(rf"[^\W\d_{_UNSEGMENTED}]+")
    alphabet = (
        "abcXYZ  \t\n-_'.,:;/0129\u00e9\u00df\u00c9\u00f1\u0301\u2019\u2014\u00a0\u00b2"
        "\u2167\u0436\u03b1\u05d0\u4e2d\u0e01\u3042\ud55c\U0001d400\ud800"
    )
    rng = random.Random(1)
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80)))
        for sample in (text, text.encode("ascii", "ignore").decode()):
            expected = [
                run
                for run in letter_runs.findall(unicodedata.normalize("NFC", sample).lower())
                if 3 <= len(run) <= 40
            ]
            assert terms(sample) == expected, repr(sample)


def test_decomposed_accents_are_one_term() -> None:
    assert terms(unicodedata.normalize("NFD", "café")) == ["café"]


def test_scripts_without_spaces_give_no_terms() -> None:
    # Unsegmented, a run of Chinese, Japanese or Thai is a phrase, often a whole sentence.
    assert terms("这是一个关于园艺的句子 日本語の文章です ภาษาไทยไม่มีช่องว่าง") == []
    assert terms("Tokyo 東京都 trip") == ["tokyo", "trip"]


def test_stop_word_lists_have_only_matchable_words() -> None:
    for language, stop in STOP_WORDS.items():
        assert stop, language
        assert all(terms(word) == [word] for word in stop), language


def test_extraction_keywords_come_from_visible_text_and_title() -> None:
    page = b"""<html><head><title>Growing Tomatoes</title>
    <script>var trackingPixel = 1;</script><style>.hiddenstyle {}</style></head>
    <body><nav>Menu</nav><p>Tomatoes need sun. Water tomatoes daily.</p>
    <noscript>enablejavascript</noscript></body></html>"""
    result = extract(page, url="https://example.org/", content_type="text/html")
    assert result.keywords == ("daily", "growing", "need", "sun", "tomatoes", "water")


def test_decomposed_text_has_the_terms_of_its_composed_spelling_however_long() -> None:
    # Composed a slice at a time (a run of marks is quadratic), cut at spaces: no letter
    # is parted from its accent, nor a Korean syllable's jamo from each other.
    for sentence in ("Tiếng Việt có dấu rất nhiều ngươi", "대한민국의 수도는 서울입니다"):
        text = " ".join([sentence] * 300)
        assert terms(unicodedata.normalize("NFD", text)) == terms(text)
