"""Where a hit's score stands (the score the hits are ordered by; esqbe.index.scale), on real small indexes with the real model:

- a hit's band and percentile follow the index's own matches, and the same similarity is strong in one index and
  fair or weak in another whose matches are generally higher (the same papers, each with a near twin);
- the scale is stored with the index, read back by a fresh process's query, and measured again once the index has
  grown by more than a fifth;
- an index of fewer than 20 papers gets the shipped fixed scale and says so; a rescorer it has no cuts for, no band;
- the JSON (`--json`, POST /query) carries each hit's percentile and band and the scale they are on."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from esqbe.index import scale as scale_mod


def _records(sample_lines, n, start=0):
    return [json.loads(line) for line in sample_lines[start:start + n]]


def _twin(record: dict, which: int) -> dict:
    """The same abstract under another id, its last (`which` 1) or first (2) sentence left out: a near duplicate (the
    sentences keep their labels)."""
    n = len(record["sentences"])
    cut = slice(0, n - 1) if which == 1 else slice(1, n)
    out = {k: v[cut] if isinstance(v, list) and len(v) == n else v for k, v in record.items()}
    out["paper_id"] = f"{record['paper_id']}-twin{which}"
    return out


@pytest.fixture(scope="module")
def indexes(tmp_path_factory, encoder, sample_lines, index_dir_30):
    """`plain`: 30 sample abstracts (a copy of index_dir_30); `twins`: the first 10 of them, each with two near twins,
    so that nearly every facet query's two best hits are its twins (matches generally higher)."""
    import esqbe

    root = tmp_path_factory.mktemp("scale")
    shutil.copytree(index_dir_30, root / "plain")
    records = _records(sample_lines, 10)
    assert all("labels" in r and "paper_id" in r for r in records)
    src = root / "twins.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records + [_twin(r, w) for r in records for w in (1, 2)]))
    with esqbe.open_index(str(root / "twins"), encoder=encoder, config=None) as index:
        assert index.index_files([str(src)]).indexed == 30
    opened = {name: esqbe.open_index(str(root / name), encoder=encoder, config=None, create=False)
              for name in ("plain", "twins")}
    yield opened
    for index in opened.values():
        index.close()


def test_hits_are_placed_on_the_index_s_own_matches(indexes):
    index = indexes["plain"]
    pid = index.backend.paper_ids()[0]
    result = index.query(pid, facet="method", k=29)
    scale = result.scale
    assert scale["source"] == "index" and scale["rescorer"] == "summax" and not scale["measuring"]
    assert scale["papers"] == 30 and scale["queries"] >= 30 and scale["matches"] >= 10 * scale["queries"] - 50
    assert "this index's own matches" in scale["description"]
    p = {int(k): v for k, v in scale["percentiles"].items()}
    assert p[5] <= p[25] <= p[50] <= p[75] <= p[95]
    sims = [h.score for h in result.hits]  # what is placed: the score the hits are ordered by
    assert {h.band for h in result.hits} >= {"strong", "weak"}  # 29 hits of 29 papers: both ends of the scale
    for h in result.hits:
        assert h.band == ("strong" if h.percentile >= 75 else "weak" if h.percentile < 25 else "fair")
        assert (h.score >= p[75]) == (h.band == "strong") or abs(h.score - p[75]) < 1e-3
        assert (h.score < p[25]) == (h.band == "weak") or abs(h.score - p[25]) < 1e-3
    order = np.argsort(sims)  # a higher score never stands lower
    assert all(np.diff([result.hits[i].percentile for i in order]) >= 0)
    d = result.to_dict()
    assert d["scale"] == scale
    assert [(h["percentile"], h["band"]) for h in d["hits"]] == [(h.percentile, h.band) for h in result.hits]


