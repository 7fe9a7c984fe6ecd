"""The README and docs/*.md say only what the code does (in datasette's style: the docs are checked against
the code, so a renamed flag, setting, endpoint, variable or module fails here instead of misleading a reader).

- every `esqbe <command> --flag` in a code block, and in an inline `esqbe ...` span, is a real command and
  option of that command; every `--flag` in an inline span is an option of some esqbe command;
- the YAML keys of docs/settings.md's block are exactly the fields of `Settings`, with their defaults;
- the endpoints of docs/serving.md's table (and the page, /docs, /openapi.json it names) are exactly the
  app's routes;
- each ESQBE_* variable the docs name is read by the code;
- the Python snippets of the README and docs/ compile and their imports (and `esqbe.X` attributes) resolve;
- each `esqbe.module.name` and `esqbe/path` the docs name exists;
- every relative link of the README and docs/ reaches a file, and its #anchor a heading there;
- the README is an entry (at most `README_MAX_LINES` lines), docs/README.md lists every page of docs/, and the
  README's figures are docs/results.md's.
"""
import ast
import dataclasses
import importlib
import re
import shlex
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
SETTINGS_PAGE = ROOT / "docs" / "settings.md"
SERVING_PAGE = ROOT / "docs" / "serving.md"
RESULTS = ROOT / "docs" / "results.md"
README_MAX_LINES = 300
# pages that name the flags of scripts/ and benchmarks/ beside esqbe's own
LAB_PAGES = {"docs/results.md", "docs/performance.md", "docs/tagger.md"}

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def code_blocks(path: Path, langs=("", "bash", "sh", "shell", "console")) -> list[tuple[str, str]]:
    """(language, text) of each fenced block whose language is one of `langs` (None: any)."""
    return [(m[1], m[2]) for m in FENCE.finditer(path.read_text()) if langs is None or m[1] in langs]


def prose(path: Path) -> str:
    return FENCE.sub("", path.read_text())


def inline_spans(path: Path) -> list[str]:
    return INLINE.findall(prose(path))


# --- the command line ---------------------------------------------------------------------------------------

def _commands() -> dict[str, click.Command]:
    from cli import main

    out: dict[str, click.Command] = {}

    def walk(group: click.Group, prefix: str) -> None:
        for name, cmd in group.commands.items():
            out[prefix + name] = cmd
            if isinstance(cmd, click.Group):
                walk(cmd, prefix + name + " ")

    walk(main, "")
    return out


def _options(cmd: click.Command) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")} | {"--help"}


def _invocations(text: str) -> list[list[str]]:
    """The argument lists after each `esqbe` (or `.venv/bin/esqbe`) in shell text: line continuations
    joined, comments dropped, split at ; && || | and $( )."""
    text = text.replace("\\\n", " ")
    calls = []
    for line in text.splitlines():
        try:
            lex = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
            lex.whitespace_split = True
            lex.commenters = "#"
            tokens = list(lex)
        except ValueError:  # an unbalanced quote in a sketch: not a command line
            continue
        current: list[str] | None = None
        for tok in tokens:
            if tok and set(tok) <= set(";&|()$"):
                if current is not None:
                    calls.append(current)
                current = None
            elif current is not None and (current or tok != "esqbe"):
                current.append(tok)
            elif tok == "esqbe" or tok.endswith("/esqbe"):
                current = []  # (`compose exec esqbe esqbe index ...`: the service, then the command)
        if current is not None:
            calls.append(current)
    return calls


def _all_invocations() -> list[tuple[str, list[str]]]:
    found = []
    for path in DOCS:
        for _, block in code_blocks(path):
            found += [(_rel(path), args) for args in _invocations(block)]
        for span in inline_spans(path):
            if span.startswith("esqbe ") and not span.startswith("esqbe."):
                found += [(_rel(path), args) for args in _invocations(span)]
    return found


