"""PDF documents are content for the http strategy: a title, text for language and
keywords, the URIs they link to; within bounds, and never an exception."""

from __future__ import annotations

import hashlib
import time

import pytest

from tests.fetcher._pdfs import pdf
from trove_fetcher.errors import PdfError
from trove_fetcher.extract import extract
from trove_fetcher.pdf import MAX_PAGES, read_pdf
from trove_schema.events import LinkKind

URL = "https://papers.example/2026/small-web.pdf"
ENGLISH = "The small web is made of personal sites written by people for other people to read"
FRENCH = "Le petit web est fait de sites personnels écrits par des gens pour des gens qui lisent"


def test_a_pdf_gives_its_info_title_language_and_keywords() -> None:
    body = pdf([ENGLISH], title="A Study of the Small Web")
    found = extract(body, url=URL, content_type="application/pdf")
    assert found.title == "A Study of the Small Web"
    assert found.language == "en"
    assert {"personal", "sites", "people"} <= set(found.keywords)
    assert found.text_chars == len(ENGLISH.replace(" ", ""))
    assert not found.shell


def test_a_pdf_is_hashed_by_its_bytes() -> None:
    # Two documents of one Info title and text alike ("Untitled") are two documents.
    body = pdf([ENGLISH * 4], title="Untitled")
    found = extract(body, url=URL, content_type="application/pdf")
    assert found.content_hash == hashlib.sha256(body).hexdigest()


def test_a_pdf_without_a_title_is_named_by_its_first_line() -> None:
    found = extract(pdf([FRENCH]), url=URL, content_type="application/pdf")
    assert found.title == FRENCH
    assert found.language == "fr"


@pytest.mark.parametrize(
    "title",
    [
        "Microsoft Word - draft3.docx",
        "C:\\Users\\bob\\Desktop\\paper.pdf",
        "document.pdf",
        "Untitled-1",
        "Slide 1",
    ],
)
def test_a_title_that_names_the_file_or_the_tool_is_no_title(title: str) -> None:
    found = extract(pdf([ENGLISH], title=title), url=URL, content_type="application/pdf")
    assert found.title == ENGLISH
    assert not {"docx", "microsoft", "desktop", "untitled", "slide"} & set(found.keywords)


def test_a_title_written_apart_from_the_info_dictionary_is_read() -> None:
    body = pdf([ENGLISH], title="A Study of the Small Web", title_apart=True)
    found = extract(body, url=URL, content_type="application/pdf")
    assert found.title == "A Study of the Small Web"


def test_words_broken_at_a_lines_end_and_ligatures_are_read_whole() -> None:
    lines = [("Compost and gar-", "dening ~ndings"), ("Anglo-", "Saxon ~owers")]
    streams = [
        f"BT /F1 12 Tf 72 720 Td ({one}) Tj 0 -14 Td ({two}) Tj ET".encode() for one, two in lines
    ]
    found = extract(
        pdf(streams, to_unicode={0x7E: "\ufb01"}), url=URL, content_type="application/pdf"
    )
    words = set(found.keywords)
    assert {"compost", "gardening", "findings", "saxon"} <= words, words
    assert not {"gar", "dening", "\ufb01ndings", "ndings"} & words, words


def test_a_pdfs_declared_language_is_its_hint() -> None:
    short = "Compost et jardin"  # too few words for the detector to be sure
    assert extract(pdf([short]), url=URL, content_type="application/pdf").language is None
    found = extract(pdf([short], lang="fr-FR"), url=URL, content_type="application/pdf")
    assert found.language == "fr"


def test_a_link_written_as_utf8_is_read_as_utf8() -> None:
    # Tools write a URI's non-ASCII letters as UTF-8 bytes; read as PDFDocEncoding
    # they were "cafÃ©".
    body = pdf([ENGLISH], links=["https://ex.example/caf\xc3\xa9", "https://ex.example/\xe9t\xe9"])
    found = extract(body, url=URL, content_type="application/pdf")
    # Bytes that are no UTF-8 are read as before: Latin-1 ("\xe9" an é).
    assert [link.url for link in found.links] == [
        "https://ex.example/café",
        "https://ex.example/été",
    ]


def test_a_pdf_sent_without_a_content_type_is_still_read() -> None:
    found = extract(pdf([ENGLISH], title="Notes"), url=URL, content_type=None)
    assert found.title == "Notes"


def test_the_uris_a_pdf_links_to_are_links() -> None:
    body = pdf([ENGLISH], links=["https://other.example/cited", "mailto:someone@example.org"])
    found = extract(body, url=URL, content_type="application/pdf")
    assert [(link.url, link.kind) for link in found.links] == [
        ("https://other.example/cited", LinkKind.A)
    ]


def test_only_the_first_pages_are_read() -> None:
    pages = [f"page{n} words here" for n in range(MAX_PAGES + 3)]
    document = read_pdf(pdf(pages))
    assert "page0" in document.text
    assert f"page{MAX_PAGES - 1}" in document.text
    assert f"page{MAX_PAGES}" not in document.text


def test_an_x_robots_noindex_pdf_keeps_no_keywords() -> None:
    found = extract(
        pdf([ENGLISH], title="Private"),
        url=URL,
        content_type="application/pdf",
        x_robots_tag="noindex",
    )
    assert (found.title, found.keywords, found.noindex) == ("Private", (), True)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"this is not a PDF at all",
        b"%PDF-1.7\n",
        pdf([ENGLISH], title="Cut")[:150],
        b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 1 0 R >> endobj\ntrailer << /Root 1 0 R >>",
        b"%PDF-1.4\n" + b"[" * 100_000,
        b"%PDF-1.4\n" + bytes(range(256)) * 64,
    ],
)
def test_a_broken_pdf_is_a_thin_extraction_never_an_exception(body: bytes) -> None:
    started = time.monotonic()
    found = extract(body, url=URL, content_type="application/pdf")
    assert found.links == ()
    assert time.monotonic() - started < 5


