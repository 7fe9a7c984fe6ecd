"""The one small interface every backend (embedded, elasticsearch, opensearch) implements.

The model follows the engines' nested layout: a document per paper, holding per-sentence
objects (index, facet label, text, vector). The core pipeline talks only to `Backend`; nothing
engine-specific crosses this line.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..domain import Candidate, FirstStageRequest, IndexedPaper, IndexMeta, Paper, UpsertResult
from ..errors import BackendError


class WriteLockBusy(BackendError):
    """Another handle kept the index's write lock past the time a writer was willing to wait; `holder`
    is what the lock file says of it (a pid), or "?"."""

    def __init__(self, message: str, holder: str = "?"):
        super().__init__(message)
        self.holder = holder


@dataclass
class WindowScores:
    """What `Backend.score_windows` answers for each part of a query: for the papers it scored, esqbe's summax
    against the part's vectors over their sentences of the facet (NaN: the paper has no sentence of it), and every
    paper it found, without vectors and with at least its sentences' labels and the tagger's soft labels
    (`metadata["facet_probs"]`; a backend may leave the text out: the caller fetches the hits it shows). A paper found
    but absent from `scores` was not scored there (e.g. written before the index carried what the scoring reads): the
    caller scores it."""

    scores: dict[str, float] = field(default_factory=dict)
    papers: dict[str, Paper] = field(default_factory=dict)


@dataclass
class WindowAnswer:
    """What `Backend.score_windows` answers: each part's `WindowScores` (in order), and the candidates of each first
    stage it was asked to run beside them (`lookups`, in order: the query's BM25 look-ups, in the same request)."""

    parts: list[WindowScores]
    lookups: list[list[Candidate]]


class Backend(ABC):
    """Storage + first-stage retrieval for one index."""

    name: str = "backend"
    #: whether BM25 can score a paper's sentences of one facet (`FirstStageRequest.bm25_facet`);
    #: without it, `bm25_text: facet` scores title + abstract
    facet_text: bool = False

    @abstractmethod
    def meta(self) -> IndexMeta | None:
        """What the index was built with, or None if the index does not exist yet."""

    @abstractmethod
    def ensure(self, meta: IndexMeta) -> None:
        """Create the index for `meta` if absent; raise ModelMismatchError if it exists with another."""

    @abstractmethod
    def content_hashes(self, paper_ids: Iterable[str]) -> dict[str, str]:
        """Stored `Paper.content_hash()` of those ids that exist (lets re-runs skip unchanged papers before encoding)."""

    @abstractmethod
    def upsert(self, papers: Sequence[IndexedPaper]) -> UpsertResult:
        """Insert or replace papers by id, durably (a crash after return loses nothing)."""

    @abstractmethod
    def delete(self, paper_ids: Iterable[str]) -> int:
        """Delete papers by id; returns how many existed."""

    @abstractmethod
    def get(self, paper_ids: Sequence[str]) -> dict[str, IndexedPaper]:
        """Fetch stored papers with their sentence vectors (missing ids are absent from the result)."""

    @abstractmethod
    def first_stage(self, request: FirstStageRequest) -> list[Candidate]:
        """BM25 + facet-filtered sentence kNN, fused; best first, at most `request.k`."""

    @abstractmethod
    def stats(self) -> dict:
        """Counts for humans and scripts: papers, sentences, per-facet sentences, model, backend details."""

    def search_text(self, text: str, k: int = 10) -> list[tuple[str, float]]:
        """Papers whose title/abstract match the words best (BM25): (paper id, score), best first.

        Every backend has this through its first stage (BM25 alone, no vectors); a backend may
        override it with something cheaper."""
        meta = self.meta()
        if meta is None or not text.strip() or k <= 0:
            return []
        request = FirstStageRequest(text=text, vectors=np.zeros((0, meta.dim), dtype=np.float32), k=k, knn_k=0,
                                    bm25_k=k, fusion="bm25", with_papers=False)
        return [(c.paper_id, c.bm25) for c in self.first_stage(request) if c.bm25 > 0]

    def ids_where(self, path: str, test) -> list[str]:
        """Ids of the papers with a text value at metadata `path` (or under it) whose folded form (case and accents
        ignored: `esqbe.core.filters.fold`) passes `test`: `esqbe search` by author or identifier. [] where the
        backend cannot tell cheaply (the engines: their search finds words)."""
        return []

    def check_filter(self, flt) -> None:  # noqa: B027 (optional: a backend that cannot tell keeps this)
        """Raise FilterError when a filter cannot match as written (a key no paper has, a value no paper has
        for its key), where the backend can tell cheaply; the embedded backend does (esqbe.core.filter_check)."""

    #: whether the backend keeps a table of the identifiers (DOI, arXiv, PubMed) and merged-away ids naming each paper;
    #: without one, records of one work are merged within an index run only (esqbe.index.merge)
    keeps_aliases = False

    def work_aliases(self, keys: Iterable[str]) -> dict[str, str]:
        """The paper each key names (`doi:...`, `arxiv:...`, `pubmed:...`, `id:<a merged-away id>`), where known."""
        return {}

    def add_aliases(self, aliases: dict[str, str]) -> None:  # noqa: B027 (optional: see keeps_aliases)
        """Remember that each key (`id:<merged-away id>`) names that paper."""

    def update_sources(self, sources: dict[str, list[dict]]) -> int:
        """Set the `sources` of stored papers (paper id -> [{"file", "format"}], esqbe.index.merge) whose content is
        unchanged, so nothing is encoded again; the rest of their metadata stays. Returns how many changed.
        Optional: a backend that cannot keeps the sources it stored with the paper."""
        return 0

    def window_scoring(self) -> tuple[bool, str]:
        """Whether `score_windows` computes summax where the index lives, and in words how (or why not)."""
        return False, f"the {self.name} backend keeps no scoring of its own: summax runs in Python"

    def score_windows(self, paper_ids: Sequence[str], parts: Sequence[tuple[np.ndarray, str | None]],
                      lookups: Sequence[FirstStageRequest] = ()) -> WindowAnswer | None:
        """For each part of a query (its unit vectors, the candidates' facet it is matched with; None: every
        sentence), summax (the mean over the part's vectors of the best cosine to a paper's sentences of that facet)
        of the given papers, computed where the index lives, with no vector shipped back; the papers come back
        without vectors (`WindowScores`, one per part, in order). With them, in the same request, the `lookups`
        (first stages, answered as `first_stage` answers them): a query's window costs one round trip. None where
        this backend cannot (see `window_scoring`): the caller rescores in Python and runs the look-ups itself.
        Optional (the engines' MaxSim over per-facet multi-vector fields)."""
        return None

    def paper_count(self) -> int:
        """How many papers the index holds (a backend may answer cheaper than `stats`)."""
        return int(self.stats().get("papers", 0))

    #: whether `write_note` keeps a note with the index (else the caller's process keeps it, if anything)
    keeps_notes = False

    def read_note(self, name: str) -> dict | None:
        """A small JSON note esqbe keeps with the index (e.g. the similarity scale, esqbe.index.scale), or None. The
        engines keep none (the caller keeps it in its process)."""
        return None

    def write_note(self, name: str, value: dict) -> None:  # noqa: B027 (optional: see read_note)
        """Keep `value` as the note `name` with the index, without the write lock (a reader may write it); OSError
        where the index cannot be written."""

    def paper_ids(self) -> list[str]:
        """Every paper id in the index (for whole-index jobs such as `esqbe train-words --index-path`)."""
        raise BackendError(f"the {self.name} backend cannot list its papers")

    def sample_papers(self, n: int, seed: int = 0) -> tuple[list[str], int]:
        """Up to `n` paper ids drawn at random (the same ones for the same seed and papers), and how many
        papers the index holds: corpus statistics estimated from a sample (esqbe.query.centering)."""
        import random

        ids = sorted(self.paper_ids())
        return (sorted(random.Random(seed).sample(ids, n)) if len(ids) > n else ids), len(ids)

    def exact_knn(self, vectors: np.ndarray, k: int, *, facet: str | None = None,
                  exclude: frozenset[str] = frozenset()) -> dict[str, float]:
        """The first stage's kNN computed exactly (every sentence of `facet` compared): per query sentence the k
        papers with the best sentence, paper id -> mean over query sentences of that best cosine (0 where a
        query sentence did not reach the paper among its k). The reference `esqbe check recall` measures against."""
        raise BackendError(f"the {self.name} backend cannot search exactly")

    def calibrate_knn(self, target: float, statistic: str = "mean", *, force: bool = False,
                      progress: Callable[[str], None] | None = None) -> dict | None:
        """Calibrate the approximate kNN for recall@100 >= `target` (by `statistic`) where it is due or `force`d (the
        engines: num_candidates; the embedded index: each IVF's nprobe, as it also does when it builds one), telling
        `progress` what it calibrates (minutes at a million papers). Returns what was stored; None: nothing done."""
        return None

    def knn_setting(self, facet: str) -> str:
        """What decides the kNN's recall for queries of `facet`, in words (e.g. `ivf nprobe 16 (calibrated)`)."""
        return ""

    def token_counts(self) -> tuple[dict[str, int], int] | None:
        """Corpus token frequencies kept up to date on upsert/delete: (token -> count, total tokens),
        or None when the backend keeps none (rescorers then estimate from the candidates)."""
        return None

    def close(self) -> None:  # noqa: B027 (optional: a backend with nothing to release keeps this)
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
