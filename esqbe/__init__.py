"""esqbe: faceted query-by-example search for scientific papers."""

__version__ = "0.1.0"
