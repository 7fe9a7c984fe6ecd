"""Live: watches on a real Elasticsearch / OpenSearch. The cluster of tests/test_engine_integration.py
(ESQBE_ES_URL / ESQBE_OS_URL, or the docker compose files; skipped with the reason otherwise) holds the same papers as
an embedded index; a watch made on each, then ten more papers indexed into both: the engine's run reports what the
embedded run reports (the same papers, the same similarities), the engine enforces the conditional write the watch
store relies on (a stale `if_seq_no` is refused), and the companion index is removed at the end."""
from __future__ import annotations

import itertools
import json

import pytest

from .test_engine_integration import SAMPLE, cluster, indexed  # noqa: F401  (the fixtures)

pytestmark = pytest.mark.integration


def test_a_watch_on_the_engine_reports_what_the_embedded_watch_reports(indexed, tmp_path):  # noqa: F811
    from esqbe.index.watches import add_watch, get_watch, list_watches, remove_watch, revoke_feed_key, run_watches

    embedded, engine, subset = indexed
    first = json.loads(subset.read_text().splitlines()[0])["paper_id"]
    backend = engine.backend
    try:
        for index in (embedded, engine):
            add_watch(index, "live", paper_id=first, facet="method", min_sim=0.0, k=30)
        assert [w.name for w in list_watches(engine)] == ["live"]
        more = tmp_path / "more.jsonl"
        with open(SAMPLE, encoding="utf-8") as src:
            more.write_text("".join(itertools.islice(src, 60, 70)), encoding="utf-8")
        for index in (embedded, engine):
            assert index.index_files([str(more)]).indexed == 10
        want = run_watches(embedded)[0]
        got = run_watches(engine)[0]
        assert got.new_papers == want.new_papers == 10 and got.advanced
        assert [m["paper_id"] for m in got.matches] == [m["paper_id"] for m in want.matches]
        assert [m["similarity"] for m in got.matches] == pytest.approx([m["similarity"] for m in want.matches], abs=1e-4)
        assert run_watches(engine)[0].matches == []  # the mark moved on

        # the conditional write the store relies on: the engine refuses a write with a stale sequence number
        doc = backend.client.get(index=backend.watch_index, id="live")
        revoke_feed_key(engine, "live")
        with pytest.raises(Exception) as refused:
            backend.client.index(index=backend.watch_index, id="live", body=doc["_source"],
                                 if_seq_no=doc["_seq_no"], if_primary_term=doc["_primary_term"])
        assert backend._status(refused.value) == 409
        assert get_watch(engine, "live").feed_key != doc["_source"]["feed_key"]
        remove_watch(engine, "live")
        assert list_watches(engine) == []
    finally:
        try:
            backend.client.indices.delete(index=backend.watch_index)
        except Exception:  # noqa: BLE001  # never made (a failure before the first watch)
            pass
