"""`esqbe train-encoder`: a LoRA adapter for the contextual sentence encoder, trained on citation contexts.

Two objectives, both with in-batch negatives (the other papers of a batch) and hard negatives (the cited paper's
other abstract sentences), on sentence vectors made as esqbe makes them (`title [SEP] abstract` encoded once,
each sentence the mean of its tokens; the citing sentence encoded alone):

* **textual guidance** (after Aspire): a citing sentence should match its cited paper's abstract sentences. Where
  the corpus's automatic span names abstract sentences, those are the target among the abstract's sentences
  (noisy labels); the citing sentence's score for a paper is its best sentence (max-sim), contrasted over the
  batch's papers;
* **co-citation**: two papers cited in one sentence are alike in what the sentence says of them: each paper's
  sentence closest to the citing sentence (picked under the current model, no gradient) should match the other
  paper's, contrasted with the batch's other co-cited pairs.

LoRA (r, alpha) goes into the top `layers` transformer layers only: the facet tagger reads the encoder's lower
hidden states (layer `num_layers - 2` for the shipped tagger), which an adapter above them leaves unchanged.
The layers below the adapter are frozen and run as at inference (no dropout), so their output for a text never
changes: with `cache` (the default) each text's hidden state at the adapter's first layer is computed once, before
training, and every step runs only the top `layers` layers over it (~3x cheaper per step for MiniLM's 6 layers,
~6x for MPNet's 12); `cache=False` runs the whole model every step and trains the same adapter (float tolerance;
tests/test_adapter.py checks). Deterministic on CPU for a seed and a thread count
(`torch.use_deterministic_algorithms`).

**Grouped citances** (`group` > 1): a paper has 3-20 citing sentences in the pack (median 17), and the
abstract is the expensive text to encode. With `group` G, each paper's citing sentences are split (seeded) into
groups of up to G, and a guidance batch holds `batch` groups of distinct papers: every abstract is encoded once per
batch for up to G citances. Each citing sentence is contrasted with the batch's papers as before (its cited paper
against the other `batch` - 1, max-sim), so the in-batch negatives are still the other papers of the batch; the
hard negatives are still the cited abstract's other sentences; the loss is the mean over the batch's citing
sentences. `group=1` is the unbatched recipe, unchanged (the same batches, losses and weights)."""
from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ParameterError
from .adapter import META_FILE
from .citations import CitedPaper, CitingSentence, annotated_papers, co_citations, read_citations

#: the pack the shipped adapter was trained on (relative to a checkout)
DEFAULT_CITANCES = "../shared/data/clscisumm/Training-Set-2019/Task1/From-ScisummNet-2019.citances.tar.gz"


@dataclass
class TrainConfig:
    citances: int = 1000  # citing sentences sampled (seeded) from the pack; 0: all of them
    epochs: int = 1  # passes over the sampled citing sentences (batches reshuffled each pass)
    batch: int = 16  # papers per batch (in-batch negatives)
    cocite_every: int = 4  # one co-citation batch after every N textual-guidance batches
    lr: float = 2e-4
    r: int = 8
    alpha: int = 16
    layers: int = 2  # LoRA in the top N layers only
    max_tokens: int = 256  # abstract window (title + abstract)
    max_citance_tokens: int = 64
    temperature: float = 0.05
    seed: int = 0
    threads: int = 2
    cache: bool = True  # compute the frozen lower layers once per text (see the module's docstring)
    frozen_dropout: bool = False  # dropout in the frozen layers too (the first shipped adapter's recipe; no cache)
    group: int = 1  # citing sentences of one paper per guidance batch (1: the unbatched recipe; see the docstring)


def _targets(model, layers: int) -> list[str]:
    n = int(model.config.num_hidden_layers)
    names = []
    for name, module in model.named_modules():
        parts = name.split(".")
        if module.__class__.__name__ == "Linear" and "layer" in parts:
            idx = int(parts[parts.index("layer") + 1])
            if idx >= n - layers:
                names.append(name)
    return names


