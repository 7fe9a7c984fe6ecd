"""Papers as engine documents and back. Vectors for the rescorers come from `vectors_b64` (float32
little-endian, base64, one row per sentence, in `idx` order) in `_source`, never from the indexed vector
fields: ES 9.2+ leaves those out of `_source` by default and older versions cannot be asked to put them back,
while a `binary` field is returned as is by every version, bit for bit."""
from __future__ import annotations

import base64
from typing import Any

import numpy as np

from ...domain import IndexedPaper, Paper, normalize_label
from ...errors import BackendError
from .filters import filter_fields
from .mapping import FACET_PATHS


def encode_vectors(vectors: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(vectors, dtype="<f4").tobytes()).decode("ascii")


def decode_vectors(data: str, n: int, dim: int) -> np.ndarray:
    flat = np.frombuffer(base64.b64decode(data), dtype="<f4")
    if flat.size != n * dim:
        raise BackendError(f"stored vectors hold {flat.size} floats, expected {n} x {dim}")
    return flat.reshape(n, dim).astype(np.float32)


def paper_to_doc(ip: IndexedPaper) -> dict:
    """The engine document of one paper (`_id` = paper id)."""
    paper = ip.paper
    doc: dict[str, Any] = {
        "paper_id": paper.paper_id,
        "title": paper.title,
        "abstract": paper.abstract,
        "content_hash": paper.content_hash(),
        "n_sentences": len(paper.sentences),
        "vectors_b64": encode_vectors(ip.vectors),
        "metadata": dict(paper.metadata),
        **filter_fields(paper.metadata),  # meta_kw / meta_num: what metadata filters search
    }
    for i, (text, label) in enumerate(zip(paper.sentences, paper.facets)):
        facet = normalize_label(label)
        doc.setdefault(FACET_PATHS[facet], []).append(
            {"idx": i, "facet": facet, "text": text, "vector": [float(x) for x in ip.vectors[i]]}
        )
    return doc


def _merge_vectors(source: dict, stored: dict) -> None:
    """Put the indexed vectors of `stored` (nested `idx` + `vector`) into `source`'s sentence rows."""
    for path in FACET_PATHS.values():
        by_idx = {int(r["idx"]): r["vector"] for r in stored.get(path) or () if "idx" in r and r.get("vector") is not None}
        for row in source.get(path) or ():
            if int(row.get("idx", -1)) in by_idx:
                row["vector"] = by_idx[int(row["idx"])]


def _sentence_rows(source: dict) -> list[dict]:
    return sorted((s for path in FACET_PATHS.values() for s in source.get(path) or ()), key=lambda s: int(s["idx"]))


def doc_to_text(source: dict) -> Paper:
    """The paper of a stored `_source` without its vectors: title, sentences, labels, metadata."""
    rows = _sentence_rows(source)
    return Paper(
        source["paper_id"],
        source.get("title") or "",
        [s.get("text") or "" for s in rows],
        [s.get("facet") or "unlabeled" for s in rows],
        dict(source.get("metadata") or {}),
    )


def doc_to_paper(source: dict, dim: int) -> IndexedPaper:
    """An IndexedPaper back from a stored `_source` (nested vectors may be absent: ES 9.2+ or source filtering)."""
    rows = _sentence_rows(source)
    paper = doc_to_text(source)
    n = len(rows)
    if source.get("vectors_b64") is not None:
        vectors = decode_vectors(source["vectors_b64"], n, dim)
    elif all("vector" in s for s in rows):  # written by another tool: fall back to the indexed vectors
        vectors = np.asarray([s["vector"] for s in rows], dtype=np.float32).reshape(n, dim)
    else:
        raise BackendError(f"paper {paper.paper_id}: stored document has no vectors_b64 and no sentence vectors")
    return IndexedPaper(paper, vectors)
