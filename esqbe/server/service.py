"""The service the routes talk to: one writer and `readers` readers, each an `Index` owned by one thread of
its own (`_Slot`), opened once and kept warm; reads under a deadline, writes one at a time."""
from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from fastapi import Request

from ..backends.base import WriteLockBusy
from ..core.deadline import Cancelled, Deadline
from ..core.redact import mask_url, mask_urls
from ..core.threads import init_query_thread
from ..domain import QUERY_FACETS, FirstStageRequest
from ..errors import BackendError
from ..index.api import Index
from ..settings.config import Settings
from .discovery import index_id
from .errors import ApiError
from .options import ServeOptions

log = logging.getLogger("esqbe.server")


class _Slot:
    """One `Index` owned by one thread; everything done with it runs on that thread."""

    def __init__(self, name: str, opener: Callable[[], Index]):
        self.name = name
        self.pending = 0  # submitted and not finished
        self._count = threading.Lock()
        # faiss's OpenMP count is per thread: set once here, never around each search
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"esqbe-{name}", initializer=init_query_thread)
        self.index: Index = self._executor.submit(opener).result()

    def submit(self, fn: Callable, *args) -> Future:
        with self._count:
            self.pending += 1
        future = self._executor.submit(fn, self.index, *args)
        future.add_done_callback(lambda _: self._done())
        return future

    def _done(self):
        with self._count:
            self.pending -= 1

    def close(self) -> None:
        try:
            self._executor.submit(self.index.close).result(timeout=30)
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)