class _Pooler:
    """Sentence vectors with gradients, the way `Encoder.contextual_sentence_vectors` pools them. With a cache
    (`fill_cache`), the frozen layers below the adapter are not run: each text's stored hidden state is fed to the
    top layers."""

    def __init__(self, model, tokenizer, cfg: TrainConfig):
        import torch

        self.model, self.tok, self.cfg, self.torch = model, tokenizer, cfg, torch
        self.base = _bare(model)
        self.split = int(self.base.config.num_hidden_layers) - cfg.layers  # the first layer with an adapter
        self.cache: dict | None = None  # text key -> (tokens, d) hidden state entering layer `split`

    def _paper_enc(self, papers: list[CitedPaper]):
        import numpy as np

        bodies, starts = [], []
        for p in papers:
            starts.append(np.cumsum([0] + [len(s) + 1 for s in p.sentences[:-1]]))
            bodies.append(" ".join(p.sentences))
        enc = self.tok([p.title for p in papers], bodies, padding=True, truncation="only_second",
                       max_length=self.cfg.max_tokens, return_offsets_mapping=True, return_tensors="pt")
        return enc, starts, [("paper", p.paper_id) for p in papers]

    def _text_enc(self, texts: list[str]):
        enc = self.tok(texts, padding=True, truncation=True, max_length=self.cfg.max_citance_tokens, return_tensors="pt")
        return enc, [("text", t) for t in texts]

    def _hidden(self, enc, keys):
        """The last hidden state of a batch: the whole model, or the top layers over the cached states."""
        torch = self.torch
        enc = {k: v for k, v in enc.items() if k != "offset_mapping"}
        if self.cache is None:
            return self.model(**enc).last_hidden_state
        mask = enc["attention_mask"]
        states = torch.zeros(*mask.shape, self.base.config.hidden_size)
        for i, key in enumerate(keys):
            h = self.cache[key]
            states[i, : len(h)] = h  # right-padded, like the tokenizer's rows; padding is masked out
        with _swapped(self.base, self.base.encoder.layer[self.split:], _given(states)):
            return self.model(**enc).last_hidden_state

    def fill_cache(self, papers: list[CitedPaper], texts: list[str], batch: int = 32, log=None) -> int:
        """Run the frozen layers once over every paper and text (length-sorted batches, no gradient) and keep each
        one's hidden state entering the first adapted layer; returns the number of texts cached."""
        torch = self.torch
        cache: dict = {}
        lower = self.base.encoder.layer[: self.split]
        t0 = time.perf_counter()
        ordered_papers = sorted(papers, key=lambda p: -len(" ".join(p.sentences)))
        ordered_texts = sorted(set(texts), key=lambda t: -len(t))
        parts = [self._paper_enc(ordered_papers[i : i + batch])[::2] for i in range(0, len(ordered_papers), batch)]
        parts += [self._text_enc(ordered_texts[i : i + batch]) for i in range(0, len(ordered_texts), batch)]
        for enc, keys in parts:
            enc = {k: v for k, v in enc.items() if k != "offset_mapping"}
            with torch.no_grad(), _swapped(self.base, lower, None):
                hidden = self.model(**enc).last_hidden_state
            for i, key in enumerate(keys):
                cache[key] = hidden[i, : int(enc["attention_mask"][i].sum())].clone()
        self.cache = cache
        if log:
            log(f"cached the frozen layers' output for {len(cache)} texts in {time.perf_counter() - t0:.0f} s")
        return len(cache)

    def papers(self, papers: list[CitedPaper]):
        """Per paper: (n_sentences, d) normalised vectors of its abstract sentences (those inside the window)."""
        import numpy as np

        torch = self.torch
        enc, starts, keys = self._paper_enc(papers)
        offsets = enc["offset_mapping"]
        hidden = self._hidden(enc, keys)
        out = []
        for i in range(len(papers)):
            seq = torch.tensor([s == 1 for s in enc.sequence_ids(i)])
            sent = torch.from_numpy(np.searchsorted(starts[i], offsets[i, :, 0].numpy(), side="right") - 1).long()
            owner = torch.where(seq, sent, torch.full_like(sent, -1))
            n = int(owner.max().item()) + 1 if bool((owner >= 0).any()) else 0
            onehot = (owner.unsqueeze(0) == torch.arange(max(n, 1)).unsqueeze(1)).float()  # (n, T)
            pooled = onehot @ hidden[i] / onehot.sum(1, keepdim=True).clamp(min=1)
            out.append(torch.nn.functional.normalize(pooled[:n], dim=-1))
        return out

    def texts(self, texts: list[str]):
        torch = self.torch
        enc, keys = self._text_enc(texts)
        hidden = self._hidden(enc, keys)
        mask = enc["attention_mask"].unsqueeze(-1).float()
        return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1), dim=-1)


