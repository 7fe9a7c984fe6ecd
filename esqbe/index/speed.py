"""`esqbe check speed`: what indexing costs on this machine, measured by esqbe itself in about a minute.

On real abstracts shipped with esqbe (300 CSAbstruct abstracts, `samples/csabstruct-sample.jsonl`, Apache-2.0),
without their labels, as a user's unlabelled papers arrive:

- the **fp32 forward pass**: a plain fp32 PyTorch forward pass of the default model over `title [SEP] abstract`
  (length-sorted batches of 32, at most 512 tokens; tokenising included, loading not): the reference every ratio
  is taken against, as `benchmarks/bench_index_e2e.py` takes it;
- the **default run**: what `esqbe index FILE` does with the built-in settings (reading, sentence splitting,
  tagging, encoding on the default runtime, writing SQLite + tantivy, committing) into a temporary embedded index
  that is removed afterwards, also on an error or Ctrl-C;
- **each runtime** available here (torch fp32, torch-int8, onnx fp32, onnx-int8 on the CPU; torch with fp16/bf16
  autocast on a CUDA GPU when there is one): the encoder alone (`Encoder.contextual_sentence_vectors`).

Each measurement first runs a few papers (warm-up, and the estimate of its rate, not timed), then times as many
papers as its share of the time asked for allows (`seconds`; `papers` caps it). Rates are papers per second,
with the ratio to the fp32 forward pass and hours per million papers (1e6 / rate / 3600), next to the CPU features
that decide them (esqbe.encode.hardware). Loading models and the one-off ONNX export are not counted in the
rates (their seconds are reported apart)."""
from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from ..encode.hardware import machine
from ..errors import EsqbeError, ParameterError

#: the abstracts measured: real CSAbstruct abstracts (Apache-2.0, allenai/sequential_sentence_classification)
SAMPLE_NAME = "csabstruct-sample.jsonl"
SAMPLE_SOURCE = "CSAbstruct (Apache-2.0): 300 computer-science abstracts, their labels removed"

SECONDS_DEFAULT, SECONDS_MIN, SECONDS_MAX = 40, 10, 3600  # 40 s measured + loading: about a minute
PAPERS_MIN, PAPERS_MAX, PAPERS_DEFAULT_CAP = 8, 100_000, 5_000
PROBE_PAPERS = 8  # the warm-up of each measurement, which also estimates its rate
#: each measurement's share of the time: the reference and the default run; the runtimes share the rest evenly
SHARE_FORWARD, SHARE_DEFAULT = 0.2, 0.3

CPU_RUNTIMES = ("torch", "torch-int8", "onnx", "onnx-int8")  # backends measured on the CPU, in this order


@dataclass
class Rate:
    name: str  # what was measured
    runtime: str | None  # the encoder's runtime (IndexMeta.runtime's names), None: the plain forward pass
    device: str
    papers: int = 0
    seconds: float = 0.0
    papers_per_s: float = 0.0
    ratio_to_fp32_forward: float | None = None
    hours_per_million: float | None = None
    load_seconds: float = 0.0  # loading the model (and the first run's ONNX export), not in the rate
    skipped: str | None = None  # why it did not run here (a missing package, a runtime the device cannot run)

    def finish(self, papers: int, seconds: float) -> Rate:
        self.papers, self.seconds = papers, round(seconds, 3)
        self.papers_per_s = round(papers / seconds, 3) if seconds > 0 else 0.0
        if self.papers_per_s > 0:
            self.hours_per_million = round(1e6 / self.papers_per_s / 3600, 3)
        return self

    def against(self, reference: Rate) -> Rate:
        """The ratio to the reference's rate (the fp32 forward pass)."""
        if self.papers_per_s > 0 and reference.papers_per_s > 0:
            self.ratio_to_fp32_forward = round(self.papers_per_s / reference.papers_per_s, 3)
        return self


@dataclass
class SpeedReport:
    machine: dict  # esqbe.encode.hardware.Machine
    sample: dict  # the abstracts: source, papers, sentences
    seconds_asked: int
    seconds: float  # the whole check, loading included
    threads: int  # torch's intra-op threads (ONNX Runtime uses as many)
    versions: dict
    fp32_forward: Rate
    default: Rate
    default_tagged: int  # papers the default run tagged (all of them: the sample's labels are removed)
    runtimes: list[Rate] = field(default_factory=list)
    #: what else used the machine meanwhile (`Disturbance`); `reliable` is False when the figures are not this
    #: machine's alone
    disturbance: dict = field(default_factory=dict)
    reliable: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


