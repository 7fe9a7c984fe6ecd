""" hostile text never drives the terminal. `query`, `show`, `list`, `search` and `stats` print
titles, venues, authors, sentences and metadata keys holding a window-title OSC, a screen clear, a disguised OSC 8
link and their 8-bit C1 forms; from the index and from a `--server`'s answer; and errors quoting them. Each
command runs as a real subprocess (`python -m cli`) on a real pty, and what reaches the terminal is read back:
no ESC, BEL, DEL or C1 control in it, and each payload visible in its escaped form."""
from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import termios
import time

import pytest

from esqbe.core.textsafe import printable, printable_tree

from .conftest import REPO, TERMINAL_PAYLOADS

#: what a terminal obeys, but the tab and the line feed (the pty's output processing is off: no \r added)
_OBEYED = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _on_pty(*args, timeout: float = 240) -> tuple[int, str]:
    """Run `python -m cli ARGS` with stdin, stdout and stderr on a new pty; (exit status, everything it wrote),
    as UTF-8 (a raw 8-bit C1 byte would not decode: the test fails)."""
    master, slave = os.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # bytes as written: no \n -> \r\n
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TERM": "xterm-256color", "COLUMNS": "200"}
    env.pop("ESQBE_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "cli", *map(str, args)], stdin=slave, stdout=slave, stderr=slave,
                            cwd=REPO, env=env, start_new_session=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every end of the pty's other side is closed
                    break
                if not data:
                    break
                out += data
        else:
            pytest.fail(f"esqbe {' '.join(map(str, args))} still running after {timeout}s")
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return proc.returncode, out.decode("utf-8")


def _assert_nothing_obeyed(text: str, *must_show: str) -> None:
    found = _OBEYED.search(text)
    assert found is None, f"{found.group()!r} reached the terminal at {found.start()}: {text[max(0, found.start() - 80):found.start() + 40]!r}"
    for shown in must_show:  # the hostile value was printed, as text
        assert shown in text, (shown, text[-2000:])


_ESCAPED = [printable(p) for p in TERMINAL_PAYLOADS]  # every payload, as a person reads it


_CASES = {  # command: (arguments after --path IX, what must show, escaped)
    # query: hostile titles, venues, authors (every hit), and the query paper's hostile sentence
    "query": (("query", "--no-server", "--paper", "paper-5", "--sentences", "0,1", "-k", "9"),
              (*_ESCAPED, "Ada " + _ESCAPED[1] + "Lovelace", "paper-0")),
    # show: the title, a sentence, metadata keys and values; paper-5 carries the OSC title, paper-3 the C1 forms
    "show-osc": (("show", "paper-5"), ("key" + _ESCAPED[0] + ": value " + _ESCAPED[0], "done", "external_ids")),
    "show-c1": (("show", "paper-3"), ("key" + _ESCAPED[3] + ": value " + _ESCAPED[3], "done", "external_ids")),
    # list: every title and the year that holds line breaks
    "list": (("list",), (*_ESCAPED, "2019\\r\\nER  - ")),
    # search: titles
    "search": (("search", "study", "of", "things"), _ESCAPED),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_hostile_index_text_is_shown_not_obeyed(hostile_index_dir, case):
    args, shown = _CASES[case]
    rc, text = _on_pty(args[0], "--path", hostile_index_dir, *args[1:])
    assert rc == 0, text
    _assert_nothing_obeyed(text, *shown)
    if case.startswith("show"):  # title, sentence, venue, an author, the key and its value, the doi
        assert text.count(shown[0].split(": value ")[1]) >= 6
    if case == "list":  # one line a paper
        assert len([line for line in text.split("\n") if line.startswith("paper-")]) == 10


def test_errors_quoting_hostile_text(hostile_index_dir):
    """An id given on the command line, the index's metadata keys listed for an unknown one: shown, not obeyed."""
    rc, text = _on_pty("show", "--path", hostile_index_dir, "nope" + TERMINAL_PAYLOADS[0])
    assert rc == 1 and "not in the index" in text, text
    _assert_nothing_obeyed(text, "nope")
    rc, text = _on_pty("query", "--path", hostile_index_dir, "--no-server", "--paper", "paper-0", "--filter", "nokey=1")
    assert rc in (1, 2) and "The index's keys" in text, text
    _assert_nothing_obeyed(text, *("key" + _ESCAPED[i] for i in (0, 1, 3, 4)))


def test_stats_of_an_index_with_a_hostile_path(hostile_index_dir, tmp_path):
    ix = tmp_path / ("ix" + TERMINAL_PAYLOADS[0] + TERMINAL_PAYLOADS[3])
    shutil.copytree(hostile_index_dir, ix)
    rc, text = _on_pty("stats", "--path", ix)
    assert rc == 0, text
    _assert_nothing_obeyed(text, "ix" + _ESCAPED[0] + _ESCAPED[3], "papers: 10")


def test_query_answered_by_a_server(hostile_server):
    """A server's answer is as hostile as an index: the same result printed, nothing obeyed."""
    rc, text = _on_pty("query", "--server", hostile_server, "--paper", "paper-5", "--sentences", "0,1", "-k", "9")
    assert rc == 0, text
    _assert_nothing_obeyed(text, *_ESCAPED, "answered by", "paper-0")


def test_json_output_escapes_c1_too(hostile_index_dir):
    """`--json` is still the same JSON, with no control character raw in it (json.dumps leaves C1 and DEL raw)."""
    rc, text = _on_pty("show", "--path", hostile_index_dir, "paper-3", "--json")
    assert rc == 0, text
    _assert_nothing_obeyed(text.replace("\n", ""))
    assert json.loads(text)["title"].endswith(TERMINAL_PAYLOADS[3] + " of things")


def test_printable():
    assert printable("a\tb\nc\r\x1b]0;t\x07\x9b2J\x7f") == "a\tb\\nc\\r\\x1b]0;t\\x07\\x9b2J\\x7f"
    assert printable("a\nb\x1b", newlines=True) == "a\nb\\x1b"
    assert printable("Müller — ok ✓") == "Müller — ok ✓"
    assert printable_tree({"k\x1b": ["v\n", 1, None, {"x": "\x9d"}]}) == {"k\\x1b": ["v\\n", 1, None, {"x": "\\x9d"}]}
