"""Progress of long work (indexing) on stderr: a bar on a terminal, periodic lines otherwise.

On a terminal it is a tqdm bar over the input's bytes when their total is known (files), with
the papers done, papers/s and the time left beside it (esqbe's own: at the rate since the first batch, once a few
have come; tqdm's own rate counts the model's warm-up and once said 17 minutes for a 17 s run, in kB/s);
when stderr is a file or a pipe (a log, a CI job) it prints one line
every `interval` seconds ($ESQBE_PROGRESS_SECONDS, default 10) and a last line when done, so a long run shows that it is alive.
Updates arrive per encoder batch, not per committed batch.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

#: the time left is estimated only after this many updates (encoder batches) past the first, at the rate since the
#: first: the first carries the start (the model's warm-up, the reader's read-ahead), and an 18 s run once began by
#: saying "about 5m34s left"
ESTIMATE_AFTER = 3


class Progress:
    """Papers done, and input bytes consumed out of `total_bytes` (None: unknown, e.g. stdin)."""

    def __init__(self, *, total_bytes: int | None = None, stream: TextIO | None = None, interval: float | None = None,
                 tty: bool | None = None, desc: str = "indexing"):
        if interval is None:  # seconds between progress lines off a terminal ($ESQBE_PROGRESS_SECONDS, default 10)
            interval = float(os.environ.get("ESQBE_PROGRESS_SECONDS") or 10)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.total_bytes = total_bytes or None
        self.interval = interval
        self.desc = desc
        self.papers = 0
        self.committed: int | None = None  # papers written to the index for good so far (None: not told)
        self.position: Callable[[], int] | None = None  # bytes of input consumed so far
        self._start = self._last = time.monotonic()
        self._lines = 0
        self._updates = 0  # update() calls that reported papers
        self._first: tuple[float, int] | None = None  # (time, bytes consumed) at the first of them
        self._first_papers = 0  # papers done by the first of them (its own batch included: the warm-up)
        self._bar = None
        self._lock = threading.Lock()  # the encoder's thread and the indexing loop both report
        if self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total_bytes, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                             file=self.stream, dynamic_ncols=True,
                             bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")

    def _bytes(self) -> int | None:
        return self.position() if self.position is not None else None

    def update(self, papers: int = 0) -> None:
        """`papers` more papers are done (encoded, or found unchanged)."""
        with self._lock:
            self._update(papers)

    def _update(self, papers: int) -> None:
        self.papers += papers
        done = self._bytes()
        if papers:
            self._updates += 1
            if self._first is None and done is not None:
                self._first = (time.monotonic(), done)
                self._first_papers = self.papers
        if self._bar is not None:
            if done is not None and done >= self._bar.n:
                self._bar.update(done - self._bar.n)
            committed = f", {self.committed} committed" if self.committed is not None else ""
            self._bar.set_postfix_str(f"{self.papers} papers{committed}{self._speed(time.monotonic(), done)}",
                                      refresh=True)
            return
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._print(now)

    def _print(self, now: float, final: bool = False, stopped: str | None = None) -> None:
        elapsed = max(now - self._start, 1e-9)
        parts = [f"{self.desc}: {self.papers} papers"]
        if self.committed is not None:  # encoded runs ahead of written: both, so neither is taken for the other
            parts.append(f"{self.committed} committed")
        done = None if stopped else self._bytes()  # cut short: the bytes read say nothing of what is in
        if done is not None and self.total_bytes:
            share = 100 * min(done, self.total_bytes) / self.total_bytes
            parts.append(f"{_size(min(done, self.total_bytes))} of {_size(self.total_bytes)} ({share:.0f}%)")
            left = None if final else self._left(now, done)
            if left is not None:
                parts.append(f"about {_duration(left)} left")
        elif done is not None:
            parts.append(f"{_size(done)} read")
        parts.append(f"{self.papers / elapsed:.1f} papers/s")
        # the input read and encoded, not the run done (what is committed is the run's summary to say)
        parts.append(f"{f'interrupted ({stopped}) after ' if stopped else 'all read in ' if final else ''}{elapsed:.0f}s")
        self.stream.write(", ".join(parts) + "\n")
        self.stream.flush()
        self._lines += 1

    def _speed(self, now: float, done: int | None) -> str:
        """`, 12.3 papers/s, about 1m05s left` at the rate since the first batch, once a few batches have come (the
        first carries the model's warm-up); before that `, warming up`."""
        if self._first is None or self._updates <= ESTIMATE_AFTER or now <= self._first[0]:
            return ", warming up"
        rate = (self.papers - self._first_papers) / (now - self._first[0])
        left = self._left(now, done) if done is not None else None
        return f", {rate:.1f} papers/s" + (f", about {_duration(left)} left" if left is not None else "")

    def _left(self, now: float, done: int) -> float | None:
        """Seconds left at the rate since the first update, once a few updates have come (None: not yet known)."""
        if self._first is None or self._updates <= ESTIMATE_AFTER or not self.total_bytes or done >= self.total_bytes:
            return None
        since, at = self._first
        if done <= at or now <= since:
            return None
        return (self.total_bytes - done) * (now - since) / (done - at)

    def close(self, stopped: str | None = None) -> None:
        """The end of the work (`stopped`: the reason it was cut short, e.g. "SIGINT")."""
        if self._bar is not None:
            if stopped:
                self._bar.set_postfix_str(f"{self.papers} papers, interrupted ({stopped})", refresh=True)
            self._bar.close()
            self._bar = None
        elif self._lines or stopped:  # a run long enough to have reported progress also reports its end
            self._print(time.monotonic(), final=True, stopped=stopped)
            self._lines = 0


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
