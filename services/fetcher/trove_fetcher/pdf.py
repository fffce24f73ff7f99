"""What the fetcher reads of a PDF: its title, some text, and the URIs its pages link to.

pypdf (pure Python) under tight limits: a PDF is a program of sorts, and a hostile one
can declare streams that inflate to gigabytes, page trees a million deep, or content
streams that take minutes to interpret. Only the first ``MAX_PAGES`` pages are read,
text stops at ``MAX_TEXT_CHARS`` and after ``MAX_CPU_SECONDS`` of interpretation, every
decoder is bounded well below pypdf's defaults, and no external program (``jbig2dec``)
is ever run. A document pypdf cannot read is a ``PdfError``; the caller decides what
that means.

pypdf decodes a font's ToUnicode map with "surrogatepass": a map that sends a glyph to
<D800> puts a lone surrogate in the text, which neither the language detector nor UTF-8
takes. Text and title leave here marked as every text an event carries is
(``trove_schema.text``: U+FFFD).
"""

from __future__ import annotations

import io
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pypdf import PdfReader
from pypdf._configuration import apply_configuration
from pypdf.generic import DictionaryObject
from pypdf.generic._font import Font

from trove_fetcher.errors import PdfError
from trove_schema.text import storable

#: Pages read for text and links: a document's first pages say what it is about.
MAX_PAGES = 5
#: Characters of text kept (language and keywords need far less).
MAX_TEXT_CHARS = 20_000
MAX_LINKS = 200
#: CPU seconds a document's text may cost, its pages together: pypdf's limits hold per
#: stream, and a form drawn a hundred times a page is interpreted afresh each time, so
#: a file of 2 KB multiplied them into a minute.
MAX_CPU_SECONDS = 1.0
#: Operators interpreted between two looks at the clock.
_CLOCK_EVERY = 1024
_MAX_TITLE = 1000
#: Decoded bytes any one stream may produce, and work per stream, in bytes.
_MAX_STREAM_OUTPUT = 8 * 1024 * 1024
_LIMITS: dict[str, Any] = {
    "maximum_declared_stream_length": _MAX_STREAM_OUTPUT,
    "array_based_stream_maximum_output_length": _MAX_STREAM_OUTPUT,
    "zlib_maximum_output_length": _MAX_STREAM_OUTPUT,
    "zlib_maximum_recovery_input_length": _MAX_STREAM_OUTPUT,
    "lzw_maximum_output_length": _MAX_STREAM_OUTPUT,
    "run_length_maximum_output_length": _MAX_STREAM_OUTPUT,
    "brotli_maximum_output_length": _MAX_STREAM_OUTPUT,
    "jbig2_maximum_output_length": _MAX_STREAM_OUTPUT,
    "image_maximum_buffer_size": _MAX_STREAM_OUTPUT,
    "stream_decoding_work_maximum_length": 4 * _MAX_STREAM_OUTPUT,
    # ~0.1 s of interpretation; a dense page of text is a few thousand operations.
    "stream_parsing_work_maximum_count": 50_000,
    "array_maximum_element_count": 20_000,
    "dictionary_maximum_element_count": 20_000,
    "page_tree_maximum_entries": 10_000,
    "page_tree_maximum_depth": 32,
    "page_tree_maximum_page_entries": 100_000,
    "outline_maximum_entries": 1_000,
    "xform_maximum_invocations_per_extraction": 100,
    "xmp_maximum_input_length": 256 * 1024,
    # Text extraction never renders images: no external decoder, whatever is installed.
    "jbig2dec_binary": None,
}

# pypdf warns (through logging) about every oddity of a malformed file, and the web is
# full of them: one line per page crawled would drown the fetcher's log.
logging.getLogger("pypdf").setLevel(logging.ERROR)


def looks_like_pdf(body: bytes) -> bool:
    """The PDF header within the first KB (readers tolerate leading junk up to there)."""
    return body.find(b"%PDF-", 0, 1024) >= 0


class _OutOfTime(Exception):
    """The document's CPU budget is spent."""


