"""Training a tagger on gold-labelled abstracts (CSAbstruct): lower encoder states cached once, the copied layers
and the BiLSTM fine-tuned, the epoch chosen on dev (`esqbe train-tagger`)."""
from __future__ import annotations

import math
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..domain import RAW_LABELS, Paper
from ..errors import DataError, ParameterError
from .evaluate import _gold_papers, _scores
from .net import TaggerMismatchError, TaggerNet, _Layer, _torch
from .weights import TAGGER_FORMAT, _encoder_info

# ================================================================ training
#: defaults chosen on the CSAbstruct dev split (see docs/tagger.md); `esqbe train-tagger` uses them
TUNED_LAYERS = 2


EPOCHS = 4


LR = 1e-4


HEAD_LR = 1e-3


BATCH_SIZE = 16


LSTM = 128


DROPOUT = 0.2


POOL = "mean"


#: tokens averaged per group within a sentence before the copied layers (1: every token; `net._group_tokens`):
#: 4 for the shipped MiniLM tagger (dev macro-F1 69.35 against 68.84 with every token, at a quarter
#: of the copied layers' arithmetic; docs/results.md)
STRIDE = 4


def _cache_lower_states(encoder, papers: Sequence[Paper], layer: int, progress: bool) -> list[list[dict]]:
    """Per paper, its encoder rows: the frozen hidden states at `layer` (fp16), sentence spans and indices.

    Computed through the very `on_batch` path the listener uses, so training sees what indexing sees.
    """
    rows: list[list[dict]] = [[] for _ in papers]

    def keep(batch):
        mask = batch.attention_mask.bool().cpu()
        hidden = batch.hidden_states[layer]
        for i, (pi, sentences) in enumerate(batch.rows):
            n = int(mask[i].sum())
            rows[pi].append({"h": hidden[i, :n].to("cpu", _torch().float16).clone(), "spans": list(batch.spans[i]),
                             "sents": list(sentences)})

    encoder.contextual_sentence_vectors(papers, on_batch=keep, progress=progress)
    return rows


def _forward_cached(net, batch_rows: Sequence[list[dict]], n_sents: Sequence[int], bf16: bool):
    """Logits per paper from cached lower-layer states (the training-time twin of TagListener)."""
    torch = _torch()
    rows = [r for paper_rows in batch_rows for r in paper_rows]
    T = max(len(r["h"]) for r in rows)
    dim = rows[0]["h"].shape[-1]
    device = next(net.parameters()).device
    x = torch.zeros(len(rows), T, dim, device=device)
    valid = torch.zeros(len(rows), T, dtype=torch.bool, device=device)
    for i, r in enumerate(rows):
        x[i, : len(r["h"])] = r["h"].to(device).float()
        valid[i, : len(r["h"])] = True
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        vecs = net.sentence_vectors(x, valid, [r["spans"] for r in rows])
    per_paper, k = [], 0
    width = vecs[0].shape[-1]  # dim, or 2 x dim with mean+attn pooling
    for paper_rows, n in zip(batch_rows, n_sents):
        v = torch.zeros(n, width, device=device)
        for r in paper_rows:
            v = v.index_copy(0, torch.tensor(r["sents"], device=device), vecs[k].float())
            k += 1
        per_paper.append(v)
    return net.classify(per_paper)


def _predict_cached(net, rows, papers, bf16: bool, batch_size: int = 32):
    """Softmax probabilities (n_sentences, 5) per paper, in order."""
    torch = _torch()
    net.eval()
    out = [None] * len(papers)
    order = sorted(range(len(papers)), key=lambda i: sum(len(r["h"]) for r in rows[i]))
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            idx = [i for i in order[start : start + batch_size] if papers[i].sentences]
            if not idx:
                continue
            logits_of = _forward_cached(net, [rows[i] for i in idx], [len(papers[i].sentences) for i in idx], bf16)
            for i, logits in zip(idx, logits_of):
                out[i] = logits.float().softmax(-1).cpu()
    return out