def test_a_content_stream_that_inflates_past_the_limit_is_not_inflated() -> None:
    bomb = b"BT /F1 12 Tf 72 720 Td (x) Tj ET " + b" " * (64 * 1024 * 1024)
    body = pdf([bomb, ENGLISH], title="Bomb")
    assert len(body) < 1024 * 1024
    started = time.monotonic()
    found = extract(body, url=URL, content_type="application/pdf")
    assert time.monotonic() - started < 5
    # The page over the limit gives no text; the next page's is read, and the title kept.
    assert found.title == "Bomb"
    assert 0 < (found.text_chars or 0) <= len(ENGLISH)


def test_a_page_too_long_to_interpret_ends_the_reading_within_a_bounded_time() -> None:
    dense = b"BT /F1 12 Tf 72 720 Td " + b"(word ) Tj " * 100_000 + b"ET"
    body = pdf([dense] * MAX_PAGES, title="Dense")
    started = time.process_time()
    found = extract(body, url=URL, content_type="application/pdf", detect_language=False)
    assert time.process_time() - started < 2
    assert (found.title, found.text_chars) == ("Dense", 0)


def test_a_title_made_to_backtrack_the_no_title_check_is_judged_within_a_bounded_time() -> None:
    # "/" after "/" and a line break: a path's pattern tried every split of them, the
    # GIL held (26 s for 100 KB). Judged as far as a title is kept, it reads as a path:
    # no title, and the first line of the text names the document.
    body = pdf([ENGLISH], title="/" * 100_000 + "\nx")
    started = time.process_time()
    found = extract(body, url=URL, content_type="application/pdf", detect_language=False)
    assert time.process_time() - started < 2
    assert found.title == ENGLISH


def test_a_form_drawn_again_and_again_ends_the_reading_within_a_bounded_time() -> None:
    # pypdf's limits hold per stream, and a form is interpreted afresh each time a page
    # draws it: a file of 2 KB multiplied them into a minute of a parse thread.
    form = b"q Q\n" * 24_000 + b"BT /F1 12 Tf (x) Tj ET\n"
    body = pdf([b"/X0 Do\n" * 100] * MAX_PAGES, title="Drawn", forms={"X0": form})
    assert len(body) < 4096
    started = time.process_time()
    found = extract(body, url=URL, content_type="application/pdf", detect_language=False)
    assert time.process_time() - started < 2
    assert found.title == "Drawn"


def test_a_form_a_page_draws_gives_its_text() -> None:
    form = f"BT /F1 12 Tf 72 700 Td ({ENGLISH}) Tj ET".encode()
    found = extract(pdf([b"/X0 Do"], forms={"X0": form}), url=URL, content_type="application/pdf")
    assert found.language == "en"


def test_a_figure_over_the_parse_limit_leaves_the_next_pages_text() -> None:
    # A vector figure of 60,000 path operators, no text: pypdf passes it over unparsed.
    figure = b"".join(b"%d %d m %d %d l S\n" % (i % 600, i % 700, i, i) for i in range(60_000))
    found = extract(pdf([figure, ENGLISH]), url=URL, content_type="application/pdf")
    assert found.language == "en"


def test_a_font_named_many_times_is_built_once() -> None:
    # One font with a ToUnicode map, named 19,000 times in a page's resources: pypdf
    # builds a font a name before the first operator, which no visitor sees.
    to_unicode = {code: chr(0x41 + code % 26) for code in range(256)}
    body = pdf(["hello"], to_unicode=to_unicode, font_names=19_000)
    started = time.process_time()
    found = extract(body, url=URL, content_type="application/pdf", detect_language=False)
    assert time.process_time() - started < 2
    assert (found.text_chars or 0) > 0


def test_many_heavy_fonts_end_the_reading_within_a_bounded_time() -> None:
    # Each font its own, with a map of 10,000 codes (some 45 ms to build).
    to_unicode = {code: chr(0x41 + code % 26) for code in range(10_000)}
    pages = [b"BT /F1 12 Tf 72 720 Td (x) Tj ET"] * MAX_PAGES
    body = pdf(pages, to_unicode=to_unicode, font_names=200, distinct_fonts=True)
    started = time.process_time()
    extract(body, url=URL, content_type="application/pdf", detect_language=False)
    assert time.process_time() - started < 3


def test_a_body_that_is_not_a_pdf_is_refused_by_the_reader() -> None:
    with pytest.raises(PdfError):
        read_pdf(b"<html>not a pdf</html>")
    with pytest.raises(ValueError, match="PDF"):  # an extraction error, like any unusable content
        read_pdf(b"%PDF-1.4 and then nothing")


def test_a_glyph_a_pdf_maps_to_a_lone_surrogate_is_marked_and_the_pdf_read() -> None:
    # pypdf decodes a ToUnicode map with "surrogatepass": "~" below reads as U+D800,
    # which the language detector (and UTF-8) refuses.
    body = pdf([ENGLISH + " ~"], links=["https://other.example/cited"], to_unicode={0x7E: "\ud800"})
    found = extract(body, url=URL, content_type="application/pdf")
    assert found.title == ENGLISH + " \ufffd"
    assert found.language == "en"
    assert [link.url for link in found.links] == ["https://other.example/cited"]
    assert read_pdf(body).text == ENGLISH + " \ufffd"
