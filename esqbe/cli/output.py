"""What the commands print: text for people with its control characters shown, not obeyed; JSON with none raw.

A title, a venue, a sentence, a metadata key, an error quoting an id, a server's note: any of it may carry an
escape sequence (a window title, a screen clear, a disguised link). `say` is the one way human-readable text
reaches the terminal: C0 and C1 controls and DEL written out (`\\x1b`) by `esqbe.core.textsafe.printable`,
tabs and the text's own line feeds kept; a value printed inside one line is made `printable` (or the whole
result `printable_tree`) first, so that a line break in it cannot forge a line either. `echo_json` is
`json.dumps`, which escapes C0 controls, with DEL, the C1 controls and the format characters (Cf: bidirectional
and invisible ones) escaped too (still the same JSON).
"""
from __future__ import annotations

import json
import re

import click

from esqbe.core.textsafe import FORMAT_CHARS, printable

#: what `json.dumps` leaves raw that a terminal obeys or draws otherwise: DEL, C1, format characters (Cf)
_RAW_IN_JSON = re.compile(f"[\x7f-\x9f{FORMAT_CHARS}]")


def say(text: str = "", *, err: bool = False, nl: bool = True) -> None:
    """`click.echo` of human-readable text, its control characters (but tabs and line feeds) escaped."""
    click.echo(printable(text, newlines=True), err=err, nl=nl)


def echo_json(data, *, indent: int | None = 2) -> None:
    """`data` as JSON on stdout: non-ASCII text as it is, but no control character raw (`\\u009b`)."""
    text = json.dumps(data, indent=indent, ensure_ascii=False)
    click.echo(_RAW_IN_JSON.sub(_json_escape, text))


def _json_escape(match: re.Match) -> str:
    """A character as JSON writes it escaped: `\\u202e`; one past U+FFFF as its UTF-16 surrogate pair."""
    n = ord(match.group())
    if n < 0x10000:
        return f"\\u{n:04x}"
    n -= 0x10000
    return f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}"


def hit_head(hit: dict) -> list[str]:
    """A hit's first two lines: `  3. score 0.5950  [strong, p97]  ID  Title` and its parts `(sim 0.6297, bm25 3.1)`:
    the score is the number the ranking (and a watch's threshold) uses, the parts what it is made of; a likely
    version (no rank: `  -.`) says which paper it repeats."""
    sim = "-" if hit["similarity"] is None else f"{hit['similarity']:.4f}"
    band, pct = hit.get("band"), hit.get("percentile")
    place = f"[{band}{'' if pct is None else f', p{int(pct)}'}]  " if band else ""
    rank = f"{hit['rank']:>3}." if hit.get("rank") is not None else "  -"
    head = [f"{rank} score {hit['score']:.4f}  {place}{hit['paper_id']}  {hit['title']}",
            f"       (sim {sim}, bm25 {hit['bm25']:.1f})"]
    if hit.get("likely_version_of"):  # out of the numbered ranking: which paper it repeats
        overlap = f", sentence overlap {hit['version_overlap']:.3f}" if hit.get("version_overlap") is not None else ""
        head.append(f"       likely a version of {hit['likely_version_of']} (nearly the same sentences{overlap})")
    return head
