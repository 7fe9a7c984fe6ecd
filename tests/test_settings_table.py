"""The settings table (esqbe.settings.table) is the one declaration every skin takes its settings from:
each flagged setting is on the `--help` of the commands that take it, a value out of range is refused the
same way by the CLI (exit 2), a config (ConfigError) and HTTP (422), an HTTP field gives the same
`Index.query` override as its flag, choices are the same everywhere, a rescorer added with `@register` is
reachable by all three, `esqbe eval`'s command lines parse back to the same settings, and the settings
reference (docs/settings.md) is the generated one."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from esqbe.cli.main import main as cli
from esqbe.settings import generate
from esqbe.settings.config import ConfigError, Settings, load_settings
from esqbe.settings.table import BY_NAME, SETTINGS

REPO = Path(__file__).resolve().parent.parent
FLAGGED = [s for s in SETTINGS if s.flag]
RANGED = [s for s in SETTINGS if s.low is not None and s.flag]
BOTH = [s for s in SETTINGS if s.flag and s.http and "query" in s.commands and s.name != "rescorer_params"]


def _command(name: str):
    group = cli
    for part in name.split():
        group = group.commands[part]
    return group


def _legal(s):
    """A legal value of setting `s` other than its default."""
    if s.choices is not None:
        return next(c for c in s.choice_list() if c not in (s.default, "none"))
    if s.type is int:
        return 3
    return 0.25 if s.default == 0.5 else 0.5


def test_settings_dataclass_is_the_table():
    import dataclasses

    fields = dataclasses.fields(Settings)
    assert [f.name for f in fields] == [s.name for s in SETTINGS]
    for f in fields:
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        assert default == BY_NAME[f.name].default, f.name


@pytest.mark.parametrize("setting", FLAGGED, ids=lambda s: s.name)
def test_every_flag_is_on_the_help_of_its_commands(setting):
    assert setting.commands
    for command in sorted(setting.commands):
        result = CliRunner().invoke(cli, [*command.split(), "--help"])
        assert result.exit_code == 0, result.output
        assert re.search(rf"(^|[\s,]){re.escape(setting.flag)}\b", result.output), (command, setting.flag)


@pytest.fixture(scope="module")
def index_path(index_dir_30, tmp_path_factory):
    path = tmp_path_factory.mktemp("settings") / "index"
    shutil.copytree(index_dir_30, path)
    return path


@pytest.fixture(scope="module")
def client(index_path, encoder):
    from fastapi.testclient import TestClient

    from esqbe.server import ServeOptions, create_app

    app = create_app(str(index_path), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1", warm=False))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _paper_id(index_path) -> str:
    from .conftest import SAMPLE

    return json.loads(SAMPLE.read_text().splitlines()[0])["paper_id"]


def _http_body(s, value) -> dict:
    head, _, leaf = s.http.rpartition(".")
    return {head: {leaf: value}} if head else {leaf: value}


@pytest.mark.parametrize("setting", RANGED, ids=lambda s: s.name)
def test_out_of_range_is_refused_alike_by_cli_config_and_http(setting, client, tmp_path):
    low = setting.low - (1 if setting.type is int else 0.5)
    high = setting.high + 1
    command = "query" if "query" in setting.commands else sorted(setting.commands)[0]
    for bad in (low, high):
        result = CliRunner().invoke(cli, [*command.split(), setting.flag, str(bad)])
        assert result.exit_code == 2, result.output
        assert (f"{setting.high:g}" if setting.type is float else str(int(setting.high))) in result.output, result.output
    for bad in (("nan", "inf", "-inf") if setting.type is float else ()):  # a usage error too, not the config's (1)
        result = CliRunner().invoke(cli, [*command.split(), setting.flag, bad])
        assert result.exit_code == 2 and "Invalid value" in result.output, result.output
        with pytest.raises(ConfigError, match=re.escape(f"{setting.high:g}")):
            Settings().replace(**{setting.name: bad})
        cfg = tmp_path / "esqbe.yaml"
        cfg.write_text(f"{setting.name}: {bad}\n")
        with pytest.raises(ConfigError, match=setting.name):
            load_settings(cfg, env={})
    if setting.http:
        bound = setting.high if setting.http_max is None else setting.http_max
        for bad, limit in ((low, setting.low), (bound + 1, bound)):
            r = client.post("/query", json={"paper_id": "x", **_http_body(setting, bad)})
            assert r.status_code == 422, r.text
            assert f"{limit:g}" in r.json()["error"]["message"], r.text


def test_http_fields_give_the_flags_overrides(client, index_path, monkeypatch):
    """Each HTTP field and its CLI flag, set to the same non-default value, reach `Index.query` as the same
    override and give the same hits (a real small index)."""
    from esqbe.index.api import Index

    seen: list[dict] = []
    original = Index.query

    def recording(self, *args, **kw):
        seen.append(kw)
        return original(self, *args, **kw)

    monkeypatch.setattr(Index, "query", recording)
    pid = _paper_id(index_path)
    for s in BOTH:
        value = _legal(s)
        seen.clear()
        result = CliRunner().invoke(cli, ["query", "--path", str(index_path), "--paper", pid, "--json",
                                          s.flag, str(value)])
        assert result.exit_code == 0, result.output
        cli_hits = [h["paper_id"] for h in json.loads(result.output)["hits"]]
        r = client.post("/query", json={"paper_id": pid, **_http_body(s, value)})
        assert r.status_code == 200, (s.name, r.text)
        assert len(seen) == 2, s.name
        cli_kw, http_kw = seen
        assert cli_kw.get(s.name) == value == http_kw.get(s.name), (s.name, cli_kw, http_kw)
        assert [h["paper_id"] for h in r.json()["hits"]] == cli_hits, s.name


def test_http_only_settings_map_to_their_settings_field():
    from esqbe.server.models import QueryRequest

    for s in SETTINGS:
        if s.http and s.name != "rescorer_params" and not s.flag:
            value = _legal(s)
            req = QueryRequest(paper_id="x", **_http_body(s, value))
            assert req.overrides()[s.name] == value


def test_choices_are_the_same_on_every_skin(index_path):
    import click

    from esqbe.server import ServeOptions, create_app
    from esqbe.settings.config import check_value

    schema = create_app(str(index_path), config=None, options=ServeOptions(host="127.0.0.1", warm=False)).openapi()
    defs = schema["components"]["schemas"]
    table = generate.markdown_table()
    for s in SETTINGS:
        if s.choices is None:
            continue
        choices = tuple(s.choice_list())
        for value in choices:
            assert check_value(s.name, value) is None
        assert check_value(s.name, "no-such-choice")
        for command in s.commands if not callable(s.choices) else ():  # the registry's: checked by the config
            params = {p.name: p for p in _command(command).params}
            assert isinstance(params[s.name].type, click.Choice)
            assert tuple(params[s.name].type.choices) == choices, (s.name, command)
        if s.http:
            head, _, leaf = s.http.rpartition(".")
            model = defs["FirstStageOptions" if head == "first_stage" else "QueryRequest"]
            assert tuple(model["properties"][leaf]["enum"]) == choices, s.name
        if not callable(s.choices):
            assert " \\| ".join(choices) in table, s.name


def test_a_registered_rescorer_is_reachable_by_every_skin(client, index_path, monkeypatch):
    """A rescorer added with `@register` (one declared parameter) is a choice of `--rescorer`, of a
    config and of POST /query, and shows in the OpenAPI schema."""
    from esqbe.rescore import registry
    from esqbe.rescore.registry import Param, make_rescorer

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_PARAMS", dict(registry._PARAMS))

    # `tau` is a parameter name the server's parameter model already has (built when the server module
    # was imported); its bounds here are the new rescorer's own
    @registry.register("test_summax", [Param("tau", float, 1.0, "unused", low=0.0, high=5.0, http=True)])
    def _factory(context, tau=1.0):
        return make_rescorer("summax", context)

    pid = _paper_id(index_path)
    result = CliRunner().invoke(cli, ["query", "--path", str(index_path), "--paper", pid, "--json",
                                      "--rescorer", "test_summax", "--param", "tau=2"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["rescorer"] == "test_summax"
    assert load_settings(None, env={}, rescorer="test_summax").rescorer == "test_summax"
    r = client.post("/query", json={"paper_id": pid, "rescorer": "test_summax", "rescorer_params": {"tau": 2}})
    assert r.status_code == 200, r.text
    assert r.json()["rescorer"] == "test_summax"
    schema = _fresh_schema(index_path)
    assert "test_summax" in schema["components"]["schemas"]["QueryRequest"]["properties"]["rescorer"]["enum"]
    assert "tau" in schema["components"]["schemas"]["RescorerParams"]["properties"]
    assert "test_summax" in generate.param_help()
    assert client.post("/query", json={"paper_id": pid, "rescorer": "no_such"}).status_code == 422


def _fresh_schema(index_path):
    from esqbe.server import ServeOptions, create_app

    return create_app(str(index_path), config=None, options=ServeOptions(host="127.0.0.1", warm=False)).openapi()


@pytest.mark.parametrize("config", [
    {},
    {"rescorer": "ot", "rescorer_params": {"tau": 0.5}, "candidate_facet": "soft", "facet_penalty": 0.3},
    {"fusion": "linear", "final_bm25_weight": 0.4, "bm25_text": "facet", "query_facet_threshold": 0.0,
     "abstract_weight": 0.2, "vector_centering": "top1", "encoder_mode": "independent", "labels": "predict"},
])
def test_command_line_parses_back_to_the_same_settings(config, monkeypatch):
    """`command_line(config)` run through click gives back the configuration's settings."""
    from esqbe.evaluation.evaluate import command_for

    full = {**Settings().to_dict(redact=False), "labels": "keep", **config}
    line = command_for(full)
    assert line == generate.command_line(full)
    got = {}

    def fake(data_dir, out, index_path, facets, as_json, config, **kw):
        got.update(generate.overrides_from_click(kw, "eval csfcube"), labels=facets)

    command = _command("eval csfcube")
    monkeypatch.setattr(command, "callback", fake)
    args = line.split()[3:]  # after `esqbe eval csfcube`
    result = CliRunner().invoke(cli, ["eval", "csfcube", *args], standalone_mode=False)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    settings = load_settings(None, env={}, **{k: v for k, v in got.items() if k != "labels"})
    for key, value in config.items():
        if key == "labels":
            assert got["labels"] == value
        else:
            assert getattr(settings, key) == value, key


def test_the_choice_tuples_are_declared_once():
    tuples = ['"keep", "predict", "none"', '"rrf", "linear", "bm25", "knn"', '"auto", "same", "all", "soft"',
              '"abstract", "facet"', '"none", "mean", "top1"', '"contextual", "independent"',
              '"embedded", "elasticsearch", "opensearch"', '"s2orc", "s2ag-abstracts"', '"summax", "ts", "ot"']
    sources = {p: p.read_text() for p in (REPO / "esqbe").rglob("*.py")}
    for t in tuples:
        where = [str(p.relative_to(REPO)) for p, text in sources.items() if t in text]
        assert len(where) <= 1, (t, where)
    assert not re.search(r"MAX_K\s*=", (REPO / "esqbe/server/models.py").read_text())


def test_the_settings_reference_is_generated():
    text = (REPO / "docs" / "settings.md").read_text()
    assert generate.TABLE_START in text and generate.YAML_START in text
    assert generate.with_reference(text) == text, "run: python -m esqbe.settings.generate --write docs/settings.md"
