"""BibTeX's field values both ways: a value as written (its LaTeX, its delimiters, `@string` references resolved)
decoded to the text search, display and the other formats use (pylatexenc, as bibtexparser's LatexDecodingMiddleware
decodes), and a text from any other format encoded as a value that decodes back to it and that LaTeX prints as that
text: TeX's specials escaped, inline math (`$\\mu$`) kept as math, Unicode kept as UTF-8.

A value read from BibTeX is kept as written beside its decoded text (`esqbe.ingest.library`), so that a BibTeX export
writes it back byte for byte (`written`: runs of white space one space, as BibTeX reads them); `writable` checks such
a value before it is written, whatever metadata it came from.
"""
from __future__ import annotations

import functools
import re

from ..core.textsafe import one_line


def carried(text) -> str:
    """What every export carries of a text, and what every reader of these formats keeps: control characters and
    line breaks (C0, DEL, C1, U+2028/9: no format's one-line value can hold them, `esqbe.core.textsafe.one_line`)
    become spaces, and each run of whitespace (Unicode's, no-break spaces too) is one space, none at either end.
    Everything else (braces, backslashes, `$...$`, accents, any other character) is carried exactly."""
    return " ".join(one_line(text).split())


def written(value: str) -> str:
    """A BibTeX value as written, as BibTeX reads it: each run of white space (and any control character or line
    break, which no exported value holds) one space, none at either end; every other character as it is (a `~`, a
    no-break space, a brace)."""
    return re.sub(" {2,}", " ", one_line(value)).strip(" ")


# ---------------------------------------------------------------- text -> a BibTeX value

#: the ASCII characters TeX gives a meaning; each is written as bibtexparser's LatexEncodingMiddleware (pylatexenc's
#: latexencode) writes it: `{\\textbackslash}` (as Zotero does), `\\{`, `\\$`, `\\%`, `{\\textasciitilde}`, ...
_TEX_SPECIALS = "\\{}$%&#_~^"
#: a brace with no partner in the text: written as a macro, so that the field's braces stay balanced
_UNMATCHED = {"{": "{\\textbraceleft}", "}": "{\\textbraceright}"}
#: inline math as Pandoc tells it from a price: `$` then a character that is not a space, up to the next `$` with
#: no space before it and no digit after it (`$\\mu$m` is math, `$5 and $10` is not); an escape (`\\$`) inside
_MATH = re.compile(r"\$(?=[^\s$])((?:[^$\\]|\\.)*?(?:[^\s$\\]|\\.))\$(?!\d)", re.DOTALL)
#: what inline math may not hold unescaped: TeX's comment, parameter and alignment characters
_NOT_IN_MATH = re.compile(r"(?<!\\)(?:\\\\)*[%#&]")
#: a word with a capital after its first letter (ASR, BERT, iPhone, LaTeX, 3D): styles that lower-case titles
#: must leave it be, so a title's is braced
_WORD = re.compile(r"[^\W_]+")


@functools.cache
def _tex_escapes() -> dict[str, str]:
    from pylatexenc.latexencode import unicode_to_latex  # type: ignore[import-untyped]

    return {c: unicode_to_latex(c, non_ascii_only=False) for c in _TEX_SPECIALS}


def bib_escape(text, protect_capitals: bool = False) -> str:
    """`text` (as `carried`) as a BibTeX field value that esqbe's reader (`latex_decoder`) decodes back to exactly
    that text and LaTeX prints as it: inline math (`_MATH`, balanced, read back verbatim) is written as it is; in the
    rest TeX's specials are escaped (`_TEX_SPECIALS`), a brace with no partner is `{\\textbraceleft}` (braces stay
    balanced), and what LaTeX would make a ligature or a quote is kept apart: `-{}-` (not an en dash), `'{}'`,
    `` {`} `` (not a curly quote or `¡`). Other characters (accents, any script, math symbols) are kept as UTF-8.
    With `protect_capitals` (a title), each word of the text with a capital after its first letter is braced."""
    text = carried(text)
    out, pos = [], 0
    for m in _MATH.finditer(text):
        if not _math_kept(m.group()):
            continue
        out.append(_escaped(text[pos:m.start()], protect_capitals))
        out.append(m.group())
        pos = m.end()
    out.append(_escaped(text[pos:], protect_capitals))
    return "".join(out)


def _math_kept(span: str) -> bool:
    """Whether inline math can be written as it is: its braces balanced for BibTeX (which counts every brace) and
    for TeX (which does not count `\\{`), no unescaped `%`, `#`, `&`, and esqbe's decoder reads it back verbatim."""
    inner = span[1:-1]
    if _NOT_IN_MATH.search(inner) or not _balanced(inner) or not _balanced(re.sub(r"\\.", "", inner, flags=re.DOTALL)):
        return False
    try:
        return latex_decoder()(span) == span
    except Exception:  # noqa: BLE001 (pylatexenc raises anything)
        return False