def test_the_docs_show_the_cli_at_all():
    calls = _all_invocations()
    assert len(calls) > 40, calls
    assert {args[0] for _, args in calls if args} >= {"index", "query", "serve", "eval", "cite", "attach", "encode"}


def test_every_documented_command_and_flag_exists():
    commands = _commands()
    bad = []
    for where, args in _all_invocations():
        words = [a for a in args if not a.startswith("-")]
        if not args or args[0] in ("COMMAND",) or args[0].startswith("-"):
            continue  # `esqbe COMMAND --help`, `esqbe --help`
        name = args[0]
        if name not in commands:
            bad.append(f"{where}: no command `esqbe {name}` ({' '.join(args)})")
            continue
        if isinstance(commands[name], click.Group) and len(words) > 1:
            name = f"{name} {words[1]}"
            if name not in commands:
                bad.append(f"{where}: no command `esqbe {name}`")
                continue
        options = _options(commands[name])
        for arg in args:
            flag = arg.split("=", 1)[0]
            if flag.startswith("-") and flag not in options and not re.fullmatch(r"-\d.*", flag):
                bad.append(f"{where}: `esqbe {name}` has no option {flag}")
    assert not bad, "\n".join(bad)


# flags in inline spans of the docs that belong to other tools
OTHER_TOOLS_FLAGS = {"--fix", "--statistics", "--build", "--wait", "--data-binary", "--no-deps"}


def test_every_inline_flag_in_the_docs_is_an_option_of_some_command():
    known = set().union(*(_options(c) for c in _commands().values()))
    bad = []
    for path in [p for p in DOCS if _rel(p) not in LAB_PAGES]:
        for span in inline_spans(path):
            if re.search(r"\.py\b|^python|^pytest|^curl|^docker|^pip", span):
                continue
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", span):
                if flag not in known and flag not in OTHER_TOOLS_FLAGS:
                    bad.append(f"{_rel(path)}: `{span}`: no esqbe command has {flag}")
    assert not bad, "\n".join(bad)


# --- settings ---------------------------------------------------------------------------------------------

def _settings_block() -> str:
    blocks = [b for lang, b in code_blocks_of(SETTINGS_PAGE.read_text()) if lang == "yaml"]
    assert blocks, "docs/settings.md has no ```yaml block"
    return blocks[0]


def code_blocks_of(text: str) -> list[tuple[str, str]]:
    return [(m[1], m[2]) for m in FENCE.finditer(text)]


def test_the_settings_block_lists_exactly_the_settings_fields():
    import yaml

    from esqbe.settings.config import Settings

    documented = yaml.safe_load(_settings_block())
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    assert not set(documented) - set(fields), f"docs/settings.md keys that are no Settings field: {set(documented) - set(fields)}"
    missing = set(fields) - set(documented)
    assert not missing, f"Settings fields missing from docs/settings.md's block: {sorted(missing)}"


def test_the_settings_block_shows_the_defaults():
    import yaml

    from esqbe.settings.config import Settings

    documented = yaml.safe_load(_settings_block())
    defaults = Settings()
    wrong = {k: (v, getattr(defaults, k)) for k, v in documented.items() if v != getattr(defaults, k)}
    assert not wrong, f"docs/settings.md default != Settings default: {wrong}"


# --- serving ----------------------------------------------------------------------------------------------

