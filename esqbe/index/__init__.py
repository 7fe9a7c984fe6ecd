"""The Index facade: open a backend, ingest, query, cite (what the skins and scripts call)."""
