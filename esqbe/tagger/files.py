"""`esqbe tag`: label the sentences of a file's records and write them out, keeping each record's other fields."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .runtime import FacetTagger

# ================================================================ tagging a file
_ID_KEYS = {"s2orc": "paper_id", "csfcube": "paper_id", "csabstruct": "paper_id", "jsonl": "id",
            "s2ag-abstracts": "corpusid", "s2ag-s2orc": "corpusid"}


def _record_id(raw, fmt: str | None):
    """Best-effort paper id of a line that yielded no paper, so its output line can still be matched up."""
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    keys = [_ID_KEYS[fmt]] if fmt else ["paper_id", "corpusid", "id"]
    lower = {str(k).lower(): v for k, v in record.items()}
    for key in keys:
        value = lower.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return str(value)
    return None


def _records(lines, name: str, fmt: str | None, strict: bool, summary: dict):
    """Yield, per non-blank line and in order, `("paper", Paper)` or `("other", output record)` for a
    line without an abstract or (unless `strict`) a bad one. Each line is parsed by `read_papers`,
    so every format and every check of the readers applies; line numbers are the file's."""
    import io

    from ..ingest.formats import detect_format
    from ..ingest.readers import InputError, LongLine, ReadReport, read_papers

    for lineno, raw_line in enumerate(lines, start=1):
        if not raw_line.strip():
            continue
        summary["records"] += 1
        if isinstance(raw_line, LongLine):  # past max_line_bytes: read no further than the bound, never parsed
            error = InputError(name, lineno, "line", raw_line.reason())
            if strict:
                raise error
            summary["errors"].append(str(error))
            yield "other", {"paper_id": None, "sentences": [], "facets": [], "error": str(error)}
            continue
        if fmt is None:  # detected once, from the first parseable record, as read_papers does
            try:
                first = json.loads(raw_line)
            except (ValueError, UnicodeDecodeError):
                first = None
            if isinstance(first, dict):
                try:
                    fmt = detect_format(first)
                except ValueError as e:
                    raise InputError(name, lineno, "format", str(e)) from None
        report = ReadReport()
        one = io.BytesIO(raw_line) if isinstance(raw_line, bytes) else io.StringIO(raw_line)
        try:
            papers = list(read_papers(one, format=fmt, strict=True, report=report))
        except InputError as e:
            error = InputError(name, lineno, e.field, e.reason)
            if strict:
                raise error from None
            summary["errors"].append(str(error))
            yield "other", {"paper_id": _record_id(raw_line, fmt), "sentences": [], "facets": [], "error": str(error)}
            continue
        if papers:
            yield "paper", papers[0]
        else:
            reason = next(iter(report.skipped), "skipped")
            summary["skipped"][reason] += 1
            yield "other", {"paper_id": _record_id(raw_line, fmt), "sentences": [], "facets": [], "skipped": reason}


def tag_file(source, out, *, format: str | None = None, raw: bool = False, tagger: FacetTagger | None = None,
             encoder=None, strict: bool = False, chunk_size: int = 256, progress: bool = False,
             max_line_bytes: int | None = None) -> dict:
    """Tag every abstract of `source` and write JSONL `{"paper_id","title","sentences","facets"}`.

    One output line per input record (non-blank line), in input order, so outputs line up with
    inputs: a record without an abstract gets `"sentences": [], "facets": [], "skipped": "no abstract"`,
    and (unless `strict`, which raises) a bad line gets `"error": "file:line: field: reason"`.
    `source` is a path (gzip or not), `-` (stdin) or a stream, read a line at a time under `max_line_bytes` (a
    longer line is a bad line; None: esqbe.ingest.readers.MAX_LINE_BYTES); `out` a path, `-` (stdout) or a stream.
    A path is written aside and renamed at the end, so a failed run leaves no half-written file.
    Returns a summary with counts per label.
    """
    import collections
    from contextlib import ExitStack

    from ..ingest.readers import open_lines

    if tagger is None:
        tagger = FacetTagger.load(encoder=encoder)
    elif encoder is not None:
        tagger.check_encoder(encoder)
        tagger._encoder = encoder
    started = time.time()
    summary: dict[str, Any] = {"records": 0, "tagged": 0, "sentences": 0, "skipped": collections.Counter(), "errors": [],
               "labels": collections.Counter()}

    def flush(pending, sink):
        papers = [item for kind, item in pending if kind == "paper"]
        labels = iter(tagger._tag_encoded(papers, raw, progress) if papers else [])
        for kind, item in pending:
            if kind == "paper":
                facets = next(labels)
                summary["tagged"] += 1
                summary["sentences"] += len(facets)
                summary["labels"].update(facets)
                item = {"paper_id": item.paper_id, "title": item.title, "sentences": item.sentences, "facets": facets}
            sink.write(json.dumps(item, ensure_ascii=False) + "\n")

    to_path = not hasattr(out, "write") and not (isinstance(out, str) and out == "-")
    tmp = Path(str(out) + ".tmp") if to_path else None
    try:
        with ExitStack() as stack:
            name, lines = open_lines(source, stack, max_line_bytes)
            sink = (stack.enter_context(open(tmp, "w", encoding="utf-8")) if tmp is not None
                    else (sys.stdout if isinstance(out, str) else out))
            pending, n_papers = [], 0
            for kind, item in _records(lines, name, format, strict, summary):
                pending.append((kind, item))
                n_papers += kind == "paper"
                if n_papers >= chunk_size:
                    flush(pending, sink)
                    pending, n_papers = [], 0
            flush(pending, sink)
    except BaseException:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise
    if tmp is not None:
        os.replace(tmp, out)
    summary["skipped"] = dict(sorted(summary["skipped"].items()))
    summary["labels"] = dict(sorted(summary["labels"].items()))
    summary["out"] = str(out) if not hasattr(out, "write") else getattr(out, "name", "<stream>")
    summary["seconds"] = round(time.time() - started, 1)
    return summary
