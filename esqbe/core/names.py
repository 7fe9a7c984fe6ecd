"""A person's name in its parts, as CSL-JSON names them, or an organisation's name whole: what every reader keeps of
an author, every writer writes back and a merge compares.

An author is stored as a dict: `name`, the name as people write it (`Johan de Vries`, `Hans von Ohain`, `Martin
King Jr.`); the parts its source gave, under CSL's keys (`PARTS`: `given`, `dropping-particle`,
`non-dropping-particle`, `family`, `suffix`; `FLAGS`: `comma-suffix`, `static-ordering`); `literal: true` for a
name that is no person's (an organisation: `name` is all of it); `id` where the source gives one. An author stored
without parts (a source that gives names whole, or an index written by an older esqbe) still reads: its parts are
told from its name by BibTeX's rules (`parts_of`: `First von Last`, `von Last, First`, `von Last, Jr, First`).
"""
from __future__ import annotations

#: the parts of a person's name, in the order they are shown (CSL-JSON's names for them)
PARTS = ("given", "dropping-particle", "non-dropping-particle", "family", "suffix")
#: CSL-JSON's flags of a name: a comma before the suffix (`King, Jr.`), the family name shown first (`Mao Zedong`)
FLAGS = ("comma-suffix", "static-ordering")


def is_particle(word: str) -> bool:
    """A word BibTeX takes for a particle (its `von` part): its first letter is lower case (`de`, `van`, `d'Alembert`)."""
    letter = next((c for c in word if c.isalpha()), "")
    return letter.islower()


def _text(value) -> str:
    return " ".join(value.split()) if isinstance(value, str) else ""


def shown(parts: dict) -> str:
    """A person's name as people write it: given, dropping particle, non-dropping particle, family, suffix (`Jean de La
    Fontaine`, `Martin King Jr.`; `Martin King, Jr.` with `comma-suffix`); family first with `static-ordering`."""
    given, family = _text(parts.get("given")), _text(parts.get("family"))
    particles = " ".join(p for p in (_text(parts.get("dropping-particle")),
                                     _text(parts.get("non-dropping-particle"))) if p)
    suffix = _text(parts.get("suffix"))
    if parts.get("static-ordering"):
        words = [particles, family, given]
    else:
        words = [given, particles, family]
    name = " ".join(w for w in words if w)
    if suffix:
        name = f"{name}, {suffix}" if parts.get("comma-suffix") and name else f"{name} {suffix}".strip()
    return name


def person(parts: dict, **extra) -> dict | None:
    """The stored author of a person's name parts (empty parts left out): `name` as people write it, the parts, then
    `extra` (an `id`); None where no part holds text."""
    kept: dict = {k: _text(parts[k]) for k in PARTS if _text(parts.get(k))}
    if not kept:
        return None
    kept.update({k: True for k in FLAGS if parts.get(k) is True})
    return {"name": shown(kept), **kept, **extra}


def split_particles(family: str, given: str) -> dict:
    """A family and a given name written as BibTeX, RIS and citeproc-js read them (`de Vries`, `Jean de`): the lower
    case words that begin the family name are its non-dropping particle, those that end the given name its dropping
    particle; a part made of such words only is left whole (`bell hooks` has no particle)."""
    fam, giv = family.split(), given.split()
    lead = next((i for i, w in enumerate(fam) if not is_particle(w)), len(fam))
    lead = lead if lead < len(fam) else 0
    tail = next((i for i in range(len(giv), 0, -1) if not is_particle(giv[i - 1])), 0)
    tail = tail if tail > 0 else len(giv)
    return {"given": " ".join(giv[:tail]), "dropping-particle": " ".join(giv[tail:]),
            "non-dropping-particle": " ".join(fam[:lead]), "family": " ".join(fam[lead:])}


def parts_of(author) -> dict | None:
    """The parts of a stored author (a dict as `person` makes, or a name as a string): the parts it carries, else
    told from its name by BibTeX's rules (bibtexparser's name splitter); None for an organisation (`literal`) or an
    author without a name."""
    if isinstance(author, str):
        author = {"name": author}
    if not isinstance(author, dict) or author.get("literal"):
        return None
    if any(_text(author.get(k)) for k in PARTS):
        return {k: author[k] for k in (*PARTS, *FLAGS) if author.get(k)}
    name = _text(author.get("name"))
    if not name:
        return None
    from bibtexparser.middlewares.names import parse_single_name_into_parts

    split = parse_single_name_into_parts(name, strict=False)
    first, von, last, jr = (" ".join(p) for p in (split.first, split.von, split.last, split.jr))
    if not last:
        return {"family": name}
    return {k: v for k, v in {**split_particles("", first), "non-dropping-particle": von, "family": last,
                              "suffix": jr}.items() if v}


def compared(author) -> tuple[str, ...]:
    """An author as merges compare two records' authors: an organisation by the words of its name; a person by the
    words of its given name, family name and suffix, in the order shown, particles left out wherever the source put
    them (`Johan de Vries`, `de Vries, Johan`, {"family": "Vries", "non-dropping-particle": "de"} and `Johan Vries`
    are one name: a particle is never a conflict)."""
    parts = parts_of(author)
    if parts is None:
        name = author.get("name") if isinstance(author, dict) else author
        return tuple(_text(name).split())
    bare = split_particles(_text(parts.get("family")), _text(parts.get("given")))
    kept = {"given": bare["given"], "family": bare["family"], "suffix": parts.get("suffix"),
            "static-ordering": parts.get("static-ordering")}
    return tuple(shown(kept).split())
