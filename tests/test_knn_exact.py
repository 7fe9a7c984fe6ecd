"""The exact re-score of the kNN's candidate papers (`KnnMixin._exact_best`) on a real index: the best
cosine per (paper, query sentence) over the papers' rows of the facet, as numpy computes it from the stored vectors,
reading only those rows from the vector file."""
from __future__ import annotations

import numpy as np
import pytest


def _truth(everything, pids, facet, q):
    """Per paper with rows of `facet` (all rows if None), in paper-number order: its best cosine per query row."""
    out = {}
    for pid in pids:
        p = everything[pid]
        idx = list(range(len(p.paper.sentences))) if facet is None else p.paper.facet_indices(facet)
        if idx:
            out[pid] = (p.vectors[idx].astype(np.float64) @ q.T.astype(np.float64)).max(axis=0)
    return out


@pytest.mark.parametrize("facet", ["background", "method", "result", None])
def test_exact_rescore_is_numpys_best_cosine_and_reads_only_the_facets_rows(small_index, facet):
    from esqbe.backends.embedded.backend import EmbeddedBackend
    from esqbe.backends.embedded.layout import _FACET_CODES

    with EmbeddedBackend(small_index.backend.path, create=False) as b:
        _check_exact_best(b, _FACET_CODES, facet)


def _check_exact_best(b, facet_codes, facet):
    st = b._state()
    everything = b.get(b.paper_ids())
    pids = sorted(everything)[::2] + ["no-such-paper"]  # every other paper; an id with no number is dropped
    pnos = b.pnos(pids)
    q = np.stack([everything[pids[0]].vectors[0], everything[pids[1]].vectors[-1], everything[pids[2]].vectors[1]])
    read = []
    orig = b._read_rows

    def counting(st_, starts, lengths):
        read.append(int(np.sum(lengths)))
        return orig(st_, starts, lengths)

    b._read_rows = counting
    try:
        codes = None if facet is None else [facet_codes[facet]]
        papers, best = b._exact_best(st, np.r_[pnos, pnos[:3]], codes, q)  # repeats are one paper
    finally:
        del b._read_rows
    truth = _truth(everything, pids[:-1], facet, q)
    ids = b._ids_of(papers)
    assert [ids[int(p)] for p in papers] == sorted(truth, key=lambda pid: int(b.pnos([pid])[0]))
    for p, row in zip(papers, best):
        np.testing.assert_allclose(row, truth[ids[int(p)]], rtol=0, atol=2e-6)
    # the vector file is read for the facet's rows only (all of a paper's rows when no facet is asked)
    n_rows = sum(len(everything[pid].paper.sentences if facet is None else everything[pid].paper.facet_indices(facet))
                 for pid in pids[:-1])
    assert sum(read) == n_rows, (sum(read), n_rows)


def test_exact_rescore_of_no_rows(small_index):
    from esqbe.backends.embedded.backend import EmbeddedBackend

    with EmbeddedBackend(small_index.backend.path, create=False) as b:
        st = b._state()
        papers, best = b._exact_best(st, np.zeros(0, dtype=np.int64), [0], np.ones((2, st.dim), dtype=np.float32))
    assert papers.shape == (0,) and best.shape == (0, 2)


def test_paper_ids_of_numbers_read_from_a_covering_index(index_dir_30, tmp_path):
    """The kNN's hits are named from the index (pno, paper_id) alone, not the papers' rows; an index
    written before that index gets it from its next writer."""
    import shutil
    import sqlite3

    from esqbe.backends.embedded.backend import EmbeddedBackend

    path = tmp_path / "index"
    shutil.copytree(index_dir_30, path)
    db = sqlite3.connect(path / "papers.sqlite")
    db.execute("DROP INDEX IF EXISTS papers_pno_id")  # as an index made before it
    db.commit()
    db.close()
    with EmbeddedBackend(path, create=False) as b:
        pnos = b.pnos(b.paper_ids()[:5])
        ids = b._ids_of(pnos)
        assert sorted(ids.values()) == sorted(b.paper_ids()[:5])
        b.configure(nprobe=8)  # a writer
        traced: list[str] = []
        b._db.set_trace_callback(traced.append)
        assert b._ids_of(pnos) == ids
        b._db.set_trace_callback(None)
        plan = b._db.execute("EXPLAIN QUERY PLAN " + traced[-1]).fetchall()
    assert "COVERING INDEX papers_pno_id" in str(plan), plan