def _path_shape(path: str) -> str:
    """`/papers/{id}` and `/papers/{paper_id:path}` are the same route."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def _documented_endpoints() -> set[tuple[str, str]]:
    text = SERVING_PAGE.read_text()
    section = text[text.index("## The page"):text.index("## Who can do what")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows, "docs/serving.md has no endpoint table"
    found = set()
    for row in rows:
        for method, path in re.findall(r"`(GET|POST|PUT|DELETE|PATCH) (/[^`?\s]*)", row.split("|")[1]):
            found.add((method, _path_shape(path)))
    # the page and the API's own docs, named in the text above the table
    for path in re.findall(r"\(the page is `(/[^`]*)`\)|at `(/[^`]*)`", section):
        for p in path:
            if p:
                found.add(("GET", p))
    return found


def _app_routes() -> set[tuple[str, str]]:
    from starlette.routing import Route

    from esqbe.server import ServeOptions, create_app

    app = create_app(path=str(ROOT / "no-such-index"), options=ServeOptions(host="127.0.0.1"))
    routes = set()

    def walk(found, prefix: str) -> None:
        for route in found:
            if isinstance(route, Route):
                routes.update((method, _path_shape(prefix + route.path)) for method in route.methods or ()
                              if method != "HEAD")
            elif hasattr(route, "original_router"):  # an included router (FastAPI keeps it apart)
                walk(route.original_router.routes, prefix + getattr(route.include_context, "prefix", ""))

    walk(app.routes, "")
    return routes


# FastAPI's own pages beside /docs and /openapi.json: not esqbe's API
FRAMEWORK_ROUTES = {("GET", "/docs/oauth2-redirect"), ("GET", "/redoc")}


def test_the_documented_endpoints_are_the_apps_routes():
    documented = _documented_endpoints()
    routes = _app_routes() - FRAMEWORK_ROUTES
    assert ("POST", "/query") in documented and ("GET", "/") in documented
    assert not documented - routes, f"docs/serving.md endpoints the app does not have: {sorted(documented - routes)}"
    assert not routes - documented, f"routes docs/serving.md does not list: {sorted(routes - documented)}"


# --- environment variables --------------------------------------------------------------------------------

def test_every_documented_variable_is_read_by_the_code():
    named = set()
    for path in DOCS:
        named |= set(re.findall(r"\bESQBE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    assert "ESQBE_TOKEN" in named
    code = "\n".join(p.read_text() for p in [ROOT / "cli.py", *(ROOT / "esqbe").rglob("*.py")])
    # the test suite's own variables (docs/testing.md, docs/engines.md) are read by tests/
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    unread = sorted(v for v in named if not re.search(rf"\b{v}\b", code) and not re.search(rf"\b{v}\b", tests))
    assert not unread, f"variables the docs name that nothing reads: {unread}"


# --- Python snippets --------------------------------------------------------------------------------------

def _python_snippets() -> list[tuple[str, str]]:
    return [(_rel(path), b) for path in DOCS for lang, b in code_blocks(path, langs=("python",))]


def test_the_docs_have_the_python_snippets():
    snippets = [s for _, s in _python_snippets()]
    assert any("esqbe.open_index" in s for s in snippets)
    assert any("from esqbe.server import" in s for s in snippets)
    assert any("esqbe.open_index" in s for where, s in _python_snippets() if where == "README.md")


@pytest.mark.parametrize("n", range(len(_python_snippets())))
def test_python_snippet_compiles_and_its_imports_resolve(n):
    import esqbe

    where, source = _python_snippets()[n]
    tree = ast.parse(source)
    compile(tree, f"{where} python block", "exec")
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            bad += [f"{node.module} has no {a.name}" for a in node.names if not hasattr(module, a.name)]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "esqbe":
            if not hasattr(esqbe, node.attr):
                bad.append(f"esqbe has no {node.attr}")
    assert not bad, bad


# --- modules, names and paths the docs point at -----------------------------------------------------------

def _is_python_reference(dotted: str) -> bool:
    """`esqbe.core.filters.to_query_dsl` is; `esqbe.source_hash` (a field of an engine document) is not."""
    head = dotted.split(".")[1]
    package = ROOT / "esqbe"
    return (package / head).is_dir() or (package / f"{head}.py").is_file() or head in ("open_index", "encoder_only",
                                                                                          "open_backend", "Index")


def _resolve(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_named_module_and_path_exists():
    bad = []
    for path in DOCS:
        for span in inline_spans(path) + [b for _, b in code_blocks(path, langs=None)]:
            for dotted in re.findall(r"(?<![\w./-])esqbe(?:\.[A-Za-z_]\w*)+", span):
                if _is_python_reference(dotted) and not _resolve(dotted):
                    bad.append(f"{_rel(path)}: {dotted} does not resolve")
        for span in inline_spans(path):
            if re.fullmatch(r"esqbe/[\w./-]+", span) and not (ROOT / span).exists():
                bad.append(f"{_rel(path)}: {span} does not exist")
    assert not bad, "\n".join(bad)


# --- the map of the house ---------------------------------------------------------------------------------

def test_architecture_map_lists_every_module_and_only_real_ones():
    blocks = [b for lang, b in code_blocks(ROOT / "docs" / "architecture.md", langs=("text",))]
    assert blocks, "docs/architecture.md has no ```text tree"
    mapped = set(re.findall(r"^\s*((?:esqbe/)?[\w/]+\.py)\s", blocks[0], re.M))
    real = {p.relative_to(ROOT).as_posix() for p in (ROOT / "esqbe").rglob("*.py")
            if p.name != "__init__.py"} | {"esqbe/__init__.py", "cli.py"}
    assert not real - mapped, f"modules missing from docs/architecture.md's tree: {sorted(real - mapped)}"
    assert not mapped - real, f"docs/architecture.md's tree names modules that do not exist: {sorted(mapped - real)}"


# --- links ------------------------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """The #anchors GitHub makes of a page's headings: lower case, punctuation but `-` and `_` dropped, spaces
    to `-`, a repeated one numbered (`-1`, `-2`)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", path.read_text()), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_relative_link_reaches_its_file_and_heading():
    bad = []
    for path in DOCS:
        for groups in LINK.findall(prose(path)):
            target = groups[0] or groups[1]
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not ours to check here
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                bad.append(f"{_rel(path)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{_rel(path)}: {target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, "\n".join(bad)


def test_the_anchor_rule_is_githubs():
    """(the rule the link check relies on, on headings shaped like this guide's)"""
    page = ROOT / "docs" / "serving.md"
    assert "a-warm-model-for---text-queries" in _anchors(page)
    assert "inside-an-existing-fastapi-or-starlette-app" in _anchors(page)


# --- the shape of the guide -------------------------------------------------------------------------------

def test_the_readme_is_an_entry():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}: move detail to docs/"