def _bare(model):
    """The transformers model under a peft wrapper (the one with `embeddings` and `encoder.layer`)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # not peft's forwarding wrapper
    if not hasattr(inner, "embeddings") or not hasattr(getattr(inner, "encoder", None), "layer"):
        raise ParameterError(f"esqbe train-encoder supports BERT-style encoders (embeddings + encoder.layer); "
                             f"{type(inner).__name__} is not one")
    return inner


def _given(states):
    """An embedding module that returns `states` (the cached hidden states) whatever it is called with."""
    import torch

    class Given(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return states

    return Given()


@contextmanager
def _swapped(base, layers, embeddings):
    """`base` with only `layers` in its encoder and, when given, `embeddings` in place of its embedding module, for
    one forward pass (the attention mask and any position bias are still built by the model's own code)."""
    import torch

    old_layers, old_emb = base.encoder.layer, base.embeddings
    base.encoder.layer = torch.nn.ModuleList(list(layers))
    if embeddings is not None:
        base.embeddings = embeddings
    try:
        yield
    finally:
        base.encoder.layer, base.embeddings = old_layers, old_emb


def _guidance_loss(pool: _Pooler, batch: list[tuple[CitingSentence, CitedPaper]], t: float):
    """The guidance loss of a batch of (citing sentence, its cited paper): the grouped loss with groups of one (each
    citance against every paper of the batch, max-sim, plus the hard-negative term over its own paper's sentences)."""
    return _grouped_guidance_loss(pool, [([c], p) for c, p in batch], t)


def _grouped_guidance_loss(pool: _Pooler, batch: list[tuple[list[CitingSentence], CitedPaper]], t: float):
    """The guidance loss of a batch of (citing sentences, their cited paper), one group per paper: each citing
    sentence against every paper of the batch (max-sim), cross-entropy toward its own, plus the hard-negative term
    over its paper's sentences; both averaged over the batch's citing sentences."""
    torch = pool.torch
    owner = [j for j, (group, _) in enumerate(batch) for _ in group]
    cites = [c for group, _ in batch for c in group]
    cit = pool.texts([c.text for c in cites])  # (N, d)
    sents = pool.papers([p for _, p in batch])  # each abstract once
    scores = torch.stack([torch.stack([(s @ cit[i]).max() if len(s) else cit[i].sum() * 0 for s in sents])
                          for i in range(len(cites))])  # (N, B): citance i vs paper j, max-sim
    loss = torch.nn.functional.cross_entropy(scores / t, torch.tensor(owner))
    hard = []
    for i, (c, j) in enumerate(zip(cites, owner)):
        p = batch[j][1]
        idx = [k for k, sid in enumerate(p.sids[: len(sents[j])]) if sid in c.span_sids]
        if idx and len(sents[j]) > 1:
            logits = (sents[j] @ cit[i]) / t
            hard.append(torch.logsumexp(logits, 0) - torch.logsumexp(logits[idx], 0))
    if hard:
        loss = loss + torch.stack(hard).mean()
    return loss


def _groups(guided: list[tuple[CitingSentence, CitedPaper]], size: int,
            rng: random.Random) -> list[tuple[list[CitingSentence], CitedPaper]]:
    """Each paper's citing sentences in a seeded order, cut into groups of up to `size` (papers in first-seen order)."""
    by_paper: dict[str, tuple[list[CitingSentence], CitedPaper]] = {}
    for c, p in guided:
        by_paper.setdefault(p.paper_id, ([], p))[0].append(c)
    out = []
    for cites, p in by_paper.values():
        rng.shuffle(cites)
        out += [(cites[i : i + size], p) for i in range(0, len(cites), size)]
    return out


def _cocite_loss(pool: _Pooler, batch: list[tuple[str, CitedPaper, CitedPaper]], t: float):
    torch = pool.torch
    cit = pool.texts([text for text, _, _ in batch])
    left = pool.papers([a for _, a, _ in batch])
    right = pool.papers([b for _, _, b in batch])
    va, vb = [], []
    for i in range(len(batch)):
        with torch.no_grad():
            ka, kb = int((left[i] @ cit[i]).argmax()), int((right[i] @ cit[i]).argmax())
        va.append(left[i][ka])
        vb.append(right[i][kb])
    sims = torch.stack(va) @ torch.stack(vb).T / t
    labels = torch.arange(len(batch))
    return (torch.nn.functional.cross_entropy(sims, labels) + torch.nn.functional.cross_entropy(sims.T, labels)) / 2


def _batches(items: list, size: int, key: Callable, rng: random.Random) -> list[list]:
    """Batches of `size` items with distinct keys (so in-batch negatives are other papers), in a seeded order."""
    items = list(items)
    rng.shuffle(items)
    out: list[list] = []
    pending: list = []
    for item in items:
        placed = False
        for b in pending:
            if len(b) < size and all(key(item) != key(x) for x in b):
                b.append(item)
                placed = True
                break
        if not placed:
            pending.append([item])
        full = [b for b in pending if len(b) == size]
        out += full
        pending = [b for b in pending if len(b) < size]
    return out + [b for b in pending if len(b) >= 2]


def train_encoder(citances_tar: str, out_dir: str, *, encoder_source: str, base_name: str, base_fingerprint: str | None,
                  cfg: TrainConfig | None = None, exclude: set[str] | None = None, log=print) -> dict:
    """Train a LoRA adapter on `citances_tar` (+ its Reference_XML pack) and write it to `out_dir`; returns a summary."""
    import torch

    try:
        import peft  # noqa: F401
    except ImportError:
        raise ParameterError("esqbe train-encoder needs peft: pip install 'esqbe[train]' (or pip install peft)") from None
    cfg = cfg or TrainConfig()
    if cfg.cache and cfg.frozen_dropout:
        raise ParameterError("frozen_dropout makes the frozen layers' output change every step: it cannot be cached "
                             "(train with cache off)")
    if (cfg.citances and cfg.citances < cfg.batch) or cfg.batch < 2 or cfg.epochs < 1 or cfg.group < 1:
        raise ParameterError(f"need at least 2 per batch, as many citances as a batch (0: all), 1 epoch and groups of "
                             f"at least 1 (got batch {cfg.batch}, citances {cfg.citances}, epochs {cfg.epochs}, "
                             f"group {cfg.group})")
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    fill = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]  # NaN-filling: ~9% of a step
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    try:
        return _train(citances_tar, out_dir, cfg, exclude, encoder_source, base_name, base_fingerprint, log)
    finally:  # the process's own settings back (a server or a test session goes on)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]


