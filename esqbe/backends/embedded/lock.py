"""The embedded index's connections and its write lock: readers open SQLite read-only and take no lock; a writer
takes the directory's `write.lock` (flock; waiting for another writer, or `WriteLockBusy` after a timeout: the
handle's `write_lock_wait`, else the caller's), creates `papers.sqlite` whole if there is none (or finishes one an
older esqbe left half made), repairs what a killed writer left, and gives the lock back at `end_write` / `close`."""
from __future__ import annotations

import fcntl
import os
import sqlite3
import sys
import time

import numpy as np

from ...errors import BackendError, StorageError
from ..base import WriteLockBusy
from .host import EmbeddedHost
from .layout import VECTOR_DTYPE, create_database, finish_schema, unfinished


class _Unfinished(BackendError):
    """An index whose creation an older esqbe did not finish, holding no papers: a writer finishes it, a reader says
    which command does."""


def _flock_within(fd: int, timeout: float) -> bool:
    """Take an exclusive flock on `fd`, trying until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


class WriteLockMixin(EmbeddedHost):
    """The write lock, the writer's repair and its transactions (mixed into EmbeddedBackend). Uses the backend's
    `_setting`, `meta`, `optimize` (AnnMixin) and `_sync_text` (TextIndexMixin)."""

    def _open_reader(self) -> None:
        db = self.path / "papers.sqlite"
        uri = f"file:{db}?mode=ro"
        if not os.access(self.path, os.W_OK):
            wal = self.path / "papers.sqlite-wal"
            if not wal.exists() or wal.stat().st_size == 0:
                uri += "&immutable=1"  # nobody can write here, and SQLite could not create its shared-memory file
        try:
            self._db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout = 10000")
            half = unfinished(self._db, self.path)
        except sqlite3.DatabaseError as e:
            raise StorageError(f"cannot read the index at {self.path}: {e}") from None
        if half is not None:
            self._db.close()
            self._db = None  # type: ignore[assignment]  # not an index to read: the caller finishes it or stops
            finishable, why = half
            raise _Unfinished(why) if finishable else BackendError(why)

    @property
    def writable(self) -> bool:
        return self._lock_fd is not None

    def begin_write(self, timeout: float | None = None) -> None:
        """Take the write lock now, waiting at most `timeout` seconds for another writer (None: as long as
        it takes), else WriteLockBusy naming the holder's pid: what a server that must answer does
        before a write (`end_write` gives the lock back)."""
        self._acquire_write(timeout)

    def _acquire_write(self, timeout: float | None = None) -> None:
        """Take the directory's write lock (waiting for another writer, with a message), then repair:
        cut rows past the last commit, drop half-written ANN files, bring the text index up to SQLite."""
        if self._lock_fd is not None:
            return
        lock = self.path / "write.lock"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StorageError(f"cannot write to the index at {self.path}: {e.strerror} "
                               "(a read-only index can be queried, not changed)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            wait = self.write_lock_wait if timeout is None else timeout
            if timeout is None:
                bound = "" if wait is None else f" (at most {wait:g}s: write_lock_wait)"
                print(f"esqbe: another process (pid {holder}) is writing to {self.path}; waiting for it to finish{bound}...",
                      file=sys.stderr, flush=True)
            if wait is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            elif not _flock_within(fd, wait):
                os.close(fd)
                how = ("" if timeout is not None else "; run again once it has finished, or wait longer with "
                       "--lock-wait SECONDS (ESQBE_WRITE_LOCK_WAIT, write_lock_wait)")
                raise WriteLockBusy(f"another writer (pid {holder}) has held the write lock of {self.path} for over "
                                    f"{wait:g}s{how}", holder=holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd
        try:
            if self._db is not None:
                self._db.close()
            db = self.path / "papers.sqlite"
            if not db.exists():
                create_database(self.path)  # whole or not at all (a second writer waited for the lock above)
            self._db = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout = 10000")
            half = unfinished(self._db, self.path)
            if half is not None and not half[0]:
                raise BackendError(half[1])  # papers without an index's tables: not esqbe's to change
            if self._db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            finish_schema(self._db)  # tables added since the index was made; a creation an older esqbe left half done
            self._recover()
            self._fill_aliases()  # an index from before the alias table: its papers' identifiers, once
        except sqlite3.OperationalError as e:
            self._release_write()
            raise StorageError(f"cannot write to the index at {self.path}: {e}") from None
        except BaseException:
            self._release_write()
            raise

    def _release_write(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def end_write(self) -> None:
        """End this handle's write session and give the write lock back, staying open for reading: what
        `close` does for a writer (fold a due delta into the IVF, flush the text index, checkpoint), minus
        the closing. A long-lived process that writes now and then (`esqbe serve`) calls it after each
        write, so another writer (`esqbe index`, a second server) is not blocked while it idles; the next
        write takes the lock again (and repairs, as every writer does)."""
        if not self.writable:
            return
        try:
            self._finish_write()
        finally:
            self._close_files()
            self._db.close()
            self._db = None  # type: ignore[assignment]  # reopened as a reader just below
            self._release_write()
            self._open_reader()

    def _finish_write(self) -> None:
        """A writer's last steps: fold a due delta into its IVF, finish the text index, checkpoint."""
        try:
            self.optimize()
        finally:
            if self._text_writer is not None:
                self._text_writer.wait_merging_threads()
                self._text_writer = None
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _close_files(self) -> None:
        if self._files:
            for fd in self._files.values():
                os.close(fd)
            self._files = None
        if self._vec_fd is not None:
            os.close(self._vec_fd)
            self._vec_fd = None

    def _recover(self) -> None:
        """Writer-side repair after a crash: vector files back to the committed row count, stray ANN
        files removed, text index synced."""
        meta = self.meta()
        rows = int(self._setting("rows", 0))
        dim = meta.dim if meta else 0
        for name, width in (("vectors.f16", dim * np.dtype(VECTOR_DTYPE).itemsize), ("rows.pno", 4), ("rows.facet", 1)):
            f = self.path / name
            if f.exists() and width and f.stat().st_size != rows * width:
                os.truncate(f, rows * width)
        keep = {v["file"] for v in self._setting("ann", {}).values()}
        ann_dir = self.path / "ann"
        if ann_dir.exists():
            for f in ann_dir.iterdir():
                if f.name not in keep:
                    f.unlink(missing_ok=True)
        self._sync_text()

    def _tx(self):
        db = self._db

        class _Tx:
            def __enter__(self_inner):
                db.execute("BEGIN IMMEDIATE")

            def __exit__(self_inner, exc_type, *rest):
                db.execute("ROLLBACK" if exc_type else "COMMIT")

        return _Tx()

    def _bump_generation(self) -> None:
        self._db.execute(
            "INSERT INTO settings VALUES ('generation', '1') ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1"
        )
