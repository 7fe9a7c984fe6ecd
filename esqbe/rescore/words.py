"""In-domain word vectors for asymmetric matching: `esqbe train-words` and what it writes.

`train_words(sources, out)` trains word2vec (gensim, skip-gram) on a text corpus and writes a
directory the matcher and the `asym_token` rescorer load with `--param words=DIR`:

* `vectors.kv` (+ `vectors.kv.vectors.npy`): gensim KeyedVectors;
* `counts.tsv`: every token of the corpus and its count (also those under `min_count`, which
  get no vector), the statistics behind p(w) = count / total in the weights alpha / (alpha + p(w));
* `words.json`: how it was made (tokenisation, casing, marker removal, word2vec settings, corpus size).

Sources: files (`.xml` CL-SciSumm/ScisummNet papers, read as their `<S>` sentences; `.txt`, one
text a line; `.jsonl` with `text`/`sentences`/`abstract`/`title`; `.gz` of those), directories
(their `*.xml`, `*.txt`, `*.jsonl` files, recursively), `.tar.gz` archives (their members of
those kinds), and the papers of an esqbe index (`papers=`). The text is prepared as the
matcher prepares it (citation markers removed, tokenised, cased or not), so the vocabulary and
the counts are those the matcher looks up.
"""
from __future__ import annotations

import gzip
import html
import json
import re
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError
from .asym import strip_citation_markers, word_tokens

VECTORS_FILE = "vectors.kv"
COUNTS_FILE = "counts.tsv"
META_FILE = "words.json"
TEXT_SUFFIXES = (".xml", ".txt", ".jsonl")
#: an <S> element's text; neither pattern scans past the next "<S" / "<" from where it starts, so an unclosed
#: element (or a run of "<") costs linear time, not the rest of the text from every start
_S_ELEMENT = re.compile(r"<S\b[^<>]*+>((?:[^<]++|<(?!/?S\b))*+)</S>")
_TAG = re.compile(r"<[^<>]++>")


class WordsError(DataError):
    """A corpus source or a word-vector directory cannot be used; the message says which and why."""


# --- reading a corpus -----------------------------------------------------------------------------------


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")  # several ScisummNet / CL-SciSumm XML files are latin-1


def _texts_of(name: str, data: bytes) -> Iterator[str]:
    """The texts of one file's bytes, by its name's suffix (after .gz)."""
    if name.endswith(".gz"):
        data, name = gzip.decompress(data), name[:-3]
    text = _decode(data)
    if name.endswith(".xml"):
        for m in _S_ELEMENT.finditer(text):
            yield html.unescape(_TAG.sub(" ", m.group(1)))
    elif name.endswith(".jsonl"):
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise WordsError(f"{name}: a line is not valid JSON") from None
            for key in ("title", "text", "abstract", "sentences"):
                value = rec.get(key) if isinstance(rec, dict) else None
                if isinstance(value, str):
                    yield value
                elif isinstance(value, list):
                    yield from (str(v) for v in value)
    else:
        yield from text.splitlines()


def _is_text_file(name: str) -> bool:
    base = name[:-3] if name.endswith(".gz") else name
    return base.endswith(TEXT_SUFFIXES)


def corpus_texts(sources: Sequence[str], papers: Iterable | None = None) -> Iterator[str]:
    """Every text of the sources (see the module docstring), then of `papers` (title and sentences)."""
    for source in sources:
        path = Path(source)
        if not path.exists():
            raise WordsError(f"{source}: no such file or directory")
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and _is_text_file(p.name))
            if not files:
                raise WordsError(f"{source}: no *.xml, *.txt or *.jsonl files in this directory")
            for f in files:
                yield from _texts_of(f.name, f.read_bytes())
        elif path.name.endswith((".tar.gz", ".tgz", ".tar")):
            try:
                with tarfile.open(path) as tar:
                    for member in tar:
                        member_file = tar.extractfile(member) if member.isfile() else None  # None: not a file
                        if member_file is not None and _is_text_file(member.name):
                            yield from _texts_of(member.name, member_file.read())
            except tarfile.TarError as e:
                raise WordsError(f"{source}: not a readable tar archive: {e}") from None
        elif _is_text_file(path.name):
            yield from _texts_of(path.name, path.read_bytes())
        else:
            raise WordsError(f"{source}: not a corpus file (expected .xml, .txt, .jsonl, .gz, a directory or a .tar.gz)")
    for p in papers or ():
        if p.title:
            yield p.title
        yield from p.sentences


def prepare(text: str, *, cased: bool = True, markers: bool = True) -> list[str]:
    """A text as the matcher sees it: citation markers removed (unless `markers` is False), tokenised."""
    return word_tokens(strip_citation_markers(text, narrative=True) if markers else text, cased=cased)


# --- training ---------------------------------------------------------------------------------------------