def _escaped(text: str, protect_capitals: bool) -> str:
    escapes = _tex_escapes()
    partners = _brace_partners(text)
    out = []
    for i, c in enumerate(text):
        if c in "{}" and i not in partners:
            out.append(_UNMATCHED[c])
        elif c in escapes:
            out.append(escapes[c])
        elif c == "`":
            out.append("{`}")
        elif c in "-'" and text[i + 1:i + 2] == c:
            out.append(c + "{}")
        else:
            out.append(c)
    escaped = "".join(out)
    if not protect_capitals:
        return escaped
    # escapes are `\%` or `{\textmacro}`: no capital to brace
    return _WORD.sub(lambda m: f"{{{m.group()}}}" if any(c.isupper() for c in m.group()[1:]) else m.group(), escaped)


def _brace_partners(text: str) -> set[int]:
    """The positions of the braces of `text` that pair up."""
    stack: list[int] = []
    paired: set[int] = set()
    for i, c in enumerate(text):
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            paired.update((stack.pop(), i))
    return paired


def _balanced(text: str) -> bool:
    depth = 0
    for c in text:
        if c in "{}":
            depth += 1 if c == "{" else -1
            if depth < 0:
                return False
    return depth == 0


# ---------------------------------------------------------------- a BibTeX value -> text


@functools.cache
def latex_decoder():
    """LaTeX to text, as bibtexparser's LatexDecodingMiddleware decodes (braces dropped, math kept, `\\url` bare)."""
    import pylatexenc.latex2text  # type: ignore[import-untyped]
    from pylatexenc.latex2text import LatexNodes2Text, MacroTextSpec

    context = pylatexenc.latex2text.get_default_latex_context_db()
    context.add_context_category("bibtexparse-default-context", prepend=True,
                                 macros=[MacroTextSpec("url", simplify_repl="%s"),
                                         # what `bib_escape` writes that pylatexenc reads otherwise (or not at all)
                                         MacroTextSpec("textasciicircum", simplify_repl="^"),
                                         MacroTextSpec("textbraceleft", simplify_repl="{"),
                                         MacroTextSpec("textbraceright", simplify_repl="}")])
    return LatexNodes2Text(latex_context=context, keep_braced_groups=False, math_mode="verbatim").latex_to_text


def strip_enclosing(value: str) -> str:
    """A field's value without the braces or quotes around it: `{...}` whose first brace closes at its end (not
    `{a} # {b}`), or `"..."` (bibtexparser's rule; escaped braces are not counted)."""
    value = value.strip()
    if len(value) >= 2 and value[0] == "{" and value[-1] == "}" and _first_brace_closes_at_end(value):
        return value[1:-1]
    if len(value) >= 2 and value[0] == value[-1] == '"' and _quote_encloses(value):
        return value[1:-1]
    return value


_BRACE = re.compile(r"(?<!\\)[{}]")


def _first_brace_closes_at_end(value: str) -> bool:
    depth = 0
    for match in _BRACE.finditer(value):
        depth += 1 if match.group() == "{" else -1
        if depth <= 0:
            return depth == 0 and match.start() == len(value) - 1
    return False


def _quote_encloses(value: str) -> bool:
    """`"..."` with no quote outside braces in between (`"a" # "b"` is a concatenation, not one value)."""
    depth = 0
    for match in re.finditer(r'(?<!\\)[{}"]', value[1:-1]):
        char = match.group()
        depth = depth + 1 if char == "{" else max(depth - 1, 0) if char == "}" else depth
        if char == '"' and depth == 0:
            return False
    return True


def concatenated(value: str) -> list[str]:
    """A value's pieces joined by BibTeX's `#` (outside braces and quotes), each stripped: [value] when it has none."""
    pieces, start, depth, quoted = [], 0, 0, False
    for i, c in enumerate(value):
        if c == "{":
            depth += 1
        elif c == "}":
            depth = max(depth - 1, 0)
        elif c == '"' and depth == 0:
            quoted = not quoted
        elif c == "#" and depth == 0 and not quoted:
            pieces.append(value[start:i].strip())
            start = i + 1
    return [*pieces, value[start:].strip()]


#: a value written bare: a number, or the name of an `@string` (BibTeX's own: `jan` ... `dec`)
_BARE = re.compile(r"\d+|[A-Za-z_][\w\-.:+/]*")
#: a field's name, an entry's type
_NAME = re.compile(r"[A-Za-z][\w\-:.+]{0,63}")


def writable(name, value) -> bool:
    """Whether a field kept as written (`name = value`) can be written into a BibTeX file as it is, whatever metadata
    it came from: a name BibTeX takes, and a value that is one line, one `{...}` or `"..."` whose braces balance
    (none closing the value early), a number or an `@string` name; else the field is written from its text."""
    if not isinstance(name, str) or not isinstance(value, str) or not _NAME.fullmatch(name) or value != written(value):
        return False
    if _BARE.fullmatch(value):
        return True
    if len(value) < 2 or value[0] + value[-1] not in ("{}", '""'):
        return False
    inner = value[1:-1]
    depth = 0
    for c in inner:
        if c in "{}":
            depth += 1 if c == "{" else -1
            if depth < 0:
                return False
        elif c == '"' and value[0] == '"' and depth == 0:
            return False
    return depth == 0


def entry_type_ok(kind) -> bool:
    return isinstance(kind, str) and bool(_NAME.fullmatch(kind))
