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


def test_a_declaration_commented_out_is_not_the_pages() -> None:
    """Templates keep the old Latin-1 declaration commented out above the real one."""
    body = (
        b'<head><!-- <meta http-equiv="Content-Type" content="text/html; charset=iso-8859-1">'
        b' --><meta charset="utf-8"><title>caf\xc3\xa9</title>'
    )
    text, encoding = decode_body(body, "text/html")
    assert encoding == "utf-8"
    assert text.endswith("<title>café</title>")


@pytest.mark.parametrize(
    ("meta", "declared"),
    [
        (b'<meta name="description" content="our charset=big5 guide">', None),
        (b'<meta http-equiv="refresh" content="5; charset=koi8-r">', None),
        (b"<meta content='text/html; charset=windows-1251' http-equiv=content-type>", "cp1251"),
        (b'<meta name="description" content="charset=big5"><meta charset=koi8-r>', "koi8-r"),
        (b'<meta charset="koi8-r" charset="big5">', "koi8-r"),
        (b'<meta/charset="koi8-r">', "koi8-r"),
        # Comments end as the prescan ends them, and a tag's quoted values are its own.
        (b'<!--><meta charset="koi8-r">', "koi8-r"),
        (b'<!---><meta charset="koi8-r">', "koi8-r"),
        (b'<!-- a --!><meta charset="big5"> --><meta charset="koi8-r">', "koi8-r"),
        (b'<a title="<!--"></a><meta charset="koi8-r">', "koi8-r"),
        (b"<me<!---->ta charset=koi8-r>", None),
        (b'<p title="<meta charset=big5>">x</p><meta charset="koi8-r">', "koi8-r"),
    ],
)
def test_a_content_declares_a_charset_only_on_a_content_type(
    meta: bytes, declared: str | None
) -> None:
    assert meta_charset(b"<head>" + meta + b"</head>") == declared


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


# The WHATWG Encoding Standard's labels (https://encoding.spec.whatwg.org/#names-and-labels),
# by the codec that reads its encoding: the narrow ISO and ASCII labels go to Microsoft's
# supersets as in browsers. Left out: the labels of the "replacement" encoding and
# x-user-defined, which no Python codec reads as browsers do.
WHATWG_LABELS = {
    "utf-8": "unicode-1-1-utf-8 unicode11utf8 unicode20utf8 utf-8 utf8 x-unicode20utf8",
    "cp866": "866 cp866 csibm866 ibm866",
    "iso8859_2": "csisolatin2 iso-8859-2 iso-ir-101 iso8859-2 iso88592 iso_8859-2 "
    "iso_8859-2:1987 l2 latin2",
    "iso8859_3": "csisolatin3 iso-8859-3 iso-ir-109 iso8859-3 iso88593 iso_8859-3 "
    "iso_8859-3:1988 l3 latin3",
    "iso8859_4": "csisolatin4 iso-8859-4 iso-ir-110 iso8859-4 iso88594 iso_8859-4 "
    "iso_8859-4:1988 l4 latin4",
    "iso8859_5": "csisolatincyrillic cyrillic iso-8859-5 iso-ir-144 iso8859-5 iso88595 "
    "iso_8859-5 iso_8859-5:1988",
    "iso8859_6": "arabic asmo-708 csiso88596e csiso88596i csisolatinarabic ecma-114 "
    "iso-8859-6 iso-8859-6-e iso-8859-6-i iso-ir-127 iso8859-6 iso88596 iso_8859-6 "
    "iso_8859-6:1987",
    "iso8859_7": "csisolatingreek ecma-118 elot_928 greek greek8 iso-8859-7 iso-ir-126 "
    "iso8859-7 iso88597 iso_8859-7 iso_8859-7:1987 sun_eu_greek",
    "iso8859_8": "csiso88598e csisolatinhebrew hebrew iso-8859-8 iso-8859-8-e iso-ir-138 "
    "iso8859-8 iso88598 iso_8859-8 iso_8859-8:1988 visual csiso88598i iso-8859-8-i logical",
    "iso8859_10": "csisolatin6 iso-8859-10 iso-ir-157 iso8859-10 iso885910 l6 latin6",
    "iso8859_13": "iso-8859-13 iso8859-13 iso885913",
    "iso8859_14": "iso-8859-14 iso8859-14 iso885914",
    "iso8859_15": "csisolatin9 iso-8859-15 iso8859-15 iso885915 iso_8859-15 l9",
    "iso8859_16": "iso-8859-16",
    "koi8_r": "cskoi8r koi koi8 koi8-r koi8_r",
    "koi8_u": "koi8-ru koi8-u",
    "mac_roman": "csmacintosh mac macintosh x-mac-roman",
    "cp874": "dos-874 iso-8859-11 iso8859-11 iso885911 tis-620 windows-874",
    "cp1250": "cp1250 windows-1250 x-cp1250",
    "cp1251": "cp1251 windows-1251 x-cp1251",
    "cp1252": "ansi_x3.4-1968 ascii cp1252 cp819 csisolatin1 ibm819 iso-8859-1 iso-ir-100 "
    "iso8859-1 iso88591 iso_8859-1 iso_8859-1:1987 l1 latin1 us-ascii windows-1252 x-cp1252",
    "cp1253": "cp1253 windows-1253 x-cp1253",
    "cp1254": "cp1254 csisolatin5 iso-8859-9 iso-ir-148 iso8859-9 iso88599 iso_8859-9 "
    "iso_8859-9:1989 l5 latin5 windows-1254 x-cp1254",
    "cp1255": "cp1255 windows-1255 x-cp1255",
    "cp1256": "cp1256 windows-1256 x-cp1256",
    "cp1257": "cp1257 windows-1257 x-cp1257",
    "cp1258": "cp1258 windows-1258 x-cp1258",
    "mac_cyrillic": "x-mac-cyrillic x-mac-ukrainian",
    "gb18030": "chinese csgb2312 csiso58gb231280 gb2312 gb_2312 gb_2312-80 gbk iso-ir-58 x-gbk "
    "gb18030",
    "big5hkscs": "big5 big5-hkscs cn-big5 csbig5 x-x-big5",
    "euc_jp": "cseucpkdfmtjapanese euc-jp x-euc-jp",
    "iso2022_jp": "csiso2022jp iso-2022-jp",
    "cp932": "csshiftjis ms932 ms_kanji shift-jis shift_jis sjis windows-31j x-sjis",
    "cp949": "cseuckr csksc56011987 euc-kr iso-ir-149 korean ks_c_5601-1987 ks_c_5601-1989 "
    "ksc5601 ksc_5601 windows-949",
    "utf-16-be": "unicodefffe utf-16be",
    "utf-16-le": "csunicode iso-10646-ucs-2 ucs-2 unicode unicodefeff utf-16 utf-16le",
}