#: the CPU others may use while esqbe measures before its figures are marked unreliable: a quarter of the cores'
#: time (or 5% stolen by the hypervisor)
OTHERS_SHARE_MAX, STEAL_SHARE_MAX = 0.25, 0.05


def _cpu_times() -> tuple[float, float] | None:
    """(seconds every core was busy, seconds stolen) since boot, from /proc/stat (None where there is none)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]
    return busy / hz, ticks[7] / hz


@dataclass
class Disturbance:
    """Whether others used the CPU while esqbe measured: esqbe's own CPU seconds (this process, its threads
    included) against the wall seconds and all the cores' busy seconds over the same span, and the load average."""

    started_wall: float = field(default_factory=time.perf_counter)
    started_cpu: float = field(default_factory=time.process_time)
    started_machine: tuple[float, float] | None = field(default_factory=_cpu_times)
    load_before: float | None = field(default_factory=lambda: os.getloadavg()[0] if hasattr(os, "getloadavg") else None)

    def finish(self, cores: int) -> dict:
        wall = time.perf_counter() - self.started_wall
        own = time.process_time() - self.started_cpu
        now = _cpu_times()
        others = steal = None
        if now is not None and self.started_machine is not None and wall > 0:
            others = max(0.0, (now[0] - self.started_machine[0]) - own) / (wall * max(1, cores))
            steal = max(0.0, now[1] - self.started_machine[1]) / (wall * max(1, cores))
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        return judge({"wall_seconds": round(wall, 2), "own_cpu_seconds": round(own, 2),
                      "others_cpu_share": None if others is None else round(others, 3),
                      "steal_share": None if steal is None else round(steal, 3),
                      "load_before": self.load_before, "load_after": load, "cores": cores})


def judge(d: dict) -> dict:
    """`d` (Disturbance's figures) with `disturbed` and `reason`: others used more than OTHERS_SHARE_MAX of the
    cores' time, the hypervisor stole more than STEAL_SHARE_MAX, or (no /proc/stat) the load average was over the
    cores esqbe's own threads leave free."""
    reasons = []
    if d.get("others_cpu_share") is not None and d["others_cpu_share"] > OTHERS_SHARE_MAX:
        reasons.append(f"other processes used {d['others_cpu_share']:.0%} of the CPU's time")
    if d.get("steal_share") is not None and d["steal_share"] > STEAL_SHARE_MAX:
        reasons.append(f"the hypervisor stole {d['steal_share']:.0%} of it")
    if d.get("others_cpu_share") is None and d.get("load_after") is not None and d["load_after"] > 1.5 * d["cores"]:
        reasons.append(f"the load average was {d['load_after']:.1f} on {d['cores']} cores")
    return {**d, "disturbed": bool(reasons), "reason": "; ".join(reasons) or None}


def sample_path() -> Path:
    """The shipped abstracts: `esqbe/samples/` in an installed package, else the repository's `samples/`."""
    try:
        packaged = resources.files("esqbe") / "samples" / SAMPLE_NAME
        if packaged.is_file():
            return Path(str(packaged))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - odd importers
        pass
    repo = Path(__file__).resolve().parents[2] / "samples" / SAMPLE_NAME
    if repo.is_file():
        return repo
    raise EsqbeError(f"the sample abstracts are missing: expected esqbe/samples/{SAMPLE_NAME} or samples/{SAMPLE_NAME}")