def test_the_guide_index_lists_every_page():
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / target).resolve() for target, _ in LINK.findall(prose(index)) if target.endswith(".md")}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    assert not pages - linked, f"pages docs/README.md does not list: {sorted(p.name for p in pages - linked)}"


def test_the_readme_test_command_is_cis():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    command = ci.split(" && ", 1)[1] if ci.startswith("cd ") else ci
    assert command in README.read_text(), "the README's test command is not .ci/run's"
    assert command in (ROOT / "docs" / "testing.md").read_text(), "docs/testing.md's test command is not .ci/run's"


def test_the_readmes_figures_are_the_results_pages():
    """Every figure of the README's Quality section (a number with two decimals: NDCG%20) is one docs/results.md
    states."""
    results = RESULTS.read_text()
    text = prose(README)
    quality = text[text.index("## Quality"):].split("\n## ", 1)[0]
    figures = re.findall(r"(?<![\d.])\d+\.\d\d(?![\d.])", quality)
    assert len(figures) >= 4, figures
    missing = [f for f in figures if not re.search(rf"(?<![\d.]){re.escape(f)}(?![\d.])", results)]
    assert not missing, f"README figures docs/results.md does not state: {missing}"


# --- the product speaks of itself -------------------------------------------------------------------------

# how the product was made, which its docs, help, configs and comments never say: a work session or a tracker's
# issue by number, the team's notes or their machines' paths
HOW_IT_WAS_MADE = re.compile(r"\b(?:sessions? \d+|issues? #?\d+|lead's notes|(?:this|last|next|that) session\b"
                             r"|the lead\b|the team\b)|/work/", re.I)
