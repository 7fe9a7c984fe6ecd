"""Sentence splitting of abstracts (blingfire's shipped model: fast, no download)."""
from __future__ import annotations


def split_sentences(text: str) -> list[str]:
    """Split an abstract into sentences with blingfire's shipped model (fast, no download)."""
    import blingfire

    text = " ".join(str(text).split())
    if not text:
        return []
    return [s.strip() for s in blingfire.text_to_sentences(text).split("\n") if s.strip()]
