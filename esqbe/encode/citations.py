"""Citation contexts for `esqbe train-encoder`: what citing authors say about a paper, read from the packed
CL-SciSumm ScisummNet material (`From-ScisummNet-2019.citances.tar.gz` beside `...Reference_XML.tar.gz`).

* the cited papers: title (sid 0) and abstract sentences (the `<ABSTRACT>` element) of each Reference_XML;
* the citing sentences (`<paper>/citing_sentences.json`, `clean_text`), each with the sentence ids the corpus's
  automatic annotation (`<paper>/annotation/<paper>.ann.txt`) points to (noisy; often not abstract sentences);
* co-citations: one citing sentence (same citing paper, same text) listed under two or more cited papers.

Malformed files raise `CitationDataError` naming the file."""
from __future__ import annotations

import json
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DataError


class CitationDataError(DataError):
    """A citation-context file is missing or malformed; the message names the file and why."""


@dataclass
class CitedPaper:
    paper_id: str
    title: str
    sentences: list[str]  # the abstract's sentences
    sids: list[str]  # their sentence ids in the Reference_XML


@dataclass
class CitingSentence:
    cited: str  # the cited paper's id
    citing: str  # the citing paper's id
    text: str
    span_sids: list[str] = field(default_factory=list)  # the automatic annotation's reference sentence ids


_S = re.compile(r'<S\b[^>]*?\bsid\s*=\s*"?(\d*)"?[^>]*>(.*?)</S>', re.S)
_ABSTRACT = re.compile(r"<ABSTRACT>(.*?)</ABSTRACT>", re.S | re.I)
_TAG = re.compile(r"<[^>]+>")


def _text(raw: str) -> str:
    import html

    return " ".join(html.unescape(_TAG.sub(" ", raw)).split())


def parse_reference_xml(paper_id: str, xml: str) -> CitedPaper | None:
    """Title and abstract sentences of one Reference_XML (read with a regex: several are not well-formed); None
    when it has no abstract."""
    title = ""
    for sid, body in _S.findall(xml):
        if sid == "0":
            title = _text(body)
            break
    m = _ABSTRACT.search(xml)
    if not m:
        return None
    pairs = [(sid, _text(body)) for sid, body in _S.findall(m.group(1))]
    pairs = [(sid, t) for sid, t in pairs if t]
    if not pairs:
        return None
    return CitedPaper(paper_id, title, [t for _, t in pairs], [sid for sid, _ in pairs])


def _members(path: Path):
    if not path.is_file():
        raise CitationDataError(f"{path}: missing")
    try:
        with tarfile.open(path, "r:gz") as tar:
            for member in tar:
                if member.isfile():
                    fp = tar.extractfile(member)
                    if fp is not None:
                        yield member.name, fp.read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise CitationDataError(f"{path}: cannot read as .tar.gz: {e}") from None


_OFFSETS = re.compile(r"Reference Offset:\s*\[([^\]]*)\]")
_CITANCE = re.compile(r"Citance Number:\s*(\d+)")


def read_citations(citances_tar: str | Path, reference_tar: str | Path | None = None,
                   exclude: set[str] | frozenset[str] = frozenset()) -> tuple[dict[str, CitedPaper], list[CitingSentence]]:
    """(cited papers with an abstract, their citing sentences) from the two packs; papers in `exclude` (e.g. the
    40 manually annotated CL-SciSumm training papers) and sentences of papers without an abstract are left out."""
    citances_tar = Path(citances_tar)
    reference_tar = Path(reference_tar) if reference_tar else citances_tar.with_name(
        citances_tar.name.replace("citances", "Reference_XML"))
    papers: dict[str, CitedPaper] = {}
    for name, data in _members(reference_tar):
        if name.endswith(".xml") and "/Reference_XML/" in name:
            pid = Path(name).stem
            if pid in exclude:
                continue
            paper = parse_reference_xml(pid, data.decode("utf-8", errors="replace"))
            if paper is not None:
                papers[pid] = paper
    spans: dict[tuple[str, int], list[str]] = {}
    sentences: dict[str, list[dict]] = {}
    for name, data in _members(citances_tar):
        parts = Path(name).parts
        if name.endswith("citing_sentences.json") and len(parts) >= 2:
            try:
                rows = json.loads(data.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise CitationDataError(f"{citances_tar}:{name}: not valid JSON: {e}") from None
            if not isinstance(rows, list):
                raise CitationDataError(f"{citances_tar}:{name}: expected a JSON list of citing sentences")
            sentences[parts[-2]] = rows
        elif name.endswith(".ann.txt"):
            pid = Path(name).name.split(".")[0]
            for line in data.decode("utf-8", errors="replace").splitlines():
                c, o = _CITANCE.search(line), _OFFSETS.search(line)
                if c and o:
                    spans[(pid, int(c.group(1)))] = [x.strip().strip("'\"") for x in o.group(1).split(",") if x.strip()]
    out = []
    for pid in sorted(sentences):
        if pid not in papers:
            continue
        for i, row in enumerate(sentences[pid]):
            if not isinstance(row, dict) or not str(row.get("clean_text") or "").strip():
                continue
            number = int(row.get("citance_No") or i + 1)
            out.append(CitingSentence(pid, str(row.get("citing_paper_id") or ""), " ".join(str(row["clean_text"]).split()),
                                      spans.get((pid, number), [])))
    return papers, out


def co_citations(sentences: list[CitingSentence]) -> list[tuple[str, list[str]]]:
    """(text, the cited papers) for each citing sentence (same citing paper, same text) that cites two or more."""
    groups: dict[tuple[str, str], list[str]] = {}
    for s in sentences:
        cited = groups.setdefault((s.citing, s.text), [])
        if s.cited not in cited:
            cited.append(s.cited)
    return [(text, cited) for (_citing, text), cited in groups.items() if len(cited) >= 2]


def annotated_papers(citances_tar: str | Path) -> set[str]:
    """The manually annotated CL-SciSumm training papers beside the pack (`From-Training-Set-2018/<paper>/`): they
    measure cited-text identification, so training leaves them (and citations of them) out."""
    root = Path(citances_tar).parent / "From-Training-Set-2018"
    return {p.name for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()