@dataclass(slots=True)
class _Budget:
    """A text visitor that ends the reading once ``MAX_CPU_SECONDS`` of this thread's CPU
    are spent; pypdf calls it for every operator, those of forms included.

    The clock is read every ``_CLOCK_EVERY`` operators, and before each form is drawn
    (``Do``): a form is parsed whole before its first operator is visited. pypdf sets
    aside what fails within a form and goes on with the stream that drew it, so once
    spent, every ``Do`` after refuses, up to the page's own, which ends the reading.

    A page's and a form's fonts are built before any operator, each ToUnicode map parsed
    (a map of 10,000 codes: some 45 ms): ``fonts`` holds those of this document, each
    built once however many names it has (one font named 19,000 times was 22 s), and
    none is built once the budget is spent (``_budgeted_font``)."""

    seconds: float
    deadline: float = 0.0
    calls: int = 0
    #: id of a font's dictionary -> the dictionary (kept, so the id stays its) and its font.
    fonts: dict[int, tuple[DictionaryObject, Font]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.deadline = time.thread_time() + self.seconds

    def spent(self) -> bool:
        return time.thread_time() > self.deadline

    def __call__(self, operator: Any, operands: Any, cm: Any, tm: Any) -> None:
        self.calls += 1
        if (operator == b"Do" or self.calls % _CLOCK_EVERY == 0) and self.spent():
            raise _OutOfTime


#: The budget of the document this thread reads (None: no reading under way).
_reading = threading.local()
_build_font = Font.from_font_resource


def _budgeted_font(cls: type[Font], resource: DictionaryObject) -> Font:
    """pypdf's ``Font.from_font_resource``, once per font of a document read here and
    within its budget; as it is anywhere else."""
    budget: _Budget | None = getattr(_reading, "budget", None)
    if budget is None:
        return _build_font(resource)
    built = budget.fonts.get(id(resource))
    if built is not None and built[0] is resource:
        return built[1]
    if budget.spent():
        raise _OutOfTime
    font = _build_font(resource)
    budget.fonts[id(resource)] = (resource, font)
    return font


# pypdf builds a font for each name in a resource dictionary, in a loop no visitor sees.
Font.from_font_resource = classmethod(_budgeted_font)  # type: ignore[method-assign,assignment]


@dataclass(frozen=True, slots=True)
class PdfText:
    title: str | None
    text: str
    #: URIs of link annotations, in page order.
    links: tuple[str, ...]
    #: The catalog's ``/Lang``: a hint, as an HTML page's ``lang`` is (authoring tools
    #: write their user's language whatever the document's).
    language: str | None = None


def read_pdf(body: bytes) -> PdfText:
    """Title (Info dictionary), text and link URIs of the first pages of ``body``."""
    if not looks_like_pdf(body):
        raise PdfError("not a PDF document")
    try:
        with apply_configuration(**_LIMITS):
            return _read(body)
    except PdfError:
        raise
    except RecursionError as exc:
        raise PdfError("PDF nested too deeply") from exc
    except Exception as exc:  # pypdf raises many kinds for a broken file
        raise PdfError(f"unreadable PDF: {type(exc).__name__}: {exc}"[:300]) from exc


def _read(body: bytes) -> PdfText:
    reader = PdfReader(io.BytesIO(body), strict=False)
    # Most "encrypted" PDFs on the web only restrict printing: an empty user password.
    if reader.is_encrypted and not reader.decrypt(""):
        raise PdfError("encrypted PDF")
    title = None
    info = reader.metadata
    if info is not None:
        raw = info.get("/Title")
        raw = raw.get_object() if raw is not None else None  # written apart: "7 0 R"
        # Judged as far as it is kept: over a whole /Title, "/" repeated and a line
        # break made the match backtrack for hours, the GIL held (20 KB: 1.3 s).
        if isinstance(raw, str) and not _NO_TITLE.match(raw.strip()[:_MAX_TITLE]):
            title = raw
    parts: list[str] = []
    size = 0
    links: list[str] = []
    budget = _Budget(MAX_CPU_SECONDS)
    _reading.budget = budget
    try:
        for number, page in enumerate(reader.pages):
            if number >= MAX_PAGES or size >= MAX_TEXT_CHARS or budget.spent():
                break
            # Only a page that may draw forms, which multiply pypdf's limits, is visited
            # operator by operator: with a visitor, pypdf parses a stream that has no text
            # (a figure) where it would pass it over, and a figure over its parse limit
            # fails the page.
            visitor = budget if _draws_objects(page) else None
            try:
                text = page.extract_text(visitor_operand_before=visitor) or ""
            except _OutOfTime:
                break
            except Exception:  # a page over the limits: its text only, not the next pages'
                text = ""
            parts.append(text[: MAX_TEXT_CHARS - size])
            size += len(parts[-1])
            if len(links) < MAX_LINKS:
                links.extend(_page_links(page, MAX_LINKS - len(links)))
    finally:
        _reading.budget = None
    text = "\n".join(parts).translate(_LIGATURES)
    if "-" in text:
        text = _HYPHENATED.sub(_joined, text)
    return PdfText(
        title=_clean_title(title), text=storable(text), links=tuple(links), language=_lang(reader)
    )


def _lang(reader: PdfReader) -> str | None:
    try:
        catalog = reader.trailer["/Root"].get_object()
        declared = catalog.get("/Lang") if isinstance(catalog, DictionaryObject) else None
        declared = declared.get_object() if declared is not None else None
    except Exception:  # a catalog pypdf cannot read: no hint
        return None
    return declared[:35] if isinstance(declared, str) else None


#: A ``/Title`` that names the file or the tool, not the document: Word's "Microsoft
#: Word - draft3.docx", a path, "document.pdf", "Untitled-1", "Slide 1". The first line
#: of the text says more.
_NO_TITLE = re.compile(
    r"(?i)\A(?:untitled(?:[-\s]*\d+)?|slide\s*\d+|[a-z]:\\.*|/\S*/.*"
    r"|(?:microsoft\s+\w+\s*-\s*)?\S.*\.(?:docx?|pptx?|xlsx?|pdf|odt|odp|rtf|txt|tex|indd|pages))\Z"
)
#: Typographic ligatures a font maps to one character (U+FB00-FB06): the letters they
#: join, as a reader searches for them ("ﬁnding" is "finding").
_LIGATURES = str.maketrans(
    {
        "\ufb00": "ff",
        "\ufb01": "fi",
        "\ufb02": "fl",
        "\ufb03": "ffi",
        "\ufb04": "ffl",
        "\ufb05": "st",
        "\ufb06": "st",
    }
)
#: A word broken at a line's end by a hyphen ("gar-" then "dening").
_HYPHENATED = re.compile(r"(\w)-[ \t]*\n[ \t]*(\w)")


def _joined(match: re.Match[str]) -> str:
    """A word broken by a hyphen at a line's end, whole again when the next line goes on
    in lower case ("gar-dening"); "Anglo-\nSaxon" keeps its hyphen, on one line."""
    before, after = match.group(1), match.group(2)
    if before.isalpha() and after.islower():
        return before + after
    return f"{before}-{after}" if before.isalpha() and after.isalpha() else match.group(0)


def _draws_objects(page: DictionaryObject) -> bool:
    """Whether ``page``'s resources name any XObject (a form, or an image)."""
    try:
        resources = page.get("/Resources")
        resources = resources.get_object() if resources is not None else None
        if not isinstance(resources, DictionaryObject):
            return False
        xobjects = resources.get("/XObject")
        xobjects = xobjects.get_object() if xobjects is not None else None
    except Exception:  # unreadable: pypdf finds no form there either
        return False
    return isinstance(xobjects, DictionaryObject) and len(xobjects) > 0


def _page_links(page: DictionaryObject, limit: int) -> list[str]:
    found: list[str] = []
    annotations = page.get("/Annots")
    if annotations is None:
        return found
    annotations = annotations.get_object()
    if not isinstance(annotations, list):
        return found
    for ref in annotations[: 4 * limit]:
        annotation = ref.get_object()
        if not isinstance(annotation, DictionaryObject) or annotation.get("/Subtype") != "/Link":
            continue
        action = annotation.get("/A")
        action = action.get_object() if action is not None else None
        if isinstance(action, DictionaryObject):
            uri = action.get("/URI")
            uri = uri.get_object() if uri is not None else None
            if isinstance(uri, (str, bytes)):
                found.append(_uri_text(uri))
                if len(found) >= limit:
                    break
    return found


def _uri_text(uri: str | bytes) -> str:
    """A link's URI: an ASCII string by the standard, but written as UTF-8 by tools,
    which pypdf reads as PDFDocEncoding ("cafÃ©"): its bytes read as UTF-8 when they are."""
    raw = getattr(uri, "original_bytes", None) if isinstance(uri, str) else uri
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return uri if isinstance(uri, str) else raw.decode("latin-1")
    return str(uri)


def _clean_title(title: str | None) -> str | None:
    if not title:
        return None
    collapsed = " ".join(storable(title.replace("\x00", "")).split())[:_MAX_TITLE].rstrip()
    return collapsed or None
