"""ray-encode: `esqbe encode` spread over a Ray cluster (the optional extra `esqbe[ray]`; Ray is imported only here,
when the command runs)."""
from __future__ import annotations

import json
import sys

import click

from esqbe.core.textsafe import printable
from esqbe.settings.generate import LazyChoice
from esqbe.settings.table import FORMATS

from .errors import EXIT_ERROR, handle_errors
from .options import click_options
from .output import say


@click.command("ray-encode")
@click.argument("files", nargs=-1, required=True, type=str)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Directory for the Parquet output (OUT/papers-ray-*.parquet), empty or new; one path on every node (a shared file system).")
@click.option("--address", default=None, metavar="ADDRESS", help="The Ray cluster: auto (the one `ray start` made on this machine), HOST:6379, ray://HOST:10001. Default: a local cluster on this machine, for this run only.")
@click.option("--actors", type=click.IntRange(min=1), default=None, help="Encoders in the pool (default: as many as the cluster's CPUs, or GPUs with --gpus-per-actor, allow).")
@click.option("--cpus-per-actor", type=click.FloatRange(min=0), default=1.0, show_default=True, help="CPUs each encoder holds (its torch threads).")
@click.option("--gpus-per-actor", type=click.FloatRange(min=0), default=0.0, show_default=True, help="GPUs each encoder holds (1: one GPU each; 0.5: two encoders share one).")
@click.option("--papers-per-file", type=click.IntRange(min=1), default=1024, show_default=True, help="Papers per Parquet file (one encoder batch).")
@click.option("--format", "fmt", type=LazyChoice(FORMATS), help="Input format (default: detected per file).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress (Ray Data's bars and the workers' log lines).")
@click.option("--config", "config", type=click.Path(dir_okay=False), help="YAML settings file.")
@click_options("encode")
@handle_errors
def ray_encode_cmd(files, out_dir, address, actors, cpus_per_actor, gpus_per_actor, papers_per_file, fmt, facets, as_json,
                   quiet, config, **kw):
    """Encode papers from FILES on a Ray cluster into Parquet, to load with `esqbe index OUT/*.parquet`.

    \b
    What `esqbe encode` does, spread by Ray Data over every node: a read task per file streams papers to
    a pool of encoders (actors, each loading the model once; papers without labels are tagged), and each
    batch becomes one Parquet file of `esqbe encode`'s schema. Needs `pip install 'esqbe[ray]'` on every
    node, and FILES and --out on a file system every node sees.
    \b
      ray start --head                                    # the head node (prints its address)
      ray start --address HEAD:6379                       # each other node
      esqbe ray-encode corpus/*.jsonl.gz --out encoded/ --address auto
      esqbe ray-encode corpus/*.jsonl.gz --out encoded/ --address auto --gpus-per-actor 1 --batch-size 256
      esqbe index encoded/*.parquet                       # or --backend elasticsearch/opensearch: bulk, no model
    Without --address a local cluster is started for the run (all this machine's CPUs).
    Bad records are reported as file:line: field: reason and skipped. Exit status: 0 done, 1 bad
    input/settings, nothing encoded, or the cluster failed.
    """
    from esqbe.distributed import ray_encode

    report = ray_encode(list(files), out_dir, address=address, config=config, format=fmt, facets=facets, actors=actors,
                        cpus_per_actor=cpus_per_actor, gpus_per_actor=gpus_per_actor, papers_per_file=papers_per_file,
                        progress=not quiet and not as_json, **{k: v for k, v in kw.items() if v is not None})
    if as_json:
        click.echo(json.dumps(report.summary(), indent=2))
    else:
        for err in report.errors:
            say(f"warning: {printable(err)}", err=True)
        click.echo(f"read {report.read}, encoded {report.encoded} into {len(report.files)} file(s) in {report.path}, "
                   f"skipped {sum(report.skipped.values())}, errors {len(report.errors)}"
                   + (f", tagged {report.tagged}" if report.tagged else "") + f" in {report.seconds:.1f}s")
    if report.encoded == 0 and report.errors:
        click.echo("error: nothing encoded (see the errors above)", err=True)
        sys.exit(EXIT_ERROR)
