"""`esqbe serve`: the index over HTTP (esqbe.server)."""
from __future__ import annotations

import click

from esqbe.core.limits import MAX_QUERY_SENTENCES
from esqbe.settings.generate import LazyChoice

from .errors import handle_errors
from .options import click_options, config_option, overrides_from_click

TOKEN_HELP = ("Bearer token the write endpoints ({writes}) require, at least 16 characters; visible in ps: prefer env "
              "ESQBE_TOKEN or --token-file.")


class _TokenOption(click.Option):
    """--token, whose help lists the write endpoints from the server's route table when help is shown (so the list
    cannot drift, and the server is not imported for every command)."""

    def get_help_record(self, ctx):
        from esqbe.server.routes import write_endpoints

        self.help = TOKEN_HELP.format(writes=", ".join(write_endpoints()))
        return super().get_help_record(ctx)


class Duration(click.ParamType):
    """A duration: a number and a unit, s, m, h or d (`90s`, `30m`, `12h`, `1d`), or seconds alone; as seconds."""

    name = "DURATION"
    UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        text = str(value).strip().lower()
        unit = text[-1:] if text[-1:] in self.UNITS else "s"
        number = text[:-1] if text[-1:] in self.UNITS else text
        try:
            seconds = float(number) * self.UNITS[unit]
        except ValueError:
            self.fail(f"{value!r} is not a duration: a number and s, m, h or d (90s, 30m, 12h, 1d)", param, ctx)
        if not 1 <= seconds <= 30 * 86_400:
            self.fail(f"{value!r}: a duration from 1s to 30d", param, ctx)
        return seconds


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on. Anything but loopback needs a token (ESQBE_TOKEN or --token-file).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--token", cls=_TokenOption, help=TOKEN_HELP)
@click.option("--readers", type=click.IntRange(1, 64), help="Reader threads, each with its own index handle and model (default: 1 embedded, 4 engines).")
@click.option("--cors-origin", "cors_origins", multiple=True, help="Allow browser pages from this origin to call the API (repeatable; default: CORS off).")
@click.option("--max-body-bytes", type=click.IntRange(1024), help="Largest request body accepted (default: 16 MiB).")
@click.option("--max-query-sentences", type=click.IntRange(1, MAX_QUERY_SENTENCES), help=f"Most sentences a request's free texts may have together, each text counted whole (default and most: {MAX_QUERY_SENTENCES}).")
@click.option("--max-batch-records", type=click.IntRange(1), help="Most records one POST /papers may carry (default: 1000).")
@click.option("--no-warm", is_flag=True, help="Answer at once instead of loading the kNN structures first.")
@click.option("--log-level", type=LazyChoice(["critical", "error", "warning", "info", "debug"]), default="info", show_default=True)
@click.option("--token-file", type=click.Path(dir_okay=False), help="Read the bearer token from this file (its first line).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, help="A Host name clients use, e.g. behind a reverse proxy (repeatable; default: loopback names on loopback, any name otherwise).")
@click.option("--private", is_flag=True, help="Reads (queries, papers, search, stats) need the token too, not only writes.")
@click.option("--allow-raw-engine-filter", is_flag=True, help="Requests with the token may send any engine_filter query DSL (default: term, terms, range, exists, match, prefix, bool only).")
@click.option("--write-lock-timeout", type=click.FloatRange(0, 3600, min_open=True), help="Seconds a write waits for another writer's lock before answering 503 (default: 30).")
@click.option("--show-paths", is_flag=True, help="Show the index path, the model's directory and engine URL in /stats, papers' source files and error messages (default: hidden from clients: names only).")
@click.option("--words", "words", multiple=True, metavar="NAME=DIR",
              help="Word vectors (`esqbe train-words --out DIR`) that queries may use as asym_token's words=NAME (repeatable); "
                   "a client never names a directory.")
@click.option("--request-timeout", type=click.FloatRange(0, 3600, min_open=True),
              help="Seconds a request (a query, a rerank, a write, a watch) may take, its wait for a thread included, before it is abandoned with 504 (default: 30).")
@click.option("--public-url", metavar="URL",
              help="Where readers reach this server's page, e.g. https://papers.example.org/ behind a proxy: feed entries "
                   "of papers with no DOI or URL link there (default: http://HOST:PORT/ on loopback).")
@click.option("--follow-every", "follow_every", type=Duration(), metavar="DURATION",
              help="Run `esqbe follow run` (every followed source, then every watch) on this schedule, e.g. 12h, 30m: "
                   "the first run once the server is up, each next one this long after the last ended, on the "
                   "writer's thread (writes queue behind it). Default: never.")
@click_options("serve")
@config_option
@handle_errors
def serve_cmd(host, port, token, readers, cors_origins, max_body_bytes, max_query_sentences, max_batch_records, no_warm,
              log_level, token_file, allowed_hosts, private, allow_raw_engine_filter, write_lock_timeout, show_paths,
              words, request_timeout, public_url, follow_every, **kw):
    """Serve the index over HTTP: a JSON API (docs at /docs) and a page at /.

    \b
    esqbe serve                                   # http://127.0.0.1:8000/ over ./esqbe-index
    esqbe serve --path lib-index --port 9000
    esqbe serve --follow-every 12h                # new papers from `esqbe follow` sources, watches run, feeds fill
    ESQBE_TOKEN=$(openssl rand -hex 16) esqbe serve --host 0.0.0.0 --allowed-host papers.example.org
    The model and the index are opened once and kept warm; queries never wait for a write.
    """
    from esqbe.server.app import serve
    from esqbe.server.options import options_from_env
    from esqbe.settings.config import load_settings

    options = options_from_env(host=host, port=port, token=token, readers=readers, cors_origins=list(cors_origins) or None,
                               max_body_bytes=max_body_bytes, max_query_sentences=max_query_sentences,
                               max_batch_records=max_batch_records, warm=False if no_warm else None, token_file=token_file,
                               allowed_hosts=list(allowed_hosts) or None, private=private or None,
                               allow_raw_engine_filter=allow_raw_engine_filter or None,
                               write_lock_timeout=write_lock_timeout, show_paths=show_paths or None,
                               words=_parse_words(words) or None, request_timeout=request_timeout,
                               public_url=public_url, follow_every=follow_every, freeze_gc=True)
    config = kw.pop("config", None)
    overrides = overrides_from_click(kw, "serve")
    settings = load_settings(config, **overrides)
    serve(settings, options, log_level=log_level)


def _parse_words(pairs) -> dict[str, str]:
    """--words NAME=DIR pairs: each DIR an `esqbe train-words` directory (checked now, not at the first query)."""
    from pathlib import Path

    from esqbe.rescore.words import VECTORS_FILE

    out = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise click.BadParameter(f"expected NAME=DIR, got {pair!r}", param_hint="--words")
        if not (Path(path) / VECTORS_FILE).is_file():
            raise click.BadParameter(f"{path} holds no word vectors (make them with `esqbe train-words --out {path}`)",
                                     param_hint="--words")
        out[name.strip()] = path
    return out
