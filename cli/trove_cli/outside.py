"""Text from outside (a page's title, an instance's software, a server's error) shown on
the operator's terminal as text, never as what it could do there.

Titles, URLs, header-derived tags and errors come from strangers, and Trove stores them
as they were sent (``trove_schema.text``): an ESC in a title is the start of a terminal
sequence that can make a link display one URL and open another (OSC 8), write the
operator's clipboard (OSC 52), clear the screen or rewrite the rows above. rich's
``Text`` keeps markup out and strips a few controls (BEL, BS, VT, FF, CR), not ESC nor
the C1 controls a terminal may read as ESC sequences, nor the bidi controls that make a
URL read backwards. Each is shown as a mark where it was: a C0 control as its Unicode
control picture (ESC as ``␛``), DEL as ``␡``, a C1 or bidi control as ``\\u`` and its
number. Doing it before a cell is cut also keeps an ellipsis from cutting a sequence in
half.
"""

from __future__ import annotations

import re

from rich.console import OverflowMethod
from rich.text import Text

#: C0 controls but tab and newline, DEL, the C1 controls, and the bidi controls.
_UNSHOWABLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def _mark(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)
    if code == 0x7F:
        return "\u2421"
    return f"\\u{code:04x}"


def visible(value: str) -> str:
    """``value`` with every character a terminal could act on shown as a mark."""
    return _UNSHOWABLE.sub(_mark, value)


def outside(
    value: str, style: str = "", *, cut: int | None = None, overflow: OverflowMethod | None = None
) -> Text:
    """``value`` as a rich ``Text`` (never markup), its controls shown as marks, and cut
    to ``cut`` characters after they are."""
    shown = visible(value)
    return Text(shown if cut is None else shown[:cut], style=style, overflow=overflow)
