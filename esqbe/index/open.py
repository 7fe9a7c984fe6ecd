"""Opening a backend by the settings (embedded, created on its first write; or an engine), and the API's
`filters`/`engine_filter` arguments made into one MetadataFilter. `esqbe.index.api.open_index` wraps a backend
in an `Index`."""
from __future__ import annotations

import os
import sqlite3
from typing import Any, cast

from ..backends.base import Backend
from ..core.filters import FilterError, MetadataFilter, coerce_filters
from ..errors import BackendError, StorageError
from ..settings.config import Settings
from .reports import _reason


def open_backend(settings: Settings, *, create: bool = True) -> Backend:
    """The backend named in the settings (engine clients are imported only when asked for)."""
    if settings.backend == "embedded":
        from ..backends.embedded.backend import EmbeddedBackend

        def make(create: bool):
            try:
                return EmbeddedBackend(settings.path, create=create, exact_threshold=settings.exact_threshold,
                                       nprobe=settings.nprobe, recall_target=settings.knn_recall_target,
                                       recall_statistic=settings.knn_recall_statistic,
                                       write_lock_wait=settings.write_lock_wait)
            except (sqlite3.Error, OSError) as e:
                raise StorageError(f"cannot open the index at {settings.path}: {_reason(e, settings.path)}") from e

        if create and not os.path.exists(settings.path):
            # created by the first write, not by a run that fails first (a stand-in with the Backend's reads)
            return cast(Backend, _DeferredBackend(lambda: make(True)))
        return make(create)
    if settings.backend in ("elasticsearch", "opensearch"):
        if not settings.url:
            raise BackendError(f"the {settings.backend} backend needs --url (or ESQBE_URL, or `url:` in the config file)")
        kwargs: dict[str, Any] = dict(api_key=settings.api_key, username=settings.username, password=settings.password,
                      ca_certs=settings.ca_certs, verify_certs=settings.verify_certs)
        from ..backends.engines.attach import (
            maybe_attached,  # an index the user owns, with esqbe attached to it
        )

        if settings.backend == "elasticsearch":
            from ..backends.engines.elasticsearch import ElasticsearchBackend

            backend: Any = ElasticsearchBackend(settings.url, settings.index, **kwargs)
        else:
            from ..backends.engines.opensearch import OpenSearchBackend

            backend = OpenSearchBackend(settings.url, settings.index, **kwargs)
        backend.facet_vectors = bool(settings.engine_facet_vectors)  # per-facet multi-vector fields
        return maybe_attached(backend)
    raise BackendError(f"unknown backend {settings.backend!r}; choose embedded, elasticsearch or opensearch")


class _DeferredBackend:
    """A backend that does not exist yet: reads see an empty index; the first write creates it."""

    def __init__(self, factory):
        self._factory = factory
        self._real = None

    def meta(self):
        return self._real.meta() if self._real is not None else None

    def content_hashes(self, paper_ids):
        return self._real.content_hashes(paper_ids) if self._real is not None else {}

    def get(self, paper_ids):
        return self._real.get(paper_ids) if self._real is not None else {}

    def close(self):
        if self._real is not None:
            self._real.close()

    def __getattr__(self, name):
        if self._real is None:
            self._real = self._factory()
        return getattr(self._real, name)


def make_filter(filters=None, engine_filter: dict | str | None = None, settings: Settings | None = None
                ) -> MetadataFilter | None:
    """The API's `filters` / `engine_filter` arguments as one MetadataFilter (None when both are empty), each value
    list within the settings' filter_max_values and filter_max_bytes (when given; else the ceilings); a FilterError
    (a ValueError) names what is wrong."""
    import json

    bounds = {"max_values": settings.filter_max_values, "max_bytes": settings.filter_max_bytes} if settings else {}
    conditions = coerce_filters(filters, **bounds)
    if isinstance(engine_filter, str):
        try:
            engine_filter = json.loads(engine_filter)
        except json.JSONDecodeError as e:
            raise FilterError(f"engine filter is not JSON: {e.msg} at column {e.colno}") from None
    if engine_filter is not None and (not isinstance(engine_filter, dict) or len(engine_filter) != 1):
        raise FilterError(f"engine filter must be one query DSL clause, a JSON object with one key such as "
                          f'{{"term": {{"lang": "en"}}}}, got {engine_filter!r}')
    flt = MetadataFilter(conditions, engine_filter)
    return flt if flt else None
