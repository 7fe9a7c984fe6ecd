"""Layer 0 helpers every stage may import: the metadata filter language, score fusion, progress."""
