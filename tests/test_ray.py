"""Distributed encoding on Ray Data (`esqbe ray-encode`, esqbe.distributed): on a real
local Ray cluster of 2 CPUs, its Parquet shards hold the vectors and labels `esqbe encode` writes for the
same input, and `esqbe index` loads them into an index that answers queries. Ray stays out of `import esqbe`
and of the CLI's start, and a machine without it is told which extra to install."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from .conftest import REPO, SAMPLE, esqbe_cli

#: the whole Ray run (a cluster's start, two actors loading the model, 24 abstracts) must end well inside this
RAY_RUN_LIMIT_S = 420


@contextmanager
def time_limit(seconds: int):
    def expire(*_):
        raise TimeoutError(f"the Ray run took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def inputs(tmp_path) -> list[Path]:
    """24 abstracts in two files (every other one without labels, so the tagger runs too) and one bad line."""
    records = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:24]]
    for i, r in enumerate(records):
        if i % 2:
            r.pop("labels", None)
            r.pop("confs", None)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in records[:12]))
    b.write_text("".join(json.dumps(r) + "\n" for r in records[12:]) + '{"paper_id": "bad", "sentences": 5}\n')
    return [a, b]


def encoded(files):
    """paper id -> IndexedPaper, and the files' one IndexMeta."""
    from esqbe.ingest.encoded import read_encoded, read_meta

    papers, metas = {}, set()
    for f in files:
        metas.add(read_meta(f))
        for batch in read_encoded(f):
            papers.update((p.paper_id, p) for p in batch)
    assert len(metas) == 1, metas
    return papers, metas.pop()


def test_ray_encode_matches_esqbe_encode_and_its_shards_index(tmp_path, inputs):
    import ray

    from esqbe.distributed import ray_encode

    ref = esqbe_cli("encode", *inputs, "--out", tmp_path / "ref", "--quiet")
    assert ref.returncode == 0, ref.stderr

    out = tmp_path / "ray"
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        with time_limit(RAY_RUN_LIMIT_S):
            report = ray_encode([str(p) for p in inputs], str(out), papers_per_file=8)
    finally:
        ray.shutdown()
    assert (report.read, report.encoded, report.tagged) == (25, 24, 12)
    assert report.errors == [f"{inputs[1]}:13: sentences: expected a list of sentences, got int"]
    assert len(report.files) >= 3 and sorted(map(str, out.glob("*.parquet"))) == report.files

    want, want_meta = encoded(sorted((tmp_path / "ref").glob("*.parquet")))
    got, got_meta = encoded(report.files)
    assert got_meta == want_meta  # the model's identity, as `esqbe encode` records it
    assert sorted(got) == sorted(want) and len(got) == 24
    for pid, p in want.items():
        assert got[pid].paper.facets == p.paper.facets, pid  # given labels kept, the others tagged alike
        assert got[pid].paper.metadata == p.paper.metadata, pid
        np.testing.assert_allclose(got[pid].vectors, p.vectors, atol=1e-5, err_msg=pid)
    assert any(p.paper.metadata.get("facets_predicted") for p in got.values())

    index = tmp_path / "index"
    r = esqbe_cli("index", "--path", index, *report.files, "--quiet")
    assert r.returncode == 0, r.stderr
    assert "indexed 24" in r.stdout
    paper = next(pid for pid, p in got.items() if "method" in p.paper.facets)
    r = esqbe_cli("query", "--path", index, "--paper", paper, "--facet", "method", "-k", "3", "--json")
    assert r.returncode == 0, r.stderr
    hits = json.loads(r.stdout)["hits"]
    assert len(hits) == 3 and all(h["paper_id"] in got and h["paper_id"] != paper for h in hits)


def test_ray_is_not_loaded_by_import_esqbe_or_the_cli():
    code = ("import sys, esqbe, esqbe.distributed, esqbe.cli.main\n"
            "from click.testing import CliRunner\n"
            "r = CliRunner().invoke(esqbe.cli.main.main, ['ray-encode', '--help'])\n"
            "assert r.exit_code == 0 and 'ray start --head' in r.output, r.output\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_without_ray_the_error_names_the_extra(tmp_path, inputs):
    code = ("import sys; sys.modules['ray'] = None  # as on a machine without the extra\n"
            "from cli import main; main(sys.argv[1:], prog_name='esqbe')")
    r = subprocess.run([sys.executable, "-c", code, "ray-encode", str(inputs[0]), "--out", str(tmp_path / "out")],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "pip install 'esqbe[ray]'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_second_run_into_the_same_directory_is_refused_before_ray_starts(tmp_path, inputs):
    from esqbe.distributed import ray_encode
    from esqbe.errors import ParameterError

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "papers-ray-0.parquet").write_bytes(b"")
    with pytest.raises(ParameterError, match="already holds 1 Parquet file"):
        ray_encode([str(inputs[0])], str(tmp_path / "out"))