@pytest.mark.parametrize(("codec", "labels"), WHATWG_LABELS.items(), ids=list(WHATWG_LABELS))
def test_every_label_of_the_encoding_standard_names_the_codec_browsers_use(
    codec: str, labels: str
) -> None:
    wanted = codecs.lookup(codec).name
    read_as = {label: normalize_charset(label.upper()) for label in labels.split()}
    wrong = {
        label: name
        for label, name in read_as.items()
        if name is None or codecs.lookup(name).name != wanted
    }
    assert wrong == {}


@pytest.mark.parametrize(
    ("label", "title", "written_in"),
    [
        ("iso-8859-8-i", "חדשות היום בעברית", "iso8859_8"),
        ("logical", "חדשות היום בעברית", "iso8859_8"),
        ("visual", "תיברעב םויה תושדח", "iso8859_8"),
        ("iso-8859-6-i", "أخبار اليوم", "iso8859_6"),
        ("sun_eu_greek", "Ειδήσεις της ημέρας", "iso8859_7"),
        ("koi8", "Новости дня", "koi8_r"),
        ("koi8-ru", "Новини дня: ґанок \u0456 їжак", "koi8_u"),
        ("x-mac-roman", "Les nouvelles du jour \u2013 café", "mac_roman"),
        ("csisolatin9", "Prix : 20 € l'œuvre", "iso8859_15"),
        ("unicode", "ニュース", "utf-16-le"),
    ],
)
def test_a_page_labelled_as_browsers_accept_reads_in_its_script(
    label: str, title: str, written_in: str
) -> None:
    # Labels Python does not know fell back to UTF-8, then windows-1252: a Hebrew page
    # came out as Latin accents, with the wrong title and language.
    page = f"<html><head><title>{title}</title></head><body><p>{title}</p></body></html>"
    text, _ = decode_body(page.encode(written_in), f"text/html; charset={label}")
    assert text == page
