"""Text from papers made safe for where it goes, in one place.

A title, an id, a venue or a metadata key is whatever the input file, the POST or another server's answer
said: it may hold line breaks, terminal escape sequences or a spreadsheet formula. Three destinations:

- an export's value (CSV, RIS, BibTeX): `one_line`, every control character and line break a space, so one
  value cannot end its line, its field or its record and forge the next (`UR  - http://evil.example`);
- a CSV cell: `csv_cell`, one line and, as OWASP recommends for CSV injection, a cell that a spreadsheet would
  run as a formula (it starts with `=`, `+`, `-`, `@`, a tab or a carriage return, or their full-width forms,
  after any spaces) gets a leading `'`; the writer quotes every cell. A cell that is a plain decimal number
  (`-0.1234`, a negative similarity or a year `-44`) is a value, not a formula, and stays a number;
- an XML document (GraphML, SVG): `xml_text`, one line with every character XML 1.0 cannot hold (a surrogate,
  U+FFFE, U+FFFF) a space too; the writer escapes the rest (`<`, `&`, quotes);
- a terminal: `printable` (and `printable_tree` for a whole result), C0 and C1 control characters and DEL
  shown as `\\x1b`, `\\n`, ... instead of obeyed, so that no title sets the window title, clears the screen or
  hides a link; a tab is kept; a line break only where the caller prints text that is several lines by design.
  Unicode's format characters (category Cf: the bidirectional controls that reorder what follows, U+202E; the
  invisible ones, U+200B, U+FEFF) are shown as `\\u202e`, so that what is read is what is there: `sec4-\\u202e54321`,
  not a `sec4-12345` that is another paper's id.
"""
from __future__ import annotations

import re

#: C0 controls (tab and line breaks too), DEL, C1 controls, the Unicode line and paragraph separators: what an
#: export's value loses
CONTROLS_AND_BREAKS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: Unicode's format characters (general category Cf, Unicode 15.1; tests/test_hostile_terminal.py checks the list
#: against the running Python's unicodedata): bidirectional controls (U+061C, U+200E-200F, U+202A-202E, U+2066-2069),
#: zero-width and invisible ones (U+00AD, U+200B-200D, U+2060-2064, U+FEFF, the tags U+E0001, U+E0020-E007F), ...
#: A terminal draws none of them as itself: they reorder or hide the text around them
FORMAT_CHARS = ("\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
                "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
                "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f")
#: what no paper id may hold (esqbe.domain.id_problem): a control character or line break, or a format character (an
#: id is typed as it is read)
NOT_IN_ID = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{FORMAT_CHARS}]")
#: what a terminal obeys or draws otherwise than it is: C0 but the tab, DEL, C1 (a line feed too, unless kept), Cf
_CONTROLS = re.compile(f"[\x00-\x08\x0a-\x1f\x7f-\x9f{FORMAT_CHARS}]")
_CONTROLS_BUT_NEWLINE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{FORMAT_CHARS}]")
_NAMED = {"\n": "\\n", "\r": "\\r"}
#: a CSV cell a spreadsheet would evaluate (OWASP: = + - @ tab CR; and the full-width forms some read as them)
_FORMULA_START = frozenset("=+-@\t\r\uff1d\uff0b\uff0d\uff20")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def one_line(text) -> str:
    """`text` as one line: each control character (C0, DEL, C1) and line or paragraph separator a space."""
    return CONTROLS_AND_BREAKS.sub(" ", str(text))


#: what XML 1.0 may not hold at all (escaped or not) once the controls are gone: surrogates, U+FFFE, U+FFFF
_NOT_XML = re.compile("[\ud800-\udfff\ufffe\uffff]")


def xml_text(text) -> str:
    """`text` for an XML document's text or attribute: `one_line`, and no character XML 1.0 forbids."""
    return _NOT_XML.sub(" ", one_line(text))


def csv_cell(value) -> str:
    """One CSV cell: `one_line`, and a leading `'` where a spreadsheet would read the cell as a formula.
    A plain decimal number (`-0.25`, `1e-07`) is left as it is: no spreadsheet runs it."""
    text = "" if value is None else one_line(value)
    if _NUMBER.fullmatch(text.strip()):
        return text
    start = text.lstrip(" ")[:1]
    return "'" + text if start and start in _FORMULA_START else text


def escaped(c: str) -> str:
    """One character written out as Python writes it in a string: `\\n`, `\\x1b`, `\\u202e`, `\\U000e0041`."""
    n = ord(c)
    return _NAMED.get(c) or (f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")


def _escape(match: re.Match) -> str:
    return escaped(match.group())


def printable(text, *, newlines: bool = False) -> str:
    """`text` for a terminal: control characters (C0 but the tab, DEL, C1) and format characters (Cf: bidirectional
    and invisible ones) written out as `\\x1b`, `\\n`, `\\r`, `\\u202e`, so none is obeyed; line feeds kept only
    with `newlines=True` (text that is several lines by design)."""
    return (_CONTROLS_BUT_NEWLINE if newlines else _CONTROLS).sub(_escape, str(text))


def printable_tree(value):
    """A JSON-like value (dicts, lists, strings, numbers) with every string in it, keys included, `printable`
    (one line each): what a human-readable printer can interpolate anywhere."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(k) if isinstance(k, str) else k: printable_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_tree(v) for v in value]
    return value
