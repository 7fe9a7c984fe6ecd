"""The README's five-minute tour, run as written ("a new user can go from a BibTeX export to an exported
list of similar papers with the README alone"): its shell blocks, taken from README.md, run by bash in a fresh
directory holding a Zotero-shaped `my-library.bib`, with `esqbe` the real CLI and the real model."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import bibtexparser
import rispy

from .conftest import REPO, SAMPLE

TOUR = "### Five minutes: from your BibTeX file to similar papers, exported"


def tour_blocks() -> list[str]:
    """The ```bash blocks of the README's tour section."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = re.split(r"\n##+ ", readme.split(TOUR, 1)[1], maxsplit=1)[0]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.S)


def my_library() -> str:
    """A library export: the sample abstracts as hand-written BibTeX entries (math, accent macros, a tie, a dash,
    protected capitals; names with a particle and a suffix, an organisation braced), then the Zotero export of
    tests/data/library (Attention Is All You Need, an entry without abstract, a broken one)."""
    entries = []
    for i, line in enumerate(SAMPLE.read_text().splitlines()[:24]):
        r = json.loads(line)
        abstract = " ".join(r["sentences"]).replace("{", "(").replace("}", ")")
        title = " ".join(r["sentences"][0].split()[:8]).replace("{", "(").replace("}", ")")
        entries.append(f"@Article{{paper{i},\n  title = {{{title} for the {{ACM}}}},\n"
                       "  author = {Doe, Jane and de Vries, Johan and King, Jr., Martin and {Some Lab}},\n"
                       f"  year = {{{2000 + i}}},\n  journal = {{Journal {i % 3}}},\n  pages = {{1--10}},\n"
                       "  note = {Grown to 5~$\\mu$m by {\\L}ukasz \\& Caf{\\'e} {Mie}},\n"
                       f"  abstract = {{{abstract}}}\n}}\n")
    return "\n".join(entries) + "\n" + (REPO / "tests" / "data" / "library" / "zotero.bib").read_text()


def test_the_readme_tour_runs_as_written(tmp_path):
    blocks = tour_blocks()
    assert len(blocks) == 2 and "my-library.bib" in blocks[0] and "--text" in blocks[1]
    (tmp_path / "my-library.bib").write_text(my_library())
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    for var in ("ESQBE_CONFIG", "ESQBE_INDEX_PATH", "ESQBE_BACKEND"):
        env.pop(var, None)
    script = f'set -e\nesqbe() {{ "{sys.executable}" -m cli "$@"; }}\n' + "\n".join(blocks)
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "Traceback" not in done.stderr
    assert "read 27, indexed 25" in out and "skipped 1" in out and "errors 1" in out  # as the tour says
    assert re.search(r"^\s+1\.\s+[\d.]+\s+vaswani2017attention\s+Attention Is All You Need", out, flags=re.M), out
    # `esqbe show`: numbered sentences, each with the tagger's label and its probability (which label a 3-sentence
    # sample gets is the tagger's call: the shipped tagger says background 0.54 for this one, the one before method;
    # `--facet method` then queries by the sentence most likely method, search.select_query_sentences)
    assert re.search(r"\[1\] (background|method|result|other) 0\.\d\d: We propose a new simple network architecture", out), out
    bib = bibtexparser.parse_string((tmp_path / "like-its-method.bib").read_text())
    assert not bib.failed_blocks and len(bib.entries) == 10
    assert all(e.key.startswith("paper") for e in bib.entries)
    assert "{Some Lab}" in (tmp_path / "like-its-method.bib").read_text()  # an organisation stays one name
    # each find goes back as it was written: its entry type, key and every field, byte for byte
    written = {e.key: e for e in bibtexparser.parse_string(my_library(), parse_stack=[]).entries}
    for entry in bibtexparser.parse_string((tmp_path / "like-its-method.bib").read_text(), parse_stack=[]).entries:
        assert entry.raw.split("{", 1)[0] == "@Article"
        assert [(f.key, " ".join(f.value.split())) for f in entry.fields] == [
            (f.key, " ".join(f.value.split())) for f in written[entry.key].fields]
    # the finds go back whole: CSL-JSON for Zotero, and the BibTeX export indexed again as the same papers
    items = json.loads((tmp_path / "like-its-method.json").read_text())
    assert [i["id"] for i in items] == [e.key for e in bib.entries] and all(i.get("abstract") for i in items)
    assert "read 10, indexed 10, replaced 0, unchanged 0, skipped 0 (none), errors 0" in out
    assert re.search(r"^  skipped my-library\.bib:\d+: mueller2019 .*: no abstract$", out, flags=re.M), out
    ris = rispy.loads((tmp_path / "like-this.ris").read_text())
    assert len(ris) == 10 and all(r["authors"] == ["Doe, Jane", "de Vries, Johan", "King, Martin, Jr.", "Some Lab"]
                                  or r["id"] == "vaswani2017attention" for r in ris)


ZOTERO_TOUR = "### From your Zotero library to finds imported back into it"


def zotero_tour_blocks() -> list[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = re.split(r"\n##+ ", readme.split(ZOTERO_TOUR, 1)[1], maxsplit=1)[0]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.S)


def openalex_works(n: int) -> str:
    """`openalex-works.jsonl`: n of the sample's abstracts as OpenAlex works (title, DOI, venue, authors, the abstract
    as OpenAlex gives it: an inverted index), the papers the tour searches beside the library."""
    lines = []
    for i, line in enumerate(SAMPLE.read_text().splitlines()[:n]):
        r = json.loads(line)
        words = " ".join(r["sentences"]).split()
        inverted: dict[str, list[int]] = {}
        for pos, word in enumerate(words):
            inverted.setdefault(word, []).append(pos)
        lines.append(json.dumps({
            "id": f"https://openalex.org/W{4000000 + i}", "doi": f"https://doi.org/10.5555/esqbe.tour.{i}",
            "title": " ".join(words[:9]), "publication_year": 2010 + i % 12,
            "primary_location": {"source": {"display_name": f"Journal {i % 3}", "type": "journal"}},
            "authorships": [{"author": {"display_name": "Jane Doe"}}, {"author": {"display_name": "Carmen García-Mateo"}}],
            "abstract_inverted_index": inverted}))
    return "\n".join(lines) + "\n"


def zotero_library(path):
    """~/Zotero/zotero.sqlite, made with Zotero's own schema SQL (tests/test_zotero.py), holding the paper the tour
    queries by (item key 7XQ2M4KD) and BERT, in a collection."""
    from .test_zotero import ATTENTION, BERT, Library

    lib = Library(path)
    attention = lib.item("conferencePaper", "7XQ2M4KD", {
        "title": ATTENTION[0], "abstractNote": ATTENTION[1], "date": "2017",
        "proceedingsTitle": "Advances in Neural Information Processing Systems", "DOI": "10.48550/arXiv.1706.03762"},
        [("Ashish", "Vaswani", 0, "author"), ("Noam", "Shazeer", 0, "author")])
    bert = lib.item("conferencePaper", "BQ3N5ZT8", {"title": BERT[0], "abstractNote": BERT[1], "date": "2019"},
                    [("Jacob", "Devlin", 0, "author")])
    lib.collection("Thesis", "TH7SQ2XK", [attention, bert])
    return lib.close()


def test_the_zotero_tour_runs_as_written(tmp_path):
    """The README's Zotero tour, its commands run as written by bash (`~` a home holding
    ~/Zotero/zotero.sqlite), the real CLI and model: the library and OpenAlex works indexed, the query by the
    library's paper keeps to papers not in the library, its CSL-JSON export (what Zotero imports) is indexed again
    and `esqbe list` shows the same papers, ids and titles as the query found."""
    [block] = zotero_tour_blocks()
    assert "~/Zotero/zotero.sqlite" in block and "--format csl-json > finds.json" in block
    home = tmp_path / "home"
    (home / "Zotero").mkdir(parents=True)
    zotero_library(home / "Zotero" / "zotero.sqlite")
    (tmp_path / "openalex-works.jsonl").write_text(openalex_works(30))
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HOME": str(home),
           # the model's ONNX export is cached where the user running the tests keeps it, not in the new home
           "ESQBE_CACHE_DIR": os.environ.get("ESQBE_CACHE_DIR") or os.path.join(
               os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "esqbe")}
    for var in ("ESQBE_CONFIG", "ESQBE_INDEX_PATH", "ESQBE_BACKEND"):
        env.pop(var, None)
    script = f'set -e\nesqbe() {{ "{sys.executable}" -m cli "$@"; }}\n' + block
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    out = done.stdout
    assert "read 32, indexed 32, replaced 0, unchanged 0, skipped 0 (none), errors 0" in out
    assert re.search(r"^\s+1\.\s+[\d.]+\s+7XQ2M4KD\s+Attention Is All You Need", out, flags=re.M), out
    finds = json.loads((tmp_path / "finds.json").read_text())
    assert len(finds) == 10  # the query's k
    assert all(f["id"].startswith("W") for f in finds)  # `in_library!=true`: none of the library's own papers
    assert all(f.get("abstract") and f.get("DOI", "").startswith("10.5555/esqbe.tour.") for f in finds)
    assert all(f["author"][1] == {"family": "García-Mateo", "given": "Carmen"} for f in finds), finds[0]["author"]
    # the proof: the export read again is the same papers, by id and title, nothing skipped
    assert "read 10, indexed 10, replaced 0, unchanged 0, skipped 0 (none), errors 0" in out
    listed = {m["id"]: m["title"] for m in re.finditer(r"^(?P<id>W\d+)\t\d{4}\t(?P<title>.*)$", out, flags=re.M)}
    assert listed == {f["id"]: f["title"] for f in finds}, out
    assert "10 paper(s)" in done.stderr + out