def _abstracts(path: Path) -> list[tuple[str, str]]:
    """(id, abstract text) of each sample record, in a fixed shuffled order (so that a part of it is a fair sample
    of its lengths)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            out.append((str(r["paper_id"]), " ".join(r["sentences"])))
    random.Random(0).shuffle(out)
    return out


def _take(abstracts: list[tuple[str, str]], start: int, n: int) -> list[tuple[str, str]]:
    """`n` abstracts from position `start` on, round the sample as often as needed; ids made unique per round."""
    out = []
    for i in range(start, start + n):
        pid, text = abstracts[i % len(abstracts)]
        out.append((f"{pid}#{i // len(abstracts)}", text))
    return out


def _measure(run: Callable[[list[tuple[str, str]]], float], abstracts, budget: float, cap: int,
             sized: Callable[[int], None] | None = None) -> tuple[int, float]:
    """(papers, seconds) of `run` (which times itself: its set-up stays off the clock): a warm-up run of
    PROBE_PAPERS papers, not counted; then PROBE_PAPERS more, whose rate says how many papers fill `budget`
    seconds (within [PROBE_PAPERS, cap]); then the rest of those. `sized(n)` hears the count before the rest runs."""
    run(_take(abstracts, 0, PROBE_PAPERS))
    first = run(_take(abstracts, PROBE_PAPERS, PROBE_PAPERS))
    n = max(PROBE_PAPERS, min(cap, int(PROBE_PAPERS / max(first, 1e-6) * budget)))
    if sized is not None:
        sized(n)
    rest = run(_take(abstracts, 2 * PROBE_PAPERS, n - PROBE_PAPERS)) if n > PROBE_PAPERS else 0.0
    return n, first + rest


def _papers(items: list[tuple[str, str]]):
    """Paper objects as the readers make them from an unlabelled abstract (sentences split)."""
    from ..domain import Paper
    from ..ingest.sentences import split_sentences

    return [Paper(pid, "", split_sentences(text)) for pid, text in items]


def _write_jsonl(path: Path, items: list[tuple[str, str]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for pid, text in items:
            f.write(json.dumps({"id": pid, "abstract": text}) + "\n")


def _forward_pass(abstracts, budget: float, cap: int, say: Callable[[str], None]) -> Rate:
    """The reference: fp32 PyTorch forward pass over `title [SEP] abstract` (no title here), sorted batches of 32."""
    import torch

    from ..encode.identity import resolve_model
    from ..encode.modeldir import pretrained

    rate = Rate("fp32 forward pass (PyTorch, batches of 32)", None, "cpu")
    start = time.perf_counter()
    source, _ = resolve_model(None)
    tok = pretrained("tokenizer", source, offline=True)
    model = pretrained("model", source, offline=True).eval()
    rate.load_seconds = round(time.perf_counter() - start, 3)

    def run(items) -> float:
        texts = sorted((f" [SEP] {text}" for _, text in items), key=len, reverse=True)
        t0 = time.perf_counter()
        with torch.inference_mode():
            for b in range(0, len(texts), 32):
                model(**tok(texts[b : b + 32], padding=True, truncation=True, max_length=512, return_tensors="pt"))
        return time.perf_counter() - t0

    n, seconds = _measure(run, abstracts, budget, cap, lambda n: say(f"fp32 forward pass: {n} papers"))
    return rate.finish(n, seconds)


def _runtime(backend: str, device: str, abstracts, budget: float, cap: int, say: Callable[[str], None]) -> Rate:
    """The encoder alone on one runtime: contextual sentence vectors of unlabelled abstracts."""
    from ..encode.encoder import Encoder

    rate = Rate(f"encoder, {backend} on {device}", None, device)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():  # torch-int8: PyTorch's deprecation of its quantized tensors, said elsewhere
            warnings.simplefilter("ignore", UserWarning)
            encoder = Encoder.load(backend=backend, device=device)
    except EsqbeError as e:  # a runtime this machine cannot run (onnxruntime missing, ...): said, not fatal
        rate.skipped = str(e)
        say(f"{backend} on {device}: skipped ({e})")
        return rate
    rate.runtime = encoder.runtime
    rate.name = f"encoder alone, {encoder.runtime} on {device}"

    def run(items) -> float:
        papers = _papers(items)
        t0 = time.perf_counter()
        encoder.contextual_sentence_vectors(papers)
        return time.perf_counter() - t0

    rate.load_seconds = round(time.perf_counter() - start, 3)
    n, seconds = _measure(run, abstracts, budget, cap, lambda n: say(f"{encoder.runtime} on {device}: {n} papers"))
    return rate.finish(n, seconds)


def _default_run(abstracts, work: Path, budget: float, cap: int, say: Callable[[str], None]) -> tuple[Rate, int]:
    """`esqbe index FILE` with the built-in settings into a fresh embedded index under `work` (the caller removes
    it): reading, splitting, tagging, encoding, writing, committing; the model and tagger loaded by a probe first."""
    from ..settings.config import Settings
    from .api import open_index

    rate = Rate("esqbe index (default settings: tagging, encoding, writing)", None, "")
    indexed: list[int] = []
    tagged: list[int] = []
    asked: list[int] = []
    start = time.perf_counter()
    with open_index(str(work / "index"), settings=Settings()) as index:
        index.encoder  # noqa: B018  # loaded (the ONNX export made on a first run) before the clock starts
        index.tagger  # noqa: B018
        rate.load_seconds = round(time.perf_counter() - start, 3)
        rate.runtime, rate.device = index.encoder.runtime, index.encoder.device

        def run(items) -> float:
            path = work / f"papers-{len(asked)}.jsonl"
            _write_jsonl(path, items)  # ids of their own (`_take`): none is found "unchanged"
            asked.append(len(items))
            t0 = time.perf_counter()
            report = index.index_files([str(path)])
            seconds = time.perf_counter() - t0
            indexed.append(report.indexed)
            tagged.append(report.tagged)
            return seconds

        n, seconds = _measure(run, abstracts, budget, cap,
                              lambda n: say(f"esqbe index ({rate.runtime} on {rate.device}, tagging): {n} papers"))
    if indexed != asked:
        raise EsqbeError(f"the default run indexed {sum(indexed)} of {sum(asked)} papers")
    return rate.finish(n, seconds), sum(tagged[1:])


def check_speed(*, seconds: int = SECONDS_DEFAULT, papers: int | None = None, runtimes: bool = True,
                progress: Callable[[str], None] | None = None, workdir: str | None = None) -> SpeedReport:
    """Measure this machine (see the module's doc). `seconds`: the time the measurements share (loading models not
    counted); `papers`: at most this many papers per measurement; `runtimes`: False measures only the reference and
    the default run; `progress`: called with a line per step; `workdir`: where the temporary index goes (a new
    directory inside it, removed at the end whatever happens)."""
    import torch

    if not SECONDS_MIN <= int(seconds) <= SECONDS_MAX:
        raise ParameterError(f"seconds must be within {SECONDS_MIN}..{SECONDS_MAX} (got {seconds})")
    if papers is not None and not PAPERS_MIN <= int(papers) <= PAPERS_MAX:
        raise ParameterError(f"papers must be within {PAPERS_MIN}..{PAPERS_MAX} (got {papers})")
    say = progress or (lambda _m: None)
    cap = int(papers) if papers is not None else PAPERS_DEFAULT_CAP
    started = time.perf_counter()
    here = machine()
    abstracts = _abstracts(sample_path())
    plan = [(b, "cpu") for b in CPU_RUNTIMES] + ([("torch", "cuda")] if here.gpu else [])
    share = (1 - SHARE_FORWARD - SHARE_DEFAULT) / len(plan) if runtimes else 0.0
    if not runtimes:  # the reference and the default run share the time
        forward_budget, default_budget = seconds * 0.4, seconds * 0.6
    else:
        forward_budget, default_budget = seconds * SHARE_FORWARD, seconds * SHARE_DEFAULT
    say(f"{here.cpu}, {here.cores} cores, int8 kernels: {here.int8_kernels}" + (f", GPU {here.gpu}" if here.gpu else ""))
    watch = Disturbance()
    work = Path(tempfile.mkdtemp(prefix="esqbe-speed-", dir=workdir))
    try:  # the default run first: what a user came for, whatever happens to the rest
        default, tagged = _default_run(abstracts, work, default_budget, cap, say)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    forward = _forward_pass(abstracts, forward_budget, cap, say)
    default.against(forward)
    measured = [_runtime(b, d, abstracts, seconds * share, cap, say).against(forward) for b, d in plan] \
        if runtimes else []
    versions = {"torch": torch.__version__, "onnxruntime": _version("onnxruntime"), "esqbe": _version("esqbe")}
    disturbance = watch.finish(os.cpu_count() or int(here.cores))  # /proc/stat counts every core
    if disturbance["disturbed"]:
        say(f"warning: {disturbance['reason']} while measuring: these figures are unreliable")
    return SpeedReport(disturbance=disturbance, reliable=not disturbance["disturbed"],machine=here.to_dict(),
                       sample={"source": SAMPLE_SOURCE, "papers": len(abstracts)},
                       seconds_asked=int(seconds), seconds=round(time.perf_counter() - started, 1),
                       threads=int(torch.get_num_threads()), versions=versions, fp32_forward=forward, default=default,
                       default_tagged=tagged, runtimes=measured)


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None