def _train(citances_tar, out_dir, cfg: TrainConfig, exclude, encoder_source, base_name, base_fingerprint, log) -> dict:
    import numpy as np
    import torch
    from peft import LoraConfig, get_peft_model

    from .modeldir import pretrained

    t0 = time.perf_counter()
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    exclude = annotated_papers(citances_tar) if exclude is None else exclude
    papers, sentences = read_citations(citances_tar, exclude=exclude)
    rng = random.Random(cfg.seed)
    sample = sorted(rng.sample(range(len(sentences)), min(cfg.citances or len(sentences), len(sentences))))
    guided = [(sentences[i], papers[sentences[i].cited]) for i in sample]
    pairs = [(text, papers[a], papers[b]) for text, cited in co_citations(sentences)
             for a, b in zip(cited, cited[1:])]
    log(f"{len(papers)} cited papers with abstracts, {len(sentences)} citing sentences ({len(guided)} sampled, "
        f"{sum(1 for c, _ in guided if c.span_sids)} with an automatic span), {len(pairs)} co-cited pairs")
    tok = pretrained("tokenizer", encoder_source, offline=True)
    model = pretrained("model", encoder_source, offline=True)
    targets = _targets(model, cfg.layers)
    model = get_peft_model(model, LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=0.0, target_modules=targets,
                                             bias="none"))
    model.train()
    pool = _Pooler(model, tok, cfg)
    if not cfg.frozen_dropout:  # the frozen layers run as at inference (no dropout): the same output every time
        pool.base.embeddings.eval()
        for layer in pool.base.encoder.layer[: pool.split]:
            layer.eval()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    kind_g = "guide" if cfg.group == 1 else "grouped"

    def guidance_batches() -> list[list]:
        items = guided if cfg.group == 1 else _groups(guided, cfg.group, rng)
        return _batches(items, cfg.batch, lambda x: x[1].paper_id, rng)

    gb = guidance_batches()
    cb = _batches(pairs, cfg.batch, lambda x: (x[1].paper_id, x[2].paper_id), rng) if cfg.cocite_every else []
    plan: list[tuple[str, list]] = []
    ci = 0
    for epoch in range(cfg.epochs):
        if epoch:  # each pass its own seeded order
            gb = guidance_batches()
        for i, b in enumerate(gb, 1):
            plan.append((kind_g, b))
            if cfg.cocite_every and i % cfg.cocite_every == 0 and cb:
                plan.append(("cocite", cb[ci % len(cb)]))
                ci += 1
    n_guide = sum(1 for kind, _ in plan if kind != "cocite")
    n_cites = sum(len(item[0]) if kind == "grouped" else 1 for kind, b in plan if kind != "cocite" for item in b)
    log(f"{len(plan)} steps: {n_guide} guidance batches ({n_cites / max(1, n_guide):.1f} citing sentences each), "
        f"{len(plan) - n_guide} co-citation batches")
    if cfg.cache:
        used = [p for _, b in plan for item in b for p in item[1:]]
        texts = [t for kind, b in plan for item in b for t in
                 ([item[0].text] if kind == "guide" else [c.text for c in item[0]] if kind == "grouped" else [item[0]])]
        pool.fill_cache(list({p.paper_id: p for p in used}.values()), texts, log=log)
    total = len(plan)
    warmup = max(1, total // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, (total - s) / total))
    losses: dict[str, list[float]] = {"guide": [], "cocite": []}
    for step, (kind, batch) in enumerate(plan, 1):
        loss = (_guidance_loss(pool, batch, cfg.temperature) if kind == "guide" else
                _grouped_guidance_loss(pool, batch, cfg.temperature) if kind == "grouped" else
                _cocite_loss(pool, batch, cfg.temperature))
        kind = "guide" if kind == "grouped" else kind
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses[kind].append(loss.item())
        if step % 20 == 0 or step == total:
            g = losses["guide"][-20:]
            log(f"step {step}/{total}: guidance loss {sum(g) / max(1, len(g)):.3f}, {time.perf_counter() - t0:.0f} s")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    summary = {"base_model": base_name, "excluded_papers": len(exclude), "base_fingerprint": base_fingerprint,
               "config": asdict(cfg),
               "cited_papers": len(papers), "citing_sentences": len(sentences), "steps": total, "guidance_batches": n_guide,
               "co_cited_pairs": len(pairs), "first_guidance_loss": losses["guide"][:1],
               "guidance_loss_curve": [round(sum(c) / len(c), 4) for c in
                                       (losses["guide"][i : i + 50] for i in range(0, len(losses["guide"]), 50))],
               "losses": {k: [round(x, 6) for x in v] for k, v in losses.items()} if total <= 200 else None,
               "last_guidance_loss": sum(losses["guide"][-20:]) / max(1, len(losses["guide"][-20:])),
               "seconds": round(time.perf_counter() - t0, 1), "torch": torch.__version__}
    for junk in ("README.md",):
        (out / junk).unlink(missing_ok=True)
    (out / META_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    return summary