@pytest.mark.parametrize("params", [{"exact_cap": -1}, {"exact_cap": float("nan")}, {"nprobe": 0}, {"nprobe": 2.5},
                                    {"oversample": True}, {"exact_cap": "2000"}, {"bm25_max_df": 0.0}, {"bm25_max_terms": -1},
                                    {"bm25_max_df": float("inf")}, {"merge_threshold": 10**12}])
def test_first_stage_parameters_are_bounded(tmp_path, params):
    """`configure` stored whatever `type(default)(value)` made of a value: -1, NaN (a ValueError traceback), "2000",
    True, 2.5 (truncated to 2). Each is now refused with the parameter's range, and nothing is stored."""
    from esqbe.backends.embedded.backend import EmbeddedBackend
    from esqbe.errors import BackendError

    b = EmbeddedBackend(tmp_path / "ix")
    before = b.knn_params()
    with pytest.raises(BackendError, match=f"kNN parameter {next(iter(params))} must be"):
        b.configure(**params)
    assert b.knn_params() == before
    b.configure(exact_cap=1500, bm25_max_df=1.0, nprobe=np.int64(64))  # in range, numpy integers too
    assert (b.knn_params()["exact_cap"], b.knn_params()["nprobe"]) == (1500, 64)
    b.close()


def test_f16_to_f32_is_numpys_cast_for_every_finite_half():
    """The exact re-score's float16 -> float32 (a bit trick, ~3x numpy's scalar cast) is exact: all 63,488 finite
    half values, normal, subnormal and both zeros, in the shapes the re-score reads (rows of 384)."""
    from esqbe.backends.embedded.layout import f16_to_f32

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    halves = bits.view(np.float16)
    halves = halves[np.isfinite(halves)]
    assert len(halves) == 63_488
    got = f16_to_f32(halves)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), halves.astype(np.float32).view(np.uint32))
    rows = np.resize(halves, (len(halves) // 384, 384))
    assert np.array_equal(f16_to_f32(rows).view(np.uint32), rows.astype(np.float32).view(np.uint32))
    assert f16_to_f32(rows).shape == rows.shape


def test_the_cap_keeps_each_sentences_best_candidates():
    """`capped_union` under a cap keeps every query sentence's best candidates (by rank within that sentence), not
    the papers with the best score summed over sentences: a sentence whose approximate scores are all lower than
    another's still has its top candidates re-scored."""
    from esqbe.backends.embedded.recall import capped_union

    strong = (np.arange(100, 200), np.linspace(0.9, 0.6, 100))  # sentence A: papers 100..199, high scores
    weak = (np.array([7, 8, 9, 150, 151]), np.array([0.5, 0.45, 0.4, 0.3, 0.2]))  # sentence B: lower scores
    kept = capped_union([strong, weak], 10)
    assert len(kept) == 10 and list(kept) == sorted(kept)
    assert {7, 8, 9} <= set(kept)  # B's best three (summed scores would have kept A's 0.9..0.87 instead)
    assert {100, 101, 102} <= set(kept)  # and A's best
    assert 150 in kept  # A's rank 50 and B's rank 3: its best rank is 3
    # a paper `live` drops takes no place, and no cap keeps the whole union
    assert 7 not in capped_union([strong, weak], 10, lambda p: p != 7)
    assert len(capped_union([strong, weak], 10, lambda p: p != 7)) == 10
    assert len(capped_union([strong, weak], 0)) == 103