class Service:
    """What the HTTP layer talks to: opens the index once (a writer and `readers` readers) and keeps it warm."""

    def __init__(self, settings: Settings, options: ServeOptions, encoder=None):
        self.settings = settings
        self.options = options
        self._shared_encoder = encoder
        self._lock = threading.Lock()
        self.write_lock = threading.Lock()  # the single writer
        self.writer: _Slot | None = None
        self.readers: list[_Slot] = []
        self.ready = threading.Event()
        self.warm_error: str | None = None
        self.started_at = time.time()
        self.closed = False
        self.timed_out = 0  # queries given up at their deadline
        self.abandoned = 0  # queries given up because their client went away
        #: the index's identity (esqbe.server.discovery.index_id), known once the index is open: the X-Esqbe-Index
        #: header of each query's answer, so a client that found this server by its record can check it
        self.index_id: str | None = None
        #: request bodies parsed into papers (POST /papers): off the event loop, beside the index's own threads
        self._parser = ThreadPoolExecutor(2, thread_name_prefix="esqbe-parse")
        self.parsing = 0  # bodies handed to the parser and not yet parsed

    @property
    def n_readers(self) -> int:
        if self.options.readers:
            return self.options.readers
        return 1 if self.settings.backend == "embedded" else 4

    def _open(self, create: bool) -> Index:
        """An index handle with an encoder of its own (tokenizers are not safe to share across threads),
        loaded the way `Index` loads it (the index's model_source, encoder_backend, the fingerprint check)
        and now, so that a missing model fails the start rather than the first query."""
        from ..index.api import open_backend

        index = Index(open_backend(self.settings, create=create), self.settings, encoder=self._shared_encoder)
        index.shares_encoder = False
        index.scale_waits = False  # the scale is measured on a thread of its own (esqbe.index.scale)
        index.check_model()
        _ = index.encoder
        return index

    def start(self) -> Service:
        with self._lock:
            if self.writer is not None:
                return self
            if self.closed:
                raise BackendError("the service is shut down")
            self.writer = _Slot("writer", lambda: self._open(create=True))
            if self.writer.submit(_create_if_absent).result() is None:
                log.warning("the index (%s) is empty: POST /papers or `esqbe index` fills it", _where(self.settings))
            self.readers = [_Slot(f"reader-{i}", lambda: self._open(create=False)) for i in range(self.n_readers)]
            self.index_id = index_id(self.settings)
            if self.options.warm:
                threading.Thread(target=self._warm_all, name="esqbe-warm", daemon=True).start()
            else:
                self.ready.set()
        return self

    def _warm_all(self) -> None:
        assert self.writer is not None  # start() made the slots before it started this thread
        futures = [slot.submit(_warm) for slot in self.readers]
        futures.append(self.writer.submit(_warm_writer))
        try:  # here, on a backend of its own: no reader waits for it
            self._warm_scale()
        except Exception as e:  # a query measures it again (on a thread of its own) or uses the fixed scale
            log.warning("measuring the similarity scale failed: %s: %s", type(e).__name__, mask_urls(e))
        for f in futures:
            try:
                f.result()
            except Exception as e:  # reported by /health; queries report their own errors
                self.warm_error = f"{type(e).__name__}: {mask_urls(e)}"
                log.warning("warming up failed: %s", self.warm_error)
        if self.options.freeze_gc:
            _freeze_gc()
        self.ready.set()

    def _warm_scale(self) -> None:
        """The default rescorer's similarity scale (esqbe.index.scale), measured (or read from the index) before the
        server says it is ready, so that the first query places its hits on the index's own matches."""
        from ..index.api import open_backend

        index = Index(open_backend(self.settings, create=False), self.settings, encoder=self._shared_encoder)
        index.shares_encoder = False
        try:
            if index.backend.meta() is not None:
                index.similarity_scale(wait=True)  # an engine's too: this process keeps it
        finally:
            index.close()

    async def read(self, fn: Callable, *args, deadline: Deadline | None = None, request: Request | None = None):
        """`fn(index, *args)` on the least busy reader. With a `deadline`, the work runs under it (esqbe.core.deadline:
        checked between its stages and in its loops; not started at all past it) and is given up at it with
        `Cancelled`; with `request`, also as soon as that client goes away. Either way the reader is freed."""
        self.start()
        slot = min(self.readers, key=lambda s: s.pending)
        if deadline is None:
            return await asyncio.wrap_future(slot.submit(fn, *args))
        return await self._wait(slot.submit(_under, deadline, fn, *args), deadline, request, "the query")

    async def _wait(self, work: Future, deadline: Deadline, request: Request | None, what: str):
        """The result of `work` (running under `deadline` on a slot's thread), given up at the deadline or as soon as
        the client of `request` goes away: the deadline is cancelled (queued, the work never starts; running, it stops
        at its next check) and `Cancelled` raised here, so the slot's thread is freed."""
        waiting = asyncio.wrap_future(work)
        watch = asyncio.ensure_future(_client_gone(request)) if request is not None else None
        remaining = deadline.remaining()  # None: a deadline without a time limit
        try:
            done, _ = await asyncio.wait([waiting, *([watch] if watch else [])],
                                         timeout=None if remaining is None else max(remaining, 0.0),
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server cancelled the handler (its client went away, a shutdown)
            deadline.cancel("the request was cancelled")
            work.cancel()
            self.abandoned += 1
            raise
        finally:
            if watch is not None:
                watch.cancel()
        if waiting in done:
            try:
                return waiting.result()
            except Cancelled as e:  # the work itself saw its deadline pass (at one of its checks): said the same way
                if not e.timed_out:
                    raise
                self.timed_out += 1
                raise _past(what, deadline) from None
        gone = watch is not None and watch in done
        deadline.cancel("the client went away" if gone else "past its deadline")
        work.cancel()  # still queued: it never starts; running: it stops at its next check
        waiting.add_done_callback(lambda f: f.cancelled() or f.exception())  # its Cancelled is expected
        if gone:
            self.abandoned += 1
            raise Cancelled("the client went away", timed_out=False)
        self.timed_out += 1
        raise _past(what, deadline)

    async def parse(self, fn: Callable, *args, deadline: Deadline):
        """`fn(*args)` (no index: reading a request's records) on the parser's threads, never on the event loop, under
        `deadline`: the work checks it between records and is given up at it (504). At most `max_queued_writes` bodies
        wait to be parsed (503 past it), as many as may wait to be written."""
        if self.parsing >= self.options.max_queued_writes:
            raise ApiError(503, f"the server is busy reading {self.parsing} batches of papers; retry shortly",
                           headers={"Retry-After": "5"})
        self.parsing += 1
        work = self._parser.submit(_parse_under, deadline, fn, *args)
        remaining = deadline.remaining()
        try:
            return await asyncio.wait_for(asyncio.wrap_future(work), None if remaining is None else max(remaining, 0.0))
        except TimeoutError:
            deadline.cancel("past its deadline")  # running: it stops before its next record; queued: it never starts
            raise _past("reading the records", deadline) from None
        except Cancelled as e:  # the work saw the deadline pass first (at a check between records)
            if e.timed_out:
                raise _past("reading the records", deadline) from None
            raise
        except asyncio.CancelledError:  # the client went away, a shutdown
            deadline.cancel("the request was cancelled")
            raise
        finally:
            self.parsing -= 1

    async def write(self, fn: Callable, *args, deadline: Deadline | None = None, request: Request | None = None):
        """`fn(index, *args)` on the writer's thread, one write at a time, under `deadline` as a read is (`read`):
        a write still queued at its deadline never starts, one running stops at its next check (a batch of papers:
        before its next batch is encoded; what was committed stays). At most `max_queued_writes` wait (503)."""
        self.start()
        assert self.writer is not None  # start() made it
        if self.writer.pending >= self.options.max_queued_writes:
            raise ApiError(503, f"the writer is busy ({self.writer.pending} writes queued); retry shortly",
                           headers={"Retry-After": "5"})
        locked = self._locked(fn, deadline)
        try:
            if deadline is None:
                return await asyncio.wrap_future(self.writer.submit(locked, *args))
            return await self._wait(self.writer.submit(locked, *args), deadline, request, "the write")
        except WriteLockBusy as e:
            raise ApiError(503, f"another writer (pid {e.holder}) has held the index's write lock for over "
                                f"{self.options.write_lock_timeout:g}s; retry later",
                           headers={"Retry-After": str(max(1, round(self.options.write_lock_timeout)))}) from None

    def _locked(self, fn: Callable, deadline: Deadline | None) -> Callable:
        """`fn` as the writer's thread runs it: one write at a time, the backend's write lock taken (a bounded wait for
        another writer's) and given back after, under `deadline` where there is one."""
        def locked(index, *a):
            with self.write_lock:
                if deadline is not None:
                    deadline.check()  # waited past its deadline behind another write: not started
                try:
                    begin = getattr(index.backend, "begin_write", None)  # another writer's lock: wait a bounded time
                    if begin is not None:
                        begin(self.options.write_lock_timeout)
                    return fn(index, *a) if deadline is None else _under(index, deadline, fn, *a)
                finally:
                    end = getattr(index.backend, "end_write", None)  # the embedded write lock is not held while idle
                    if end is not None:
                        end()
        return locked

    def submit_write(self, fn: Callable, *args) -> Future:
        """`fn(index, *args)` on the writer's thread, one write at a time as `write` runs them, asked from a thread
        that is not the event loop's (the follow schedule, esqbe.server.schedule): its Future."""
        self.start()
        assert self.writer is not None  # start() made it
        return self.writer.submit(self._locked(fn, None), *args)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            for slot in [*self.readers, *([self.writer] if self.writer else [])]:
                try:
                    slot.close()
                except Exception as e:  # closing must not fail the shutdown
                    log.warning("closing %s: %s", slot.name, e)
            self.readers, self.writer = [], None
            self._parser.shutdown(wait=False, cancel_futures=True)


def _where(settings: Settings) -> str:
    return settings.path if settings.backend == "embedded" else f"{settings.backend} {mask_url(settings.url)} {settings.index}"


def _create_if_absent(index: Index):
    """The server owns its index: an embedded index that does not exist yet is created (empty) at start,
    so the reader handles can open it; returns the index's meta (None while it is empty)."""
    from ..index.api import _DeferredBackend

    if isinstance(index.backend, _DeferredBackend):
        index.backend.stats()  # the first real call creates the index directory
        end = getattr(index.backend, "end_write", None)  # and gives the write lock back until a write comes
        if end is not None:
            end()
    return index.backend.meta()


def _freeze_gc() -> None:
    """ServeOptions.freeze_gc: collect once (no garbage is frozen), then move every object the collector tracks to its
    permanent generation, and say so on stderr (where `esqbe serve` says what it does)."""
    import gc

    gc.collect()
    gc.freeze()
    print(f"esqbe: warm; {gc.get_freeze_count():,} objects kept out of the garbage collector's walks (gc.freeze)",
          file=sys.stderr, flush=True)


def _warm(index: Index) -> None:
    """Load the tagger and build each facet's kNN structure before the first query needs them."""
    _ = index.tagger
    meta = index.backend.meta()
    if meta is None:
        return
    probe = np.zeros((1, meta.dim), dtype=np.float32)
    probe[0, 0] = 1.0
    for facet in (*QUERY_FACETS, None):
        index.backend.first_stage(FirstStageRequest(text="warm", vectors=probe, facet=facet, k=1, knn_k=1, bm25_k=1,
                                                    with_papers=False))


def _warm_writer(index: Index) -> None:
    _ = index.tagger


def _parse_under(deadline: Deadline, fn: Callable, *args):
    with deadline:
        return fn(*args)


def _past(what: str, deadline: Deadline) -> Cancelled:
    """What a client is told of work given up at its deadline, whichever side saw the deadline pass first (the
    server's wait, or the work at one of its checks): one wording."""
    return Cancelled(f"{what} took longer than this server's {deadline.seconds:g} s request timeout and was abandoned",
                     timed_out=True)


def _under(index: Index, deadline: Deadline, fn: Callable, *args):
    with deadline:
        return fn(index, *args)


async def _client_gone(request: Request, every: float = 0.1) -> None:
    """Returns once the client of `request` has disconnected."""
    while not await request.is_disconnected():
        await asyncio.sleep(every)
