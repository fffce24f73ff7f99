"""Language detection: lingua on a bounded sample, the <html lang> hint, thread safety."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from trove_fetcher.extract import extract
from trove_fetcher.language import (
    DEFAULT_LANGUAGES,
    SAMPLE_CHARS,
    LanguageIdentifier,
    configure,
    default_identifier,
    detect_language,
    primary_tag,
)

ENGLISH = (
    "Last weekend I finally repaired the old bicycle that had been standing in the shed "
    "for years. The chain was rusty and both tyres were flat, but after an afternoon of "
    "patient work it rides better than ever."
)
FRENCH = (
    "Le week-end dernier, j'ai enfin réparé la vieille bicyclette qui attendait dans la "
    "remise depuis des années. La chaîne était rouillée et les deux pneus étaient à plat, "
    "mais après un après-midi de travail patient, elle roule mieux que jamais."
)
GERMAN = (
    "Letztes Wochenende habe ich endlich das alte Fahrrad repariert, das seit Jahren im "
    "Schuppen stand. Die Kette war rostig und beide Reifen waren platt, aber nach einem "
    "Nachmittag geduldiger Arbeit fährt es besser als je zuvor."
)
PORTUGUESE = (
    "No fim de semana passado finalmente consertei a bicicleta velha que estava parada no "
    "galpão há anos. A corrente estava enferrujada e os dois pneus estavam vazios, mas "
    "depois de uma tarde de trabalho paciente ela anda melhor do que nunca."
)
SWAHILI = (
    "Wiki iliyopita hatimaye nilitengeneza baiskeli ya zamani iliyokuwa imesimama "
    "katika banda kwa miaka mingi. Mnyororo ulikuwa na kutu na matairi yote mawili "
    "yalikuwa yamepasuka."
)


@pytest.mark.parametrize(("text", "expected"), [(ENGLISH, "en"), (FRENCH, "fr"), (GERMAN, "de")])
def test_detects_english_french_and_german(text: str, expected: str) -> None:
    assert detect_language(text) == expected


def test_three_words_are_too_few_to_tell() -> None:
    assert detect_language("Hello my friend") is None


def test_no_text_is_no_language() -> None:
    assert detect_language("") is None
    assert detect_language("1234 5678 !!! ... 2024-01-01 12:00") is None


def test_hint_is_used_when_the_text_is_too_short() -> None:
    assert detect_language("Hello my friend", hint="en-GB") == "en"
    assert detect_language("", hint="pt_BR") == "pt"


def test_confident_detector_beats_a_wrong_hint() -> None:
    # Site templates ship lang="en" whatever language the page is written in.
    assert detect_language(GERMAN, hint="en") == "de"


@pytest.mark.parametrize(
    ("text", "hint", "expected"),
    [
        (ENGLISH, "en-GB", "en"),
        (FRENCH, "fr", "fr"),
        (GERMAN, "de-DE", "de"),
        (ENGLISH, None, "en"),
        (GERMAN, None, "de"),
    ],
)
def test_a_page_its_stop_words_tell_needs_no_detector(
    text: str, hint: str | None, expected: str
) -> None:
    identifier = LanguageIdentifier()
    assert identifier.by_stop_words(text) == expected
    assert identifier.detect(text, hint=hint) == expected
    assert not identifier.built  # lingua's models were never needed


def test_a_hint_the_stop_words_disagree_with_is_left_to_the_detector() -> None:
    # Templates ship lang="en" whatever the page is in: lingua decides, as ever.
    identifier = LanguageIdentifier()
    assert identifier.detect(GERMAN, hint="en") == "de"
    assert identifier.built


def test_a_neighbouring_language_is_not_taken_for_a_listed_one() -> None:
    # Portuguese shares many stop words with Spanish; its letters (ã) are not Spanish.
    identifier = LanguageIdentifier()
    assert identifier.by_stop_words(PORTUGUESE) is None
    assert identifier.detect(PORTUGUESE, hint="es") == "pt"
    assert identifier.built


def test_a_few_words_are_too_few_for_the_stop_word_test() -> None:
    assert LanguageIdentifier().by_stop_words("the cat and the dog were in the garden") is None


def test_a_language_whose_neighbour_the_detector_knows_is_never_told_by_stop_words() -> None:
    # Afrikaans samples pass the Dutch test; a detector that knows Afrikaans decides.
    assert "nl" in LanguageIdentifier().told_by_stop_words
    assert "nl" not in LanguageIdentifier(["nl", "af", "en"]).told_by_stop_words
    assert "en" in LanguageIdentifier(["nl", "af", "en"]).told_by_stop_words


def test_the_stop_word_test_can_be_turned_off() -> None:
    identifier = LanguageIdentifier(stop_words=False)
    assert identifier.by_stop_words(ENGLISH) is None
    assert identifier.detect(ENGLISH) == "en"
    assert identifier.built


def test_hint_in_a_language_the_detector_was_not_built_with_is_trusted() -> None:
    assert "sw" not in DEFAULT_LANGUAGES
    assert detect_language(SWAHILI, hint="sw") == "sw"


@pytest.mark.parametrize(("text", "hint"), [(GERMAN, "lb"), (PORTUGUESE, "gl-ES")])
def test_a_hint_in_a_language_lingua_does_not_know_is_trusted(text: str, hint: str) -> None:
    """A Luxembourgish or Galician page the detector is sure of can only be told as a
    neighbour it knows, German or Portuguese (played here by those languages' texts)."""
    assert detect_language(text) in ("de", "pt")
    assert detect_language(text, hint=hint) == primary_tag(hint)


def test_a_norwegian_page_is_told_by_its_written_form_whatever_its_hint() -> None:
    norwegian = (
        "Forrige helg reparerte jeg endelig den gamle sykkelen som hadde stått i boden i "
        "mange år. Kjeden var rusten og begge dekkene var flate, men etter en ettermiddag "
        "med tålmodig arbeid sykler den bedre enn noen gang."
    )
    assert detect_language(norwegian) == "nb"
    assert detect_language(norwegian, hint="no") == "nb"


def test_a_hint_that_names_no_language_is_no_hint() -> None:
    for hint in ("und", "zxx", "mul", "mis", "qaa", "qtz-x-mine", "zz", "xq"):
        assert detect_language(ENGLISH, hint=hint) == "en", hint
        assert detect_language("Hi", hint=hint) in (None, "zz", "xq"), hint


def test_malformed_hint_is_ignored() -> None:
    for hint in ("english", "e", "en-", "12", "en us", "x-klingon", "<script>"):
        assert detect_language("Hello my friend", hint=hint) is None, hint


@pytest.mark.parametrize(
    ("lang", "expected"),
    [
        ("en", "en"),
        ("EN-us", "en"),
        ("fr_CA", "fr"),
        (" de-DE-1996 ", "de"),
        ("zh-Hant-TW", "zh"),
        ("eng", "en"),
        ("deu", "de"),
        ("haw", "haw"),
        ("iw", "he"),
        ("in", "id"),
        ("no-NO", "nb"),
        ("nn", "nn"),
        ("zz", "zz"),
        ("und", None),
        ("zxx", None),
        ("mul", None),
        ("qaa-x-local", None),
        ("qtz", None),
        ("qua", "qua"),
        ("", None),
        (None, None),
        ("english", None),
        ("en-", None),
        ("e", None),
    ],
)
def test_primary_tag(lang: str | None, expected: str | None) -> None:
    assert primary_tag(lang) == expected


def test_only_the_start_of_the_text_is_sampled() -> None:
    text = (ENGLISH + " ") * (SAMPLE_CHARS // len(ENGLISH) + 1) + GERMAN * 50
    assert detect_language(text) == "en"
    assert detect_language(GERMAN * 50 + ENGLISH * 50) == "de"


def test_an_unsure_first_sample_is_widened_once() -> None:
    # Dates and numbers first: the first sample has no letters to go on.
    text = "2024-11-21 12:00 " * (SAMPLE_CHARS // 17 + 1) + ENGLISH * 5
    assert detect_language(text) == "en"
    narrow = LanguageIdentifier(["en", "de"], wide_sample_chars=SAMPLE_CHARS)
    assert narrow.detect_text(text) is None
    assert LanguageIdentifier(["en", "de"]).detect_text(text) == "en"


def test_whitespace_does_not_count_against_the_sample() -> None:
    identifier = LanguageIdentifier()
    indented = "\n".join(" " * 4 * depth for depth in range(40)) + GERMAN
    assert identifier.sample(indented) == GERMAN[:SAMPLE_CHARS]
    assert identifier.sample(indented, 1000) == GERMAN


def test_an_unsure_first_sample_after_a_run_of_whitespace_is_widened() -> None:
    # The numbers fill the first sample; the text goes on, past the indentation.
    text = " " * 2000 + "2024-11-21 12:00 " * (SAMPLE_CHARS // 17 + 1) + ENGLISH * 5
    assert LanguageIdentifier(["en", "de"]).detect_text(text) == "en"


def test_a_paragraph_deep_in_indented_markup_is_still_read() -> None:
    # A template's indentation comes before the text: twenty levels of four spaces.
    depth = 20
    opening = "".join("\n" + "    " * level + "<div>" for level in range(depth))
    closing = "".join("\n" + "    " * level + "</div>" for level in reversed(range(depth)))
    page = f"<html><head><title>Fahrrad</title></head><body>{opening}<p>{GERMAN}</p>{closing}"
    result = extract(page.encode(), url="https://example.org/", content_type="text/html")
    assert result.language == "de"
    assert {"die", "und", "das"}.isdisjoint(result.keywords)
    assert {"fahrrad", "kette"} <= set(result.keywords)


def test_a_lone_surrogate_never_reaches_lingua() -> None:
    # A PDF's font map or a JSON escape can leave one in a text; lingua raises on it.
    identifier = LanguageIdentifier(["en", "de"], stop_words=False)
    assert identifier.detect_text(ENGLISH + "\ud800") == "en"


def test_low_confidence_is_unsure() -> None:
    strict = LanguageIdentifier(["en", "nl"], min_confidence=1.01, stop_words=False)
    assert strict.detect(ENGLISH) is None
    assert strict.detect(ENGLISH, hint="en") == "en"


def test_detector_is_restricted_to_its_languages() -> None:
    identifier = LanguageIdentifier(["en", "fr"])
    assert identifier.languages == frozenset({"en", "fr"})
    assert identifier.detect(FRENCH) == "fr"
    assert identifier.detect_text(GERMAN) in {"en", "fr", None}


def test_detector_is_built_on_first_use_only() -> None:
    identifier = LanguageIdentifier(["en", "de"], stop_words=False)
    assert identifier.built is False
    identifier.detect("short")  # too short: the detector is not needed yet
    assert identifier.built is False
    assert identifier.detect(GERMAN) == "de"
    assert identifier.built is True


def test_warming_builds_the_detector_ahead_of_the_first_page() -> None:
    identifier = LanguageIdentifier(["en", "de"])
    identifier.warm()
    assert identifier.built is True
    assert identifier.detect_text(GERMAN) == "de"


@pytest.mark.parametrize("languages", [["en"], ["en", "en"], ["en", "klingon"], ["xx", "en"]])
def test_bad_language_configuration_is_refused(languages: list[str]) -> None:
    with pytest.raises(ValueError, match="language"):
        LanguageIdentifier(languages)


def test_configure_replaces_the_shared_identifier() -> None:
    before = default_identifier()
    try:
        configured = configure(["en", "fr"])
        assert default_identifier() is configured
        assert configured.languages == frozenset({"en", "fr"})
    finally:
        configure(sorted(before.languages))
    assert default_identifier().languages == before.languages


def test_concurrent_first_use_builds_one_detector() -> None:
    identifier = LanguageIdentifier(["en", "fr", "de"])
    texts = [ENGLISH, FRENCH, GERMAN] * 8
    barrier = threading.Barrier(len(texts))
    detectors = []

    def detect(text: str) -> str | None:
        barrier.wait()
        detectors.append(identifier.detector())
        return identifier.detect(text)

    with ThreadPoolExecutor(max_workers=len(texts)) as pool:
        results = list(pool.map(detect, texts))
    assert results == ["en", "fr", "de"] * 8
    assert len({id(detector) for detector in detectors}) == 1


def test_extraction_detects_from_visible_text_only() -> None:
    hidden = f"<script>var s = '{GERMAN}';</script><style>/* {GERMAN} */</style>"
    hidden += f"<noscript>{GERMAN}</noscript>"
    page = f"<html><head><title>Bike</title>{hidden}</head><body>{hidden}<p>{FRENCH}</p>"
    result = extract(page.encode(), url="https://example.org/", content_type="text/html")
    assert result.language == "fr"
    assert "fahrrad" not in result.keywords


def test_extraction_uses_the_html_lang_hint_when_unsure() -> None:
    page = b'<html lang="nl-BE"><title>Fiets</title><p>Kort.</p></html>'
    result = extract(page, url="https://example.org/", content_type="text/html")
    assert result.language == "nl"