@dataclass
class TrainReport:
    out: str
    texts: int
    tokens: int
    distinct: int
    vocabulary: int
    seconds: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def train_words(sources: Sequence[str], out: str | Path, *, papers: Iterable | None = None, dim: int = 300,
                min_count: int = 35, window: int = 5, epochs: int = 5, sg: bool = True, cased: bool = True,
                markers: bool = True, workers: int = 2, seed: int = 0, log=None) -> TrainReport:
    """Train word2vec on the sources' texts and write `out/` (vectors, counts, settings)."""
    from gensim.models import Word2Vec

    log = log or (lambda msg: print(msg, file=sys.stderr))
    for name, value in (("dim", dim), ("min_count", min_count), ("window", window), ("epochs", epochs), ("workers", workers)):
        if int(value) < 1:
            raise WordsError(f"{name} must be at least 1 (got {value})")
    start = time.perf_counter()
    sentences = [toks for toks in (prepare(t, cased=cased, markers=markers) for t in corpus_texts(sources, papers)) if toks]
    counts = Counter(t for toks in sentences for t in toks)
    total = sum(counts.values())
    if not total:
        raise WordsError("the corpus has no tokens")
    log(f"corpus: {len(sentences)} texts, {total} tokens, {len(counts)} distinct; "
        f"training word2vec ({dim}-d, min count {min_count})")
    model = Word2Vec(sentences, vector_size=int(dim), window=int(window), min_count=int(min_count), sg=int(bool(sg)),
                     epochs=int(epochs), workers=int(workers), seed=int(seed))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.wv.save(str(out / VECTORS_FILE))
    with (out / COUNTS_FILE).open("w", encoding="utf-8") as fp:
        for tok, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            fp.write(f"{tok}\t{n}\n")
    report = TrainReport(str(out), len(sentences), total, len(counts), len(model.wv), round(time.perf_counter() - start, 1))
    meta = {"format": 1, "tokenizer": "esqbe.rescore.asym.word_tokens", "cased": bool(cased), "markers_removed": bool(markers),
            "dim": int(dim), "min_count": int(min_count), "window": int(window), "epochs": int(epochs), "sg": bool(sg),
            "seed": int(seed), "texts": len(sentences), "tokens": total, "distinct": len(counts),
            "vocabulary": len(model.wv), "sources": [str(s) for s in sources]}
    (out / META_FILE).write_text(json.dumps(meta, indent=1))
    return report


# --- using them ---------------------------------------------------------------------------------------------

_LOADED: dict[str, WordVectors] = {}


class WordVectors:
    """A `train-words` directory: unit word vectors, corpus counts, and the preparation they assume."""

    def __init__(self, path: str | Path):
        from gensim.models import KeyedVectors

        self.path = Path(path)
        meta_path = self.path / META_FILE
        if not meta_path.is_file() or not (self.path / VECTORS_FILE).is_file():
            raise WordsError(f"{self.path}: not a word-vector directory from `esqbe train-words` "
                             f"(needs {VECTORS_FILE}, {COUNTS_FILE}, {META_FILE})")
        try:
            self.meta = json.loads(meta_path.read_text())
            self.kv = KeyedVectors.load(str(self.path / VECTORS_FILE))
        except (OSError, ValueError) as e:
            raise WordsError(f"{self.path}: cannot load word vectors: {e}") from None
        self.cased = bool(self.meta.get("cased", True))
        self.dim = int(self.kv.vector_size)
        self.unit = self.kv.get_normed_vectors().astype(np.float32)
        self._counts: dict[str, int] = {}
        with (self.path / COUNTS_FILE).open(encoding="utf-8") as fp:
            for lineno, line in enumerate(fp, 1):
                tok, sep, n = line.rstrip("\n").rpartition("\t")
                if not sep:
                    raise WordsError(f"{self.path / COUNTS_FILE}:{lineno}: expected TOKEN<TAB>COUNT")
                self._counts[tok] = int(n)
        self.total = sum(self._counts.values())

    @classmethod
    def load(cls, path: str | Path) -> WordVectors:
        key = str(Path(path).resolve())
        if key not in _LOADED:
            _LOADED[key] = cls(path)
        return _LOADED[key]

    def counts(self) -> tuple[dict[str, int], int]:
        return self._counts, self.total

    def tokens(self, text: str, *, markers: bool = True) -> list[str]:
        return prepare(text, cased=self.cased, markers=markers)

    def vectors(self, tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(len(tokens), dim) unit vectors (zero rows for words without one) and a bool mask of those with one."""
        index = self.kv.key_to_index
        rows = np.fromiter((index.get(t, -1) for t in tokens), dtype=np.int64, count=len(tokens))
        known = rows >= 0
        out = np.zeros((len(tokens), self.dim), np.float32)
        out[known] = self.unit[rows[known]]
        return out, known

    def __contains__(self, token: str) -> bool:
        return token in self.kv.key_to_index
