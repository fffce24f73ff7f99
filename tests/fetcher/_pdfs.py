"""Small real PDF documents built byte by byte, for the PDF extraction tests."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence


def _escape(value: str) -> str:
    raw = value.encode("latin-1", errors="replace").decode("latin-1")
    return raw.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def _cmap(to_unicode: Mapping[int, str]) -> bytes:
    """A ToUnicode CMap of one-byte codes (two-byte ones when a code needs them), each to
    the UTF-16BE of its text (a lone surrogate written as it is, as a hostile file may),
    in blocks of 100 as CMaps are written."""
    wide = max(to_unicode, default=0) > 0xFF
    code_format, space = (b"<%04X>", b"<0000> <FFFF>") if wide else (b"<%02X>", b"<00> <FF>")
    items = list(to_unicode.items())
    blocks = b""
    for start in range(0, len(items), 100):
        block = items[start : start + 100]
        blocks += b"%d beginbfchar\n" % len(block)
        for code, text in block:
            mapped = text.encode("utf-16-be", "surrogatepass").hex().upper().encode()
            blocks += code_format % code + b" <%s>\n" % mapped
        blocks += b"endbfchar\n"
    return (
        b"/CIDInit /ProcSet findresource begin 12 dict begin begincmap\n"
        b"/CMapName /Test def /CMapType 2 def\n"
        b"1 begincodespacerange "
        + space
        + b" endcodespacerange\n"
        + blocks
        + b"endcmap CMapName currentdict /CMap defineresource pop end end"
    )


def pdf(
    pages: Sequence[str | bytes],
    *,
    title: str | None = None,
    links: Sequence[str] = (),
    to_unicode: Mapping[int, str] | None = None,
    forms: Mapping[str, bytes] | None = None,
    font_names: int = 1,
    distinct_fonts: bool = False,
    title_apart: bool = False,
    lang: str | None = None,
) -> bytes:
    """A PDF with one line of text per page (or a raw content stream, given as bytes), an
    optional Info title, link annotations (URI actions) on the first page, an optional
    ToUnicode map of the font's codes to the text they stand for, and Form XObjects
    (content streams by name) every page may draw (``/X0 Do``). The pages' resources
    name the font ``font_names`` times (``/F1``, ``/F2``, ...): one font, or each name
    a font of its own with its own ToUnicode map (``distinct_fonts``); the title an
    object of its own the Info dictionary refers to (``title_apart``); the catalog's
    ``/Lang``."""
    font = 3
    font_entries = b"/Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding"
    declared = b"" if lang is None else b" /Lang (" + _escape(lang).encode("latin-1") + b")"
    objects: dict[int, bytes] = {
        1: b"<< /Type /Catalog /Pages 2 0 R" + declared + b" >>",
        font: b"<< " + font_entries + b" >>",
    }
    number = 4
    fonts = [font]
    if distinct_fonts:
        for _ in range(font_names - 1):
            objects[number] = b"<< " + font_entries + b" >>"
            fonts.append(number)
            number += 1
    named = b" ".join(
        b"/F%d %d 0 R" % (n + 1, fonts[n] if distinct_fonts else font) for n in range(font_names)
    )
    xobjects = b""
    for name, drawn in (forms or {}).items():
        stream = zlib.compress(drawn)
        objects[number] = (
            b"<< /Type /XObject /Subtype /Form /BBox [0 0 612 792] "
            b"/Resources << /Font << /F1 %d 0 R >> >> /Filter /FlateDecode /Length %d >>\n"
            % (font, len(stream))
            + b"stream\n"
            + stream
            + b"\nendstream"
        )
        xobjects += b"/%s %d 0 R " % (name.encode(), number)
        number += 1
    kids = []
    for index, text in enumerate(pages):
        if isinstance(text, str):
            text = f"BT /F1 12 Tf 72 720 Td ({_escape(text)}) Tj ET".encode("latin-1")
        stream = zlib.compress(text)
        content = number
        objects[content] = (
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream)
            + stream
            + b"\nendstream"
        )
        annotations = b""
        if index == 0 and links:
            refs = []
            for uri in links:
                number += 1
                objects[number] = (
                    b"<< /Type /Annot /Subtype /Link /Rect [72 700 300 712] "
                    b"/A << /S /URI /URI (" + _escape(uri).encode("latin-1") + b") >> >>"
                )
                refs.append(b"%d 0 R" % number)
            annotations = b" /Annots [" + b" ".join(refs) + b"]"
        number += 1
        objects[number] = (
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            b"/Resources << /Font << %s >> /XObject << %s>> >> /Contents %d 0 R"
            % (named, xobjects, content)
            + annotations
            + b" >>"
        )
        kids.append(b"%d 0 R" % number)
        number += 1
    objects[2] = b"<< /Type /Pages /Kids [" + b" ".join(kids) + b"] /Count %d >>" % len(kids)
    if to_unicode is not None:
        cmap = zlib.compress(_cmap(to_unicode))
        for each in fonts:
            objects[number] = (
                b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(cmap)
                + cmap
                + b"\nendstream"
            )
            objects[each] = b"<< " + font_entries + b" /ToUnicode %d 0 R >>" % number
            number += 1
    info = None
    if title is not None:
        written = f"({_escape(title)})".encode("latin-1")
        if title_apart:
            objects[number] = written
            written = b"%d 0 R" % number
            number += 1
        info = number
        objects[info] = b"<< /Title " + written + b" >>"
        number += 1
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets: dict[int, int] = {}
    for key in sorted(objects):
        offsets[key] = len(out)
        out += b"%d 0 obj\n" % key + objects[key] + b"\nendobj\n"
    size = max(objects) + 1
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    for key in range(1, size):
        out += b"%010d 00000 n \n" % offsets[key] if key in offsets else b"0000000000 65535 f \n"
    trailer = b"<< /Size %d /Root 1 0 R" % size
    if info is not None:
        trailer += b" /Info %d 0 R" % info
    out += b"trailer\n" + trailer + b" >>\nstartxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)
