"""The files added to or changed in a followed folder (`esqbe follow add NAME dir:PATH`).

A file is known by its size and modification time (nanoseconds): a file whose pair differs from the one kept at its
last read is read again, whole, as `esqbe index` reads it (every format esqbe reads: JSON Lines, BibTeX, RIS,
CSL-JSON, a Zotero database, gzip of any of them); a PDF on its own is one paper, its title and abstract read from its
first pages as a library record's attached PDF is (esqbe.ingest.pdf). Sub-folders are walked; hidden names (`.x`),
links and files of other kinds are passed over (counted). A file gone since its last read is named, with the ids it
gave then, so that its papers can be reported and, where the settings say so, removed.
"""
from __future__ import annotations

import os
from pathlib import Path

#: the file names a followed folder's run reads (a `.gz` of any of these too)
READ_SUFFIXES = (".jsonl", ".ndjson", ".json", ".bib", ".bibtex", ".ris", ".sqlite", ".pdf")
#: files one look at a folder takes at most (more: an error naming the folder, nothing read)
MAX_FILES = 100_000
#: the ids kept per file (for reporting and removing its papers once the file is gone); past it none are kept
MAX_IDS_PER_FILE = 10_000


class FolderError(OSError):
    """The folder cannot be looked at (gone, not a folder, too many files)."""


def readable(name: str) -> bool:
    """Whether a file of this name is one a followed folder's run reads."""
    name = name.lower()
    return name.removesuffix(".gz").endswith(READ_SUFFIXES)


def scan(folder: str | os.PathLike) -> tuple[dict[str, list[int]], int]:
    """({path relative to the folder: [size, mtime_ns]} of every file it reads, how many others were passed over),
    walking sub-folders without following links; FolderError where it cannot."""
    root = Path(folder)
    if not root.is_dir():
        raise FolderError(f"{root}: not a folder (or gone)")
    found: dict[str, list[int]] = {}
    passed = 0
    stack = [root]
    while stack:
        here = stack.pop()
        try:
            entries = list(os.scandir(here))
        except OSError as e:
            raise FolderError(f"{here}: cannot be listed: {e.strerror or e}") from None
        for entry in entries:
            if entry.name.startswith(".") or entry.is_symlink():
                passed += 1
                continue
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False) and readable(entry.name):
                info = entry.stat(follow_symlinks=False)
                found[Path(entry.path).relative_to(root).as_posix()] = [int(info.st_size), int(info.st_mtime_ns)]
                if len(found) > MAX_FILES:
                    raise FolderError(f"{root}: over {MAX_FILES:,} files to read; follow a smaller folder")
            else:
                passed += 1
    return dict(sorted(found.items())), passed


def changes(seen: dict[str, list[int]], known: dict[str, dict], since_ns: int | None = None) -> tuple[list[str], list[str]]:
    """(the files to read: new, or changed since their last read; the files gone), from a `scan` and the state's
    `files` ({path: {"sig": [size, mtime_ns], "ids": [...]}}). `since_ns`: a first run's --since, files last changed
    before it are not read (and not read later unless they change)."""
    fresh = [p for p, sig in seen.items() if (known.get(p) or {}).get("sig") != sig
             and (since_ns is None or p in known or sig[1] >= since_ns)]
    gone = [p for p in known if p not in seen]
    return fresh, gone