def test_the_same_similarity_stands_where_each_index_s_matches_put_it(indexes):
    plain, twins = indexes["plain"].similarity_scale(), indexes["twins"].similarity_scale()
    assert plain.source == twins.source == "index"
    assert np.percentile(twins.quantiles, 50) > np.percentile(plain.quantiles, 50)  # twins' matches are higher
    s = plain.quantiles[80]  # strong in the plain index ...
    pct_plain, band_plain = plain.place(s)
    pct_twins, band_twins = twins.place(s)
    assert band_plain == "strong" and pct_plain == pytest.approx(80, abs=1)
    assert band_twins in ("fair", "weak") and pct_twins < pct_plain - 10  # ... not in the one whose matches are higher
    # and a real query of the twins' index places its hits on its own scale: the twin is its best, strong, hit (a
    # near duplicate: the paper's likely version, listed after the numbered hits)
    pid = indexes["twins"].backend.paper_ids()[0]
    result = indexes["twins"].query(pid, facet="method", k=5)
    best = max(result.hits, key=lambda h: h.score)
    assert best.paper_id.split("-twin")[0] == pid.split("-twin")[0] and best.likely_version_of == pid
    assert best.band == "strong" and best.percentile == twins.place(best.score)[0]


def test_the_scale_is_stored_with_the_index_and_measured_again_when_it_grows(indexes, tmp_path, encoder, sample_lines):
    import esqbe

    path = tmp_path / "grow"
    shutil.copytree(indexes["plain"].settings.path, path)
    note = path / "similarity_scale.json"
    assert note.exists()  # measured by the tests above, stored in the directory (and copied with it)
    stored = json.loads(note.read_text())
    (key, entry), = [(k, v) for k, v in stored.items() if "|summax|" in k]
    assert entry["papers"] == 30 and len(entry["quantiles"]) == 101
    # read back, not measured again: a note whose numbers are plainly not measured is used as it is
    entry["quantiles"] = [i / 100 for i in range(101)]
    note.write_text(json.dumps({key: entry}))
    with esqbe.open_index(str(path), encoder=encoder, config=None, create=False) as index:
        scale = index.similarity_scale()
        assert scale.quantiles[50] == 0.5 and scale.place(0.9) == (90.0, "strong") and scale.place(0.1)[1] == "weak"
        # grown by more than a fifth (30 -> 40 papers): the next query measures it again, on the 40
        src = tmp_path / "more.jsonl"
        src.write_text("\n".join(sample_lines[30:40]) + "\n")
        assert index.index_files([str(src)]).indexed == 10
        result = index.query(index.backend.paper_ids()[0], facet="method", k=5)
        assert result.scale["papers"] == 40 and result.scale["percentiles"]["50"] != 0.5
    again = json.loads(note.read_text())[key]
    assert again["papers"] == 40 and again["quantiles"] != entry["quantiles"]


def test_a_small_index_gets_the_fixed_scale_and_says_so(tmp_path, encoder, sample_lines):
    import esqbe

    src = tmp_path / "few.jsonl"
    src.write_text("\n".join(sample_lines[:12]) + "\n")
    with esqbe.open_index(str(tmp_path / "few"), encoder=encoder, config=None) as index:
        assert index.index_files([str(src)]).indexed == 12
        pid = index.backend.paper_ids()[0]
        result = index.query(pid, facet="method", k=11)
        scale = result.scale
        assert scale["source"] == "fixed" and scale["percentiles"] is None
        assert "12 papers, fewer than the 20" in scale["description"] and "fixed scale" in scale["description"]
        assert scale["cuts"] == {"fair": 0.3, "strong": 0.4}
        for h in result.hits:
            assert h.percentile is None
            assert h.band == ("strong" if h.score >= 0.4 else "fair" if h.score >= 0.3 else "weak")
        other = index.query(pid, facet="method", k=3, rescorer="ot")  # on a scale of its own: no cuts, no band
        assert other.scale["source"] == "none" and all(h.band is None for h in other.hits)
        assert not (tmp_path / "few" / "similarity_scale.json").exists()  # nothing measured


