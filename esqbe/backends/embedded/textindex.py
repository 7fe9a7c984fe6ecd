"""BM25 on the embedded index: the tantivy text index derived from SQLite (title + abstract, plus one field per
facet), its sync by the writer, and the query side (terms analysed as the fields are, common terms dropped)."""
from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from ...domain import FACET_LABELS
from .host import EmbeddedHost

#: a BM25 query keeps at least its this many most selective terms, however common they are
BM25_MIN_TERMS = 8

_QUERY_SYNTAX = re.compile(r"[^\w\s]+", re.UNICODE)
#: the OS error number in a tantivy IO error ("An IO error occurred: 'No space left on device (os error 28) ..."')
_OS_ERROR = re.compile(r"\(os error (\d+)\)|\bOs \{ code: (\d+)")

_ANALYZER = None


def _io_errno(message: str, path: Path) -> int | None:
    """The OS error behind a tantivy ValueError, or None when it is not an IO error: the number tantivy names, or,
    for a writer whose worker thread died of an IO error (tantivy names none), ENOSPC when the disk is (nearly) full
    and EIO otherwise."""
    import errno
    import shutil

    found = _OS_ERROR.search(message)
    if found is not None:
        return int(found.group(1) or found.group(2))
    if "index writer was killed" not in message:
        return None
    try:
        full = shutil.disk_usage(path).free < (1 << 20)
    except OSError:
        full = False
    return errno.ENOSPC if full else errno.EIO


