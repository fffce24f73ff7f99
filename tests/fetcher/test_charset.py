"""Decoding response bodies: which charset wins, and broken charsets never raise."""

from __future__ import annotations

import codecs

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trove_fetcher.charset import (
    decode_body,
    header_charset,
    meta_charset,
    normalize_charset,
)

LATIN1_CAFE = "café crème".encode("latin-1")


def test_header_charset_is_used() -> None:
    text, encoding = decode_body(LATIN1_CAFE, "text/html; charset=ISO-8859-1")
    assert text == "café crème"
    # Browsers read iso-8859-1 as its superset windows-1252.
    assert encoding == "cp1252"


def test_header_charset_beats_meta() -> None:
    body = b'<meta charset="utf-8"><p>' + LATIN1_CAFE
    text, encoding = decode_body(body, 'text/html; charset="windows-1252"')
    assert "café crème" in text
    assert encoding == "cp1252"


def test_header_that_lies_gives_replacement_characters_not_an_exception() -> None:
    text, encoding = decode_body(LATIN1_CAFE, "text/html; charset=utf-8")
    assert encoding == "utf-8"
    assert text == "caf\ufffd cr\ufffdme"


@pytest.mark.parametrize(
    "label", ["x-klingon", "base64", "rot13", "zlib", "undefined", "unicode_escape", "idna", ""]
)
def test_unusable_header_charset_falls_back_to_the_next_source(label: str) -> None:
    body = b'<meta charset="windows-1252"><p>' + LATIN1_CAFE
    text, encoding = decode_body(body, f"text/html; charset={label}")
    assert "café crème" in text
    assert encoding == "cp1252"


def test_unusable_charset_everywhere_falls_back_to_utf8_when_the_bytes_are_utf8() -> None:
    body = '<meta charset="x-bogus"><p>naïve'.encode()
    assert decode_body(body, "text/html; charset=nonsense") == (
        '<meta charset="x-bogus"><p>naïve',
        "utf-8",
    )


def test_fallback_is_cp1252_when_the_bytes_are_not_utf8() -> None:
    text, encoding = decode_body(b"<p>" + LATIN1_CAFE + b" \x81", None)
    assert encoding == "cp1252"
    assert text.startswith("<p>café crème")


def test_utf8_cut_inside_a_character_still_decodes_as_utf8() -> None:
    body = "<p>ça coûte 5€".encode()[:-1]  # the euro sign's last byte is missing
    text, encoding = decode_body(body, None)
    assert encoding == "utf-8"
    assert text == "<p>ça coûte 5\ufffd"


def test_bom_wins_over_meta() -> None:
    body = codecs.BOM_UTF8 + '<meta charset="iso-8859-1"><p>café'.encode()
    text, encoding = decode_body(body, None)
    assert encoding == "utf-8"
    assert text == '<meta charset="iso-8859-1"><p>café'


def test_bom_wins_over_the_header_as_in_browsers() -> None:
    body = codecs.BOM_UTF16_LE + "<p>café".encode("utf-16-le")
    text, encoding = decode_body(body, "text/html; charset=iso-8859-1")
    assert (text, encoding) == ("<p>café", "utf-16-le")


def test_meta_charset_in_the_first_2kb_is_used() -> None:
    body = b"<html><head><title>t</title><meta charset='windows-1251'></head><p>"
    body += "Привет".encode("cp1251")
    text, encoding = decode_body(body, "text/html")
    assert encoding == "cp1251"
    assert text.endswith("Привет")


def test_meta_http_equiv_content_type_is_used() -> None:
    body = b'<meta http-equiv="Content-Type" content="text/html; charset=iso-8859-15"><p>\xa4'
    text, encoding = decode_body(body, None)
    assert encoding == "iso8859-15"
    assert text.endswith("€")


def test_meta_charset_after_2kb_is_ignored() -> None:
    body = b"<!-- " + b"x" * 2100 + b' --><meta charset="windows-1251"><p>caf\xc3\xa9'
    assert decode_body(body, None)[1] == "utf-8"


def test_meta_declaring_utf16_means_utf8() -> None:
    body = '<meta charset="utf-16"><p>café'.encode()
    assert decode_body(body, None) == ('<meta charset="utf-16"><p>café', "utf-8")


def test_xml_declaration_is_used_for_xml() -> None:
    body = b'<?xml version="1.0" encoding="ISO-8859-1"?><rss><title>' + LATIN1_CAFE
    text, encoding = decode_body(body, "application/rss+xml")
    assert encoding == "cp1252"
    assert text.endswith("café crème")


def test_xml_ignores_meta_looking_text() -> None:
    body = b'<?xml version="1.0" encoding="utf-8"?><rss><![CDATA[<meta charset="koi8-r">]]>'
    assert decode_body(body, "text/xml")[1] == "utf-8"


def test_charset_names_are_normalized() -> None:
    assert normalize_charset("UTF8") == "utf-8"
    assert normalize_charset(" 'Shift_JIS' ") == "cp932"  # as browsers read it (WHATWG)
    assert normalize_charset("us-ascii") == "cp1252"
    assert normalize_charset("x" * 41) is None
    assert header_charset('text/html;charset="utf-8"') == "utf-8"
    assert header_charset("text/html") is None
    assert meta_charset(b"<p>no meta here</p>") is None


@settings(max_examples=300, deadline=None)
@given(
    body=st.binary(max_size=3000),
    content_type=st.one_of(
        st.none(),
        st.sampled_from(
            [
                "text/html",
                "text/html; charset=utf-8",
                "text/html; charset=utf-16",
                "text/html; charset=base64",
                "text/html; charset=shift_jis",
                "application/xml; charset=utf-32",
                "text/html; charset=",
            ]
        ),
        st.text(max_size=60),
    ),
)
def test_decoding_never_raises(body: bytes, content_type: str | None) -> None:
    text, encoding = decode_body(body, content_type)
    assert isinstance(text, str)
    assert codecs.lookup(encoding)


@pytest.mark.parametrize(
    ("label", "text", "written_in"),
    [
        ("Shift_JIS", "①㈱髙", "cp932"),
        ("x-sjis", "日本語", "cp932"),
        ("gb2312", "镕碁", "gb18030"),
        ("euc-kr", "똠방각하", "cp949"),
        ("big5", "碁", "big5hkscs"),
        ("tis-620", "\u201cไทย\u201d", "cp874"),
        ("windows-874", "ไทย", "cp874"),
        ("iso88591", "café", "cp1252"),
        ("unicode-1-1-utf-8", "é", "utf-8"),
    ],
)
def test_a_charset_label_is_read_as_browsers_read_it(
    label: str, text: str, written_in: str
) -> None:
    # Pages labelled with the narrow standard are written in Microsoft's superset, which
    # browsers decode them with (the WHATWG Encoding Standard); Python's codec of the
    # label's own name turned their characters into others, or did not know the label.
    decoded, _ = decode_body(f"<p>{text}</p>".encode(written_in), f"text/html; charset={label}")
    assert decoded == f"<p>{text}</p>"