def test_a_measuring_server_places_hits_on_what_it_has_and_says_so(indexes):
    """The server's readers never measure (Index.scale_waits False): a rescorer whose scale is not measured yet is
    placed on the fixed scale (or none) marked `measuring`, while a thread of its own measures it; then the index's."""
    import time

    index = indexes["plain"]
    index.scale_waits = False
    try:
        pid = index.backend.paper_ids()[0]
        first = index.query(pid, facet="method", k=5, rescorer="ts")  # no test of this index measured ts before
        assert first.scale["measuring"] and first.scale["source"] == "fixed"
        assert "being measured" in first.scale["description"]
        assert all(h.band is not None and h.percentile is None for h in first.hits)  # placed on the fixed scale
        deadline = time.monotonic() + 120
        while scale_mod.measuring(index._scale_where()):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        later = index.query(pid, facet="method", k=5, rescorer="ts")
        assert later.scale["source"] == "index" and not later.scale["measuring"] and later.scale["rescorer"] == "ts"
    finally:
        index.scale_waits = True


def test_a_query_under_a_deadline_does_not_wait_for_a_measurement(indexes):
    """The Python API measures on the querying thread, but not under a deadline: the query is answered on what is
    known (asym: no fixed cuts, so no band), marked `measuring`, and the scale is measured on a thread of its own."""
    import time

    from esqbe.core.deadline import Deadline

    index = indexes["plain"]
    pid = index.backend.paper_ids()[1]
    with Deadline(120):
        first = index.query(pid, facet="method", k=5, rescorer="asym")
    assert first.scale["source"] == "none" and first.scale["measuring"] and all(h.band is None for h in first.hits)
    deadline = time.monotonic() + 120
    while scale_mod.measuring(index._scale_where()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    later = index.query(pid, facet="method", k=5, rescorer="asym")
    assert later.scale["source"] == "index" and later.scale["rescorer"] == "asym"
    assert all(h.band in ("strong", "fair", "weak") for h in later.hits)
    note = json.loads((index.backend.path / "similarity_scale.json").read_text())
    assert any("|asym|" in key for key in note)


def test_a_measurement_past_its_budget_leaves_the_fixed_scale_and_is_remembered(indexes, tmp_path, encoder):
    """Out of time before `MIN_QUERIES` queries: the fixed scale, saying why, stored for the index's paper count, so
    that the next process's query does not spend the budget again."""
    import esqbe

    path = tmp_path / "slow"
    shutil.copytree(indexes["plain"].settings.path, path)
    (path / "similarity_scale.json").unlink()
    with esqbe.open_index(str(path), encoder=encoder, config=None, create=False) as index:
        settings = index.settings.replace(rescorer="ts")
        key = scale_mod.scale_key(settings, index.backend.meta().fingerprint)
        scale = scale_mod.measure(index.backend, settings, budget_s=0.0, key=key)
        assert scale.source == "fixed" and "took longer than 0 s" in scale.description
        scale_mod._store(index.backend, scale)
    scale_mod._known.clear()  # as a new process
    with esqbe.open_index(str(path), encoder=encoder, config=None, create=False) as index:
        result = index.query(index.backend.paper_ids()[0], facet="method", k=5, rescorer="ts")
        assert result.scale["source"] == "fixed" and "took longer than 0 s" in result.scale["description"]
        assert all(h.percentile is None and h.band for h in result.hits)


def test_esqbe_query_prints_each_hit_s_band_and_percentile(indexes):
    """`esqbe query`'s text names the scale once and each hit's band and percentile beside it, as --json has them."""
    import re

    from click.testing import CliRunner

    from cli import main

    path, pid = indexes["plain"].settings.path, indexes["plain"].backend.paper_ids()[2]
    args = ["query", "--path", str(path), "--paper", pid, "--facet", "method", "-k", "8", "--no-server"]
    text = CliRunner().invoke(main, args)
    data = CliRunner().invoke(main, [*args, "--json"])
    assert text.exit_code == 0 and data.exit_code == 0, text.output + data.output
    want = json.loads(data.output)
    assert "[strong/fair/weak, pN]: where the score stands on this index's own matches" in text.output
    rows = re.findall(r"^\s+\d+\. score \S+\s+\[(strong|fair|weak), p(\d+)\]  (\S+)", text.output, flags=re.M)
    assert rows == [(h["band"], str(int(h["percentile"])), h["paper_id"]) for h in want["hits"]]