class TextIndexMixin(EmbeddedHost):
    """The tantivy index and BM25 (mixed into EmbeddedBackend). Uses the backend's `writable`, `_tx`,
    `_bump_generation` (WriteLockMixin), `_state` (AnnMixin) and `knn_params`."""

    @staticmethod
    def _text_schema():
        import tantivy

        sb = tantivy.SchemaBuilder()
        sb.add_text_field("paper_id", stored=True, tokenizer_name="raw")
        for f in ("title", "abstract", *(f"facet_{x}" for x in FACET_LABELS)):
            sb.add_text_field(f, tokenizer_name="en_stem")
        return sb.build()

    @property
    def text_index(self):
        if self._text_index is None:
            import tantivy

            text = self.path / "text"
            if self.writable:
                text.mkdir(exist_ok=True)
                self._text_index = tantivy.Index(self._text_schema(), path=str(text), reuse=True)
            elif (text / "meta.json").exists() and os.access(text, os.W_OK):
                self._text_index = tantivy.Index.open(str(text))
            elif (text / "meta.json").exists():
                # tantivy's reader takes a lock file beside the index; where it cannot write (a read-only
                # index), it reads the same files through a private directory of links
                import atexit
                import shutil
                import tempfile

                shadow = Path(tempfile.mkdtemp(prefix="esqbe-text-"))
                atexit.register(shutil.rmtree, shadow, True)
                for f in text.resolve().iterdir():  # absolute links: the index may be named relative to the cwd
                    if not f.name.endswith(".lock"):
                        os.symlink(f, shadow / f.name)
                self._text_index = tantivy.Index.open(str(shadow))
            else:  # nothing indexed yet: an empty in-memory index answers BM25 with nothing
                self._text_index = tantivy.Index(self._text_schema())
        return self._text_index

    def _drop_text_writer(self) -> None:
        writer, self._text_writer = self._text_writer, None
        if writer is not None:
            try:
                writer.wait_merging_threads()  # consumes the writer: its lock file is released now, not at exit
            except (ValueError, RuntimeError):
                pass

    def _sync_text(self) -> None:
        """Writer only: bring the tantivy index up to SQLite (delete removed papers, (re)add pending ones)."""
        deletes = [r[0] for r in self._db.execute("SELECT paper_id FROM text_deletes")]
        pending = self._db.execute(
            "SELECT paper_id, title, sentences, facets FROM papers WHERE text_indexed = 0"
        ).fetchall()
        if not deletes and not pending:
            return

        try:
            if self._text_writer is None:
                self._text_writer = self.text_index.writer(heap_size=200_000_000, num_threads=1)
            writer = self._text_writer
            for pid in deletes:
                writer.delete_documents_by_term("paper_id", pid)
            unindexable = []
            for pid, title, sentences, facets in pending:
                writer.delete_documents_by_term("paper_id", pid)
                try:
                    document = _text_document(pid, title, json.loads(sentences), json.loads(facets))
                except (TypeError, ValueError) as e:
                    unindexable.append((pid, e))
                    continue
                writer.add_document(document)
            writer.commit()
        except ValueError as e:  # tantivy's IO errors come as ValueError: an OSError, worded as any (disk full, read-only)
            code = _io_errno(str(e), self.path)
            if code is None:
                raise
            self._drop_text_writer()  # a writer that failed is not used again, and lets go of its lock
            raise OSError(code, f"cannot write the text index in {self.path}: {os.strerror(code)}") from None
        with self._tx():
            self._db.executemany("DELETE FROM text_deletes WHERE paper_id = ?", [(p,) for p in deletes])
            self._db.executemany("UPDATE papers SET text_indexed = 1 WHERE paper_id = ?", [(p[0],) for p in pending])
            # a stored row the text index cannot take (written by an esqbe that did not check its input): it
            # stays out of BM25, marked so that no later write replays it, and is reported once, here
            self._db.executemany("UPDATE papers SET text_indexed = 2 WHERE paper_id = ?", [(p,) for p, _ in unindexable])
            self._bump_generation()  # readers reload the text index on a new generation
        self.text_index.reload()
        for pid, why in unindexable:
            print(f"esqbe: warning: paper {pid} in {self.path} cannot be indexed for BM25 ({why}); it is left out of "
                  "BM25: index a corrected copy or delete it", file=sys.stderr, flush=True)

    def bm25(self, text: str, k: int, *, exclude: frozenset[str] = frozenset(), restrict_to: frozenset[str] | None = None,
             fields: Sequence[str] = ("title", "abstract")) -> dict[str, float]:
        """BM25 of the query text against the given fields; returns paper id -> score.

        The query is the query parser's: each distinct word of the text, analysed (en_stem), as a term
        query in each field, all SHOULD; except that terms found in more than `bm25_max_df` (a fraction,
        default 0.2) of the documents are dropped, keeping at least the BM25_MIN_TERMS most selective:
        classic corpus-statistics stop words (Lucene's more-like-this max_doc_freq, Elasticsearch's old
        cutoff_frequency). They add little to BM25 (idf < 1.6) and cost the most: at 1M papers the
        ~55-word query of a facet takes ~38 ms with them and ~9 ms without (docs/performance.md); the
        CSFCube dev default moved from 61.92 to 61.86 aggregated NDCG%20. 1.0 keeps every term. A long query (many
        sentences) then keeps its `bm25_max_terms` (default 48) most selective terms: BM25's cost grows with its
        terms, and at 1M papers the p99 of BM25 alone fell from 36-43 to 18 ms (CSFCube dev 62.01 -> 61.98)."""
        terms = _query_terms(text)
        if not terms or k <= 0:
            return {}
        self._state()  # reloads the text index if a writer committed since
        return self._bm25(terms, k, exclude, restrict_to, fields)

    def _bm25(self, terms: list[str], k: int, exclude: frozenset[str], restrict_to: frozenset[str] | None,
              fields: Sequence[str]) -> dict[str, float]:
        """bm25() on analysed terms, without refreshing the reader's view (first_stage runs it in a thread)."""
        import tantivy

        index = self.text_index
        schema = index.schema
        searcher = index.searcher()
        params = self.knn_params()
        max_df, max_terms = float(params["bm25_max_df"]), int(params["bm25_max_terms"])
        distinct = list(dict.fromkeys(terms))
        if (max_df < 1.0 and len(distinct) > BM25_MIN_TERMS) or (0 < max_terms < len(distinct)):
            df = {t: max(searcher.doc_freq(f, t) for f in fields) for t in distinct}
            present = sorted((t for t in distinct if df[t]), key=lambda t: df[t])  # a term in no document scores nothing
            max_docs = max_df * searcher.num_docs
            keep = present[:BM25_MIN_TERMS] + [t for t in present[BM25_MIN_TERMS:] if df[t] <= max_docs]
            if max_terms > 0:  # a long query keeps its most selective terms (p99 of BM25 at 1M: 36-43 -> 18 ms at 48)
                keep = keep[:max(max_terms, BM25_MIN_TERMS)]
            terms = [t for t in terms if t in set(keep)]
        query = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(schema, f, t, index_option="freq")) for t in terms for f in fields])
        limit = k
        if restrict_to is None and len(exclude) <= 64:
            # a bare disjunction of term queries is what tantivy prunes with block-max WAND (~1.5x faster at
            # 1M papers); wrapped with a MUST_NOT it is scored exhaustively, so the few excluded papers (the
            # query paper) are dropped from a slightly longer list instead
            limit = k + len(exclude)
        else:
            clauses = [(tantivy.Occur.Must, query)]
            if restrict_to is not None:  # a filter, scoring 0: a paper's BM25 is the same restricted or not
                clauses.append((tantivy.Occur.Must, tantivy.Query.const_score_query(
                    tantivy.Query.term_set_query(schema, "paper_id", sorted(restrict_to)), 0.0)))
            if exclude:
                clauses.append((tantivy.Occur.MustNot, tantivy.Query.term_set_query(schema, "paper_id", sorted(exclude))))
            query = tantivy.Query.boolean_query(clauses)
        out: dict[str, float] = {}
        for score, addr in searcher.search(query, limit=limit, count=False).hits:
            pid = searcher.doc(addr)["paper_id"][0]
            if pid not in exclude and len(out) < k:
                out[pid] = float(score)
        return out


def _text_document(pid: str, title, sentences, facets):
    """The tantivy document of a stored paper (TypeError/ValueError for a row that is not one)."""
    import tantivy

    if not isinstance(title, str) or not isinstance(sentences, list) or not isinstance(facets, list):
        raise TypeError("title, sentences or facets of the wrong type")
    fields = {"paper_id": pid, "title": title, "abstract": " ".join(sentences)}
    for label in FACET_LABELS:
        text = " ".join(s for s, f in zip(sentences, facets) if f == label)
        if text:
            fields[f"facet_{label}"] = text
    return tantivy.Document(**fields)


def _query_terms(text: str) -> list[str]:
    """The query parser's terms for `text`: its distinct words (lower-cased, query syntax dropped), analysed
    as the text fields are (so two words with one stem give that term twice, as the parser does)."""
    words = list(dict.fromkeys(_QUERY_SYNTAX.sub(" ", text or "").lower().split()))
    return _analyzer().analyze(" ".join(words)) if words else []


def _analyzer():
    """tantivy's `en_stem` analyzer (the text fields' tokenizer), to turn query text into the indexed terms."""
    global _ANALYZER
    if _ANALYZER is None:
        import tantivy

        _ANALYZER = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple()).filter(tantivy.Filter.remove_long(40))
                     .filter(tantivy.Filter.lowercase()).filter(tantivy.Filter.stemmer("english")).build())
    return _ANALYZER

