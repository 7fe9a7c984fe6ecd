"""Papers as esqbe sees them: an id, a title, and sentences each carrying a facet label.

Every input format is turned into `Paper` by `esqbe.readers`; everything downstream (encoder,
backends, query pipeline) only ever sees this shape.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

#: facets a user can query by (CSFCube's three; `objective` is folded into `background`)
QUERY_FACETS = ("background", "method", "result")
#: every label a stored sentence can carry
FACET_LABELS = ("background", "method", "result", "other", "unlabeled")
#: the five raw labels of CSAbstruct / the CSFCube tagger
RAW_LABELS = ("background", "objective", "method", "result", "other")

_LABEL_ALIASES = {
    "background": "background",
    "objective": "background",
    "method": "method",
    "methods": "method",
    "result": "result",
    "results": "result",
    "other": "other",
    "unlabeled": "unlabeled",
    "unlabelled": "unlabeled",
    "none": "unlabeled",
}


def normalize_label(label: str | None, raw: bool = False) -> str:
    """Map a label as it arrives (`background_label`, `Objective`, `methods`) to an esqbe facet.

    With `raw=True` `objective` stays apart from `background` (the five CSAbstruct labels).
    Raises ValueError for a label we do not know, so bad input is reported, not guessed.
    """
    if label is None:
        return "unlabeled"
    key = str(label).strip().lower()
    if key.endswith("_label"):
        key = key[: -len("_label")]
    if raw and key == "objective":
        return "objective"
    try:
        return _LABEL_ALIASES[key]
    except KeyError:
        raise ValueError(f"unknown facet label {label!r} (expected one of {', '.join(RAW_LABELS)})") from None


def split_sentences(text: str) -> list[str]:
    """Split an abstract into sentences with blingfire's shipped model (fast, no download)."""
    import blingfire

    text = " ".join(str(text).split())
    if not text:
        return []
    return [s.strip() for s in blingfire.text_to_sentences(text).split("\n") if s.strip()]


#: metadata keys esqbe writes for itself (not part of a paper's content hash); facet_probs: the
#: tagger's soft labels, written beside its predicted labels (which do count)
INTERNAL_METADATA_KEYS = frozenset({"facets_predicted", "facet_probs"})


@dataclass
class Paper:
    """One paper: `facets[i]` is the facet label of `sentences[i]` (`unlabeled` when unknown)."""

    paper_id: str
    title: str
    sentences: list[str]
    facets: list[str] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        self.paper_id = str(self.paper_id)
        self.title = self.title or ""
        if not self.facets:
            self.facets = ["unlabeled"] * len(self.sentences)
        if len(self.facets) != len(self.sentences):
            raise ValueError(
                f"paper {self.paper_id}: {len(self.sentences)} sentences but {len(self.facets)} facet labels"
            )

    @property
    def abstract(self) -> str:
        return " ".join(self.sentences)

    @property
    def is_labeled(self) -> bool:
        return any(f != "unlabeled" for f in self.facets)

    def facet_indices(self, facet: str) -> list[int]:
        """Indices of the sentences labelled `facet` (`objective` counts as `background`)."""
        facet = normalize_label(facet)
        return [i for i, f in enumerate(self.facets) if f == facet]

    def content_hash(self) -> str:
        """Hash of what the index stores for this paper: equal hash means an upsert changes nothing.

        Metadata counts (a corrected year or venue is written on the next run), except esqbe's own
        bookkeeping keys (INTERNAL_METADATA_KEYS)."""
        meta = {k: v for k, v in self.metadata.items() if k not in INTERNAL_METADATA_KEYS}
        payload = json.dumps([self.title, self.sentences, self.facets] + ([meta] if meta else []), ensure_ascii=False,
                             sort_keys=True, default=str)
        return hashlib.sha1(payload.encode("utf-8")).hexdigest()

    def to_dict(self) -> dict:
        return {
            "paper_id": self.paper_id,
            "title": self.title,
            "sentences": list(self.sentences),
            "facets": list(self.facets),
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Paper":
        return cls(d["paper_id"], d.get("title", ""), list(d["sentences"]), list(d.get("facets") or []), dict(d.get("metadata") or {}))
