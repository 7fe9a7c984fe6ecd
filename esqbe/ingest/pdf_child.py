"""The process that reads PDFs' text for `esqbe.ingest.pdf`: one request a line on stdin (`{"path", "pages",
"max_bytes", "seconds"}`), one answer a line on stdout (`{"pages", "runs", "title"}` or `{"error"}`), until stdin
closes.

It runs as a script (`python pdf_child.py PARENT_PID`), importing nothing of esqbe, only pypdf, so that it starts
quickly, and under bounds of its own: memory (RLIMIT_AS), since a hostile PDF may ask for gigabytes; a clock per
file, since one may make pypdf work for hours (one form XObject drawn thousands of times): past a request's
`seconds` (`pdf_timeout`) SIGALRM ends the process whatever pypdf is doing (the parent, which keeps the same clock,
says so and starts another for the next PDF); and its parent's life: on Linux the kernel kills it when the parent
dies (PR_SET_PDEATHSIG; a parent already gone by then is seen by its pid), elsewhere a thread watches the parent's
pid, so that a killed `esqbe index` leaves no reader behind. The parent checks the file (a regular file, its size)
before it asks; the size is checked again here once the file is open.
"""
from __future__ import annotations

import json
import logging
import math
import os
import signal
import stat
import sys
import threading
import time

#: what the process may allocate (address space), bytes
MEMORY_BYTES = 2 * 1024 ** 3
#: characters of one page's text sent back (an abstract is on the first pages; more is not needed)
PAGE_CHARS = 1_000_000


def _limit_memory() -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    except (ImportError, ValueError, OSError):  # not on this system: the wall clock still bounds the work
        pass


def _die_with(parent: int) -> None:
    """This process ends when `parent` does: a parent-death signal (Linux), else a thread that watches its pid."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0:  # PR_SET_PDEATHSIG: SIGKILL when the parent exits
                if os.getppid() != parent:  # it died before the signal was asked for
                    os._exit(1)
                return
        except (OSError, AttributeError):  # no libc to ask: watched instead
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()


def read(path: str, pages: int, max_bytes: int) -> dict:
    """The text of the first `pages` pages, the first page's text runs with their font size, the PDF's own title."""
    import pypdf

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings on a broken file: the record's reason says it
    runs: list[tuple[float, str]] = []

    def visit(text, cm, tm, font_dict, font_size):
        if len(runs) < 400 and isinstance(font_size, (int, float)):
            scale = math.hypot(tm[0], tm[1]) * math.hypot(cm[0], cm[1])
            runs.append((round(float(font_size) * scale, 1), str(text)[:1000]))

    with open(path, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            return {"error": "missing"}
        if info.st_size > max_bytes:  # replaced since the parent looked at it
            return {"error": "too large"}
        try:
            reader = pypdf.PdfReader(f)
            if reader.is_encrypted:
                reader.decrypt("")  # many PDFs are "encrypted" with an empty password; others fail below
            texts = []
            for i in range(min(len(reader.pages), pages)):
                texts.append((reader.pages[i].extract_text(visitor_text=visit if i == 0 else None) or "")[:PAGE_CHARS])
            meta = reader.metadata
            title = meta.title if meta is not None and isinstance(meta.title, str) else ""
        except MemoryError:
            return {"error": "memory"}
        except Exception:  # noqa: BLE001  # pypdf raises many kinds on a broken or hostile file
            return {"error": "unparsable"}
    return {"pages": texts, "runs": runs, "title": title[:10_000]}


def main() -> None:
    if len(sys.argv) > 1:
        _die_with(int(sys.argv[1]))
    _limit_memory()
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the clock's end ends the process, even inside a C call
    for line in sys.stdin:
        try:
            request = json.loads(line)
            seconds = float(request.get("seconds") or 0)
            if seconds > 0:
                signal.setitimer(signal.ITIMER_REAL, seconds)
            answer = read(str(request["path"]), int(request["pages"]), int(request["max_bytes"]))
        except OSError:
            answer = {"error": "missing"}
        except MemoryError:
            answer = {"error": "memory"}
        except Exception:  # noqa: BLE001  # a request this process cannot answer: the record's reason says so
            answer = {"error": "unparsable"}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        sys.stdout.write(json.dumps(answer, ensure_ascii=True) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
