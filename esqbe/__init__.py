"""esqbe: faceted query-by-example search for scientific papers.

    import esqbe
    index = esqbe.open_index("esqbe-index")
    index.index_files(["papers.jsonl"])
    for hit in index.query(paper_id="1791179", facet="method").hits:
        print(hit.rank, hit.paper_id, hit.title)
"""

__version__ = "0.1.0"


def __getattr__(name):
    # the API imports torch-free modules only, but keep `import esqbe` instant for the CLI's --help
    if name in ("open_index", "encoder_only", "Index"):
        from .index import api

        return getattr(api, name)
    if name == "open_backend":
        from .index import open

        return open.open_backend
    if name in ("IndexReport", "EncodeReport"):
        from .index import reports

        return getattr(reports, name)
    raise AttributeError(name)
