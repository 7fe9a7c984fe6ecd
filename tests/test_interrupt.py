"""Interrupts tell the truth: SIGINT and SIGTERM during a real `esqbe index` process finish or
drop the batch in hand, print the summary of what is committed (exit 130 / 143), and that summary is what the
index holds, counted by opening it; the same command again indexes the rest, losing nothing.

The signal is sent at random points of the run (after a random number of progress lines: one per encoder batch),
three of them, on one index that each run continues."""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys

import esqbe

from .conftest import REPO, SAMPLE, esqbe_cli

N = 48
SUMMARY = re.compile(r"^read (\d+), indexed (\d+), replaced (\d+), unchanged (\d+), skipped (\d+)")


def _index(path, src, config, *, signal_after: int | None = None, sig=signal.SIGINT):
    """Run `esqbe index` in its own process; with `signal_after`, send `sig` once that many progress lines came.
    (returncode, stdout, stderr, the summary's numbers)."""
    cmd = [sys.executable, "-m", "cli", "index", "--path", str(path), "--config", str(config), "--batch-size", "4",
           str(src)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "ESQBE_PROGRESS_SECONDS": "0", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err_lines = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            err_lines.append(line)
            if signal_after is not None and sum(x.startswith("indexing: ") for x in err_lines) >= signal_after:
                proc.send_signal(sig)
                signal_after = None
        out = proc.stdout.read() if proc.stdout else ""
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    summary = next((SUMMARY.match(x) for x in out.splitlines() if SUMMARY.match(x)), None)
    assert summary is not None, (out, "".join(err_lines))
    return proc.returncode, out, "".join(err_lines), [int(x) for x in summary.groups()]


def _held(path) -> dict[str, str]:
    """The papers the index really holds: id -> title (opened, no model loaded)."""
    with esqbe.open_index(str(path)) as index:
        ids = sorted(index.backend.paper_ids())
        return {pid: p.title for pid, p in index.get(ids).items()}


def test_interrupted_runs_say_what_the_index_holds_and_a_rerun_loses_nothing(tmp_path):
    src = tmp_path / "papers.jsonl"
    src.write_text("\n".join(SAMPLE.read_text().splitlines()[:N]) + "\n")
    config = tmp_path / "esqbe.yaml"
    config.write_text("commit_every: 8\n")  # 6 commits: a signal lands between, or during, them
    path = tmp_path / "ix"
    rng = random.Random()
    seed = rng.randrange(10**6)
    rng.seed(seed)
    held_before = 0
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):
        after = rng.randint(1, 6)
        code, out, err, (read, indexed, replaced, unchanged, skipped) = _index(path, src, config, signal_after=after,
                                                                               sig=sig)
        where = f"seed {seed}, {sig.name} after {after} progress lines:\n{out}\n{err}"
        assert code == 128 + sig.value, where
        held = _held(path) if path.exists() else {}
        assert len(held) == held_before + indexed, where  # the summary's count is what the index holds
        assert unchanged == held_before and replaced == 0 and skipped == 0, where
        assert f"interrupted ({sig.name}): the {indexed + unchanged} paper(s) counted above are committed" in err, where
        assert f"the index holds {len(held)} paper(s) in all" in err, where
        assert "all read in" not in err and "done" not in err, where  # no progress line claims the work is done
        held_before = len(held)
    # the same command again, to its end (in this process: the signals above needed processes, this run does not)
    done = esqbe_cli("index", "--path", path, "--config", config, "--batch-size", "4", src,
                     env={"ESQBE_PROGRESS_SECONDS": "0"})
    code, out, err = done.returncode, done.stdout, done.stderr
    assert code == 0, err
    summary = next(SUMMARY.match(x) for x in out.splitlines() if SUMMARY.match(x))
    read, indexed, replaced, unchanged, skipped = (int(x) for x in summary.groups())
    assert (read, indexed, unchanged) == (N, N - held_before, held_before)
    expected = {r["paper_id"]: r.get("title") or "" for r in map(json.loads, SAMPLE.read_text().splitlines()[:N])}
    assert _held(path) == expected  # nothing lost, nothing doubled


def test_a_signal_before_the_first_batch_reads_nothing_and_says_so(tmp_path, encoder):
    """The token cancelled before the run: no source read, each named as not read, no index written."""
    from esqbe.core.deadline import Deadline

    src = tmp_path / "papers.jsonl"
    src.write_text("\n".join(SAMPLE.read_text().splitlines()[:3]) + "\n")
    token = Deadline()
    token.cancel("SIGTERM")
    with esqbe.open_index(str(tmp_path / "ix"), encoder=encoder, config=None) as index:
        report = index.index_files([str(src), str(src)], stop=token)
    assert (report.interrupted, report.read, report.stored, report.not_read) == ("SIGTERM", 0, 0, [str(src)] * 2)
    assert "interrupted (SIGTERM): the 0 paper(s) counted above are committed" in report.interrupt_message(0)


def test_an_interrupt_mid_batch_writes_what_was_encoded(tmp_path):
    """Ctrl-C keeps what was encoded (it once discarded 191 encoded papers, 0 committed): one commit batch of 300 papers,
    SIGINT once the progress shows more than a slice's papers encoded; the slices finished are
    written, the summary says how many are committed and how many read were left, and the index holds that."""
    from esqbe.index.ingest import _SLICE_BATCHES, _SLICE_MIN_PAPERS

    lines = SAMPLE.read_text().splitlines()
    src = tmp_path / "papers.jsonl"
    src.write_text("\n".join(lines) + "\n")
    config = tmp_path / "esqbe.yaml"
    config.write_text(f"commit_every: {len(lines)}\n")  # before the fix: nothing committed until the end
    path = tmp_path / "ix"
    cmd = [sys.executable, "-m", "cli", "index", "--path", str(path), "--config", str(config), "--batch-size", "4",
           str(src)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "ESQBE_PROGRESS_SECONDS": "0", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    slice_size = max(4 * _SLICE_BATCHES, _SLICE_MIN_PAPERS)  # the least a slice holds (more with many ONNX sessions)
    err_lines, seen = [], 0
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            err_lines.append(line)
            encoded = re.match(r"^indexing: (\d+) papers", line)
            if not seen and encoded and int(encoded.group(1)) > slice_size:
                seen = int(encoded.group(1))
                proc.send_signal(signal.SIGINT)
        out = proc.stdout.read() if proc.stdout else ""
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(err_lines)
    where = f"signal after {seen} encoded:\n{out}\n{err}"
    assert seen, where
    assert proc.returncode == 130, where
    summary = next(SUMMARY.match(x) for x in out.splitlines() if SUMMARY.match(x))
    read, indexed, replaced, unchanged, skipped = (int(x) for x in summary.groups())
    told = re.search(r"the (\d+) paper\(s\) counted above are committed.* (\d+) paper\(s\) read were left out, "
                     r"their encoding not finished", err)
    assert told is not None, where
    committed, left = int(told.group(1)), int(told.group(2))
    held = _held(path)
    assert len(held) == committed == indexed, where  # what the summary says is what the index holds
    assert committed > 0, where  # the finished slices went in (before the fix: 0, the batch was dropped)
    assert read == committed + left and left > 0, where  # nothing read is unaccounted for
    assert f"(the {committed} committed are skipped as unchanged)" in err, where