SPEAKING = ["README.md", "cli.py", "Dockerfile", "docs", "configs", "esqbe", "tests", "benchmarks", "scripts", "docker",
            "mappings", ".ci"]
SPEAKING_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".sh", ".c", ".js", ".html", ".css", ".cfg", ".toml", ""}


def _speaking_files() -> list[Path]:
    files = []
    for name in SPEAKING:
        top = ROOT / name
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        files += [p for p in paths if p.suffix in SPEAKING_SUFFIXES and "data" not in p.relative_to(ROOT).parts[1:2]
                  and "__pycache__" not in p.parts and p != Path(__file__).resolve()]
    return files


def test_nothing_says_how_it_was_made():
    """README, docs/, configs, help texts and every comment and docstring describe esqbe and its figures (machine
    class, command, date), never how it was made."""
    files = _speaking_files()
    assert {_rel(p) for p in files} >= {"README.md", "docs/results.md", "configs/quality.yaml", "esqbe/cli/main.py"}
    bad = [f"{_rel(p)}:{n}: {m.group(0)!r}: {line.strip()[:100]}"
           for p in files for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
           for m in [HOW_IT_WAS_MADE.search(line)] if m]
    assert not bad, "say what esqbe does, not how it was made:\n" + "\n".join(bad)


def test_the_rule_of_how_it_was_made_catches_the_usual_words():
    caught = ["(issue 22)", "Session 19: the default", "issues 36 and 37", "see the lead's notes", "/work/notes/x.py",
              "measured this session", "as the lead ran it"]
    kept = ["sessionStorage", "an ONNX Runtime session", "a test session's fixtures", "k-NN #2222", "issue a warning"]
    assert all(HOW_IT_WAS_MADE.search(s) for s in caught)
    assert not any(HOW_IT_WAS_MADE.search(s) for s in kept)


# --- the lab ----------------------------------------------------------------------------------------------

def test_every_benchmark_and_script_is_named_in_the_docs():
    """benchmarks/ and scripts/ hold only what reproduces a figure the docs state (named beside it) or what the
    product and its CI use; benchmarks/README.md says how to run them."""
    docs = "\n".join(p.read_text() for p in DOCS)
    lab = sorted(p for d in ("benchmarks", "scripts") for p in (ROOT / d).iterdir()
                 if p.is_file() and p.name != "README.md")
    assert len(lab) > 10
    unnamed = [_rel(p) for p in lab if _rel(p) not in docs and f"{p.parent.name}/{p.name}" not in docs
               and not re.search(rf"(?<![\w/-]){re.escape(p.name)}(?![\w-])", docs)]
    assert not unnamed, f"name each beside the figure it reproduces (docs/), or remove it: {unnamed}"
    lab_readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert not [_rel(p) for p in lab if _rel(p) not in lab_readme], "benchmarks/README.md lists every script"


#: what a score was once said to be, before it became a function of the query and the paper alone
OLD_SCORE_WORDS = ("scaled over this query's candidates", "only meaningful within one query", "this query's rank score",
                   "where its similarity stands", "where a hit's similarity stands")


def test_one_statement_of_what_a_score_is_everywhere():
    """The docs, the code's docstrings and comments, and the page say one thing of a hit's score: the query and the
    paper alone decide it (esqbe.query.combine computes it so); the bands place the score, not the similarity."""
    places = [*DOCS, *(ROOT / "esqbe").rglob("*.py"), *(ROOT / "esqbe" / "server" / "static").glob("*.js")]
    said = [f"{_rel(p)}: {w!r}" for p in places if p.name != "results.md" and p.name != "performance.md"
            for w in OLD_SCORE_WORDS if w in " ".join(p.read_text().lower().split())]
    assert not said, said
    from esqbe.query.results import Hit, ScoreFormula

    for text in (ScoreFormula.__doc__, Hit.__doc__, (ROOT / "docs" / "querying.md").read_text()):
        assert "the query and th" in " ".join(str(text).split()) and "alone" in str(text)