def _auto_bf16(device) -> bool:
    """bf16 autocast for training where the hardware runs it natively (AMX/AVX512-BF16 CPUs, recent GPUs)."""
    torch = _torch()
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        return bool(torch._C._cpu._is_amx_tile_supported() or torch._C._cpu._is_avx512_bf16_supported())
    except AttributeError:
        return False


def _seed_everything(seed: int) -> None:
    torch = _torch()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train_tagger(
    train_path,
    dev_path,
    out_path,
    *,
    encoder=None,
    seed: int = 0,
    epochs: int = EPOCHS,
    progress: bool = True,
    tuned_layers: int = TUNED_LAYERS,
    lr: float = LR,
    head_lr: float = HEAD_LR,
    batch_size: int = BATCH_SIZE,
    lstm: int = LSTM,
    dropout: float = DROPOUT,
    pool: str = POOL,
    stride: int = STRIDE,
    limit: int | None = None,
    bf16: bool | None = None,
) -> dict:
    """Train the tagger on CSAbstruct-style data; keep the epoch with the best dev macro-F1 (esqbe classes).

    The encoder's lower layers stay frozen (their states are cached once); copies of its top
    `tuned_layers` layers are fine-tuned with the BiLSTM head. Writes fp16 weights that record the
    encoder, and returns the dev metrics. `limit` keeps the first N train and dev papers (smoke tests).
    """
    torch = _torch()
    import torch.nn.functional as F

    from ..encode.loader import ModelSpec, load_encoder

    started = time.time()
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else (lambda msg: None)
    encoder = encoder or load_encoder(ModelSpec(backend="torch"))  # trained on the exact fp32 hidden states
    info = _encoder_info(encoder)
    if not 0 <= tuned_layers <= encoder.num_layers:
        raise ParameterError(f"tuned_layers must be between 0 and {encoder.num_layers}")
    if int(stride) < 1:
        raise ParameterError(f"the token stride must be at least 1, not {stride}")
    input_layer = encoder.num_layers - tuned_layers
    try:
        hf_layers = encoder.model.encoder.layer
    except AttributeError:
        raise TaggerMismatchError(f"encoder {encoder.name!r} is not a BERT-style model; "
                                  "the tagger cannot copy its layers") from None

    train = _gold_papers(train_path, limit=limit)
    dev = _gold_papers(dev_path, limit=limit)
    if not train or not dev:
        raise DataError("train and dev data must each hold at least one labelled paper")
    say(f"caching layer-{input_layer} states of {len(train)} train and {len(dev)} dev abstracts")
    train_rows = _cache_lower_states(encoder, train, input_layer, progress)
    dev_rows = _cache_lower_states(encoder, dev, input_layer, progress)

    _seed_everything(seed)
    config = encoder.model.config
    arch = {"dim": info["dim"], "n_layers": tuned_layers, "heads": int(config.num_attention_heads),
            "ff": int(config.intermediate_size), "eps": float(config.layer_norm_eps), "lstm": int(lstm),
            "n_labels": len(RAW_LABELS), "dropout": float(dropout), "pool": pool,
            "stride": int(stride)}
    net = TaggerNet(**arch)
    for k in range(tuned_layers):
        net.layers[k] = _Layer.from_hf(hf_layers[input_layer + k], config)
    device = torch.device(encoder.device)
    net.to(device)
    use_bf16 = _auto_bf16(device) if bf16 is None else bool(bf16)

    groups = [{"params": list(net.layers.parameters()), "lr": lr},
              {"params": [p for n, p in net.named_parameters() if not n.startswith("layers.")], "lr": head_lr}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=0.01)
    per_epoch = math.ceil(len(train) / batch_size)
    total = max(1, epochs * per_epoch)
    warmup = int(0.1 * total)

    def schedule(step: int) -> float:  # linear warm-up over 10% of the steps, then linear decay to 0
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    labels = [torch.tensor([RAW_LABELS.index(f) for f in p.facets], device=device) for p in train]
    lengths = [sum(len(r["h"]) for r in rows) for rows in train_rows]
    rng = random.Random(seed)

    history, best = [], None
    for epoch in range(epochs):
        net.train()
        t0 = time.time()
        # batches of similar length (less padding), in random order
        order = sorted(range(len(train)), key=lambda i: lengths[i] + rng.random() * 30)
        batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
        rng.shuffle(batches)
        loss_sum = 0.0
        for idx in batches:
            idx = [i for i in idx if train[i].sentences]
            logits = torch.cat(_forward_cached(net, [train_rows[i] for i in idx], [len(train[i].sentences) for i in idx],
                                               use_bf16))
            loss = F.cross_entropy(logits.float(), torch.cat([labels[i] for i in idx]))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            sched.step()
            loss_sum += loss.item()
        dev_scores = _scores(dev, _predict_cached(net, dev_rows, dev, use_bf16))
        row = {"epoch": epoch + 1, "loss": round(loss_sum / max(len(batches), 1), 4),
               "dev_macro_f1": dev_scores["esqbe"]["macro_f1"], "dev_macro_f1_raw": dev_scores["raw"]["macro_f1"],
               "seconds": round(time.time() - t0, 1)}
        history.append(row)
        say(f"epoch {row['epoch']}/{epochs}: loss {row['loss']}, dev macro-F1 {row['dev_macro_f1']} "
            f"(raw {row['dev_macro_f1_raw']}), {row['seconds']}s")
        if best is None or row["dev_macro_f1"] > best[0]["dev_macro_f1"]:
            best = (row, dev_scores, {k: v.detach().to("cpu", torch.float16).clone() for k, v in net.state_dict().items()})

    assert best is not None  # at least one epoch ran
    best_row, best_dev, state = best
    # how far the probabilities are from honest on the same held-out dev (esqbe.tagger.calibrate)
    from .calibrate import calibration_report, fit_temperature

    net.load_state_dict({k: v.float() for k, v in state.items()})
    dev_probs = [p for p in _predict_cached(net, dev_rows, dev, use_bf16) if p is not None]
    log_probs = np.log(np.clip(torch.cat(dev_probs).numpy(), 1e-12, 1.0))
    gold = np.array([RAW_LABELS.index(f) for p in dev if p.sentences for f in p.facets])
    temperature = fit_temperature(log_probs, gold)
    calibration = {**calibration_report(log_probs, gold, temperature), "on": "dev"}
    say(f"temperature {calibration['temperature']}: dev ECE {calibration['ece_before']} -> {calibration['ece_after']}")
    meta = {
        "format": TAGGER_FORMAT,
        # the fitted temperature is recorded, not applied: ranking with the calibrated probabilities was measured no
        # better (docs/tagger.md); `esqbe train-tagger --calibrate FILE` applies it
        "calibration": calibration,
        "encoder": info,
        "input_layer": input_layer,
        "arch": arch,
        "labels": list(RAW_LABELS),
        "training": {
            "train": str(train_path) if isinstance(train_path, (str, Path)) else "<papers>",
            "dev": str(dev_path) if isinstance(dev_path, (str, Path)) else "<papers>",
            "train_papers": len(train), "dev_papers": len(dev), "seed": seed, "epochs": epochs,
            "best_epoch": best_row["epoch"], "lr": lr, "head_lr": head_lr, "batch_size": batch_size,
            "bf16": use_bf16, "limit": limit, "dev_macro_f1": best_row["dev_macro_f1"],
            "dev_macro_f1_raw": best_row["dev_macro_f1_raw"], "torch": str(torch.__version__),
        },
    }
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    torch.save({"meta": meta, "state_dict": state}, tmp)
    os.replace(tmp, out_path)
    say(f"wrote {out_path} ({out_path.stat().st_size / 1e6:.1f} MB), best epoch {best_row['epoch']}")
    return {"out": str(out_path), "best_epoch": best_row["epoch"], "dev": best_dev, "history": history,
            "calibration": calibration,
            "seconds": round(time.time() - started, 1)}
