"""`esqbe attach`, the whole run: esqbe's fields added to an index the user already has, then filled by the
normal indexing loop. The backend side (mapping bodies, the scroll, partial updates, queries over the
attached fields) is esqbe.backends.engines.attach; this module is the orchestration above it and the Index."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..backends.engines.attach import AttachedMixin, attached_backend
from ..backends.engines.common import EngineBackend
from ..errors import BackendError
from .api import IndexReport


@dataclass
class AttachReport:
    documents: int = 0
    indexed: int = 0
    replaced: int = 0
    unchanged: int = 0
    skipped: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)
    tagged: int = 0
    mapping_update: dict | None = None
    reindex: dict | None = None
    index: str = ""
    seconds: float = 0.0

    def summary(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "mapping_update"}


def run_attach(index, id_field: str, text_fields: Sequence[str], *, facets: str | None = None,
               reindex_to: str | None = None, progress: bool = False) -> AttachReport:
    """Attach esqbe to the user's index behind `index` (an esqbe.index.api.Index on an engine backend)."""
    start = time.perf_counter()
    if not text_fields:
        raise BackendError("--text-fields needs at least one field (title first, then the abstract/body fields)")
    engine = index.backend
    if not isinstance(engine, EngineBackend):
        raise BackendError("esqbe attach works on an elasticsearch or opensearch index (--backend, --url, --index)")
    backend = attached_backend(engine) if not isinstance(engine, AttachedMixin) else engine
    index.backend = backend
    encoder = index.encoder
    meta = index._requested_meta(encoder)  # name, dim, mode and the model's fingerprint
    report = AttachReport()
    if reindex_to:
        report.reindex = backend.reindex_into(reindex_to, meta, id_field, text_fields)
    else:
        report.mapping_update = backend.attach(meta, id_field, text_fields)
    report.index = backend.index
    skipped: dict[str, int] = {}
    source_hashes: dict[str, str] = {}
    backend.set_source_hashes(source_hashes)  # filled below as the scroll goes; read when each batch is written

    def papers():
        for doc_id, paper, h in backend.scan(id_field, text_fields):
            report.documents += 1
            if paper is None:
                if h == "unchanged":
                    report.unchanged += 1
                else:
                    skipped[h] = skipped.get(h, 0) + 1
                continue
            source_hashes[doc_id] = h
            yield paper

    inner = IndexReport()
    index.add_papers(papers(), facets=facets, report=inner, progress=progress)
    report.indexed, report.replaced = inner.indexed, inner.replaced
    report.unchanged += inner.unchanged
    report.errors, report.tagged, report.skipped = list(inner.errors), inner.tagged, skipped
    report.seconds = time.perf_counter() - start
    return report
