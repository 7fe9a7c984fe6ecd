"""esqbe's command line: thin click commands over the Python API in `esqbe`.

The `main` group and its commands, each in the module of its kind (index_cmds, query_cmds, serve_cmd,
model_cmds, eval_cmds); options.py holds the shared options, errors.py the exit statuses."""
from __future__ import annotations

import os
import sys

import click

from .check_cmds import check_group
from .engine_cmds import engine_group
from .eval_cmds import eval_clscisumm_cmd, eval_csfcube_cmd
from .follow_cmds import follow_group
from .graph_cmd import graph_cmd
from .index_cmds import attach_cmd, delete_cmd, encode_cmd, index_cmd, stats_cmd
from .info_cmds import config_cmd, list_cmd, search_cmd, show_cmd
from .model_cmds import adapt_cmd, tag_cmd, train_encoder_cmd, train_tagger_cmd, train_words_cmd
from .query_cmds import cite_cmd, query_cmd
from .ray_cmd import ray_encode_cmd
from .serve_cmd import serve_cmd
from .watch_cmds import watch_group


def _process_env() -> None:
    """What this process runs with (the CLI owns its process; the library sets none of this): no hub access
    unless asked (the default model ships in a package), and no tokenizer thread pools to fork."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _quiet_transformers()


def _quiet_transformers() -> None:
    """transformers' weight-loading bars and info lines off for this process (the library leaves them as the host
    set them). Before transformers loads, through its environment; if it is loaded already (a runner in this
    process), directly."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="esqbe")
def main():
    """Faceted query-by-example search for scientific papers.

    \b
    Index papers, then ask for the papers most similar to one paper in one aspect:
      esqbe index papers.jsonl
      esqbe query --paper 1791179 --facet method
      esqbe query --paper 1791179 --sentences 0,2
    The index lives in ./esqbe-index unless --path, --backend or a config file say otherwise.
    """
    _process_env()


@click.group("eval")
def eval_group():
    """Measure ranking quality on a test collection."""


for _command in (index_cmd, encode_cmd, query_cmd, attach_cmd, serve_cmd, cite_cmd, delete_cmd, stats_cmd, tag_cmd,
                 train_tagger_cmd, train_words_cmd, train_encoder_cmd, adapt_cmd):
    main.add_command(_command)
for _command in (search_cmd, show_cmd, list_cmd, config_cmd):  # find, inspect, explain the settings
    main.add_command(_command)
main.add_command(ray_encode_cmd)  # esqbe[ray]: encode on a Ray cluster
main.add_command(eval_group)
eval_group.add_command(eval_csfcube_cmd)
eval_group.add_command(eval_clscisumm_cmd)
main.add_command(check_group)
main.add_command(watch_group)  # saved queries that keep looking
main.add_command(engine_group)  # esqbe as an engine's reranker
main.add_command(follow_group)  # sources new papers arrive from by themselves
main.add_command(graph_cmd)  # the hits of a query as a graph (esqbe.query.graph)


if __name__ == "__main__":
    main()
