"""Thread limits for the threads that answer queries, set once per thread or once per process, never per call.

A query's maths is small matrices (a few thousand sentence rows by 384) and a faiss search of a few vectors: a
second BLAS or OpenMP thread gains nothing there, and its spinning takes a core from the first stage's other work
(BM25 runs beside the kNN). At 1M papers on 2 cores one BLAS thread takes the warm query p50 from ~22 to ~13 ms
on the synthetic corpus, and from 36.6 to 26.5 ms on the hard one (docs/performance.md). The library itself never
changes these settings; the processes esqbe owns do:
- a worker thread that answers queries: `ThreadPoolExecutor(..., initializer=init_query_thread)`;
- a process that answers queries (`esqbe query`, `esqbe serve`): `limit_for_query()` once at start.
"""
from __future__ import annotations


def init_query_thread() -> None:
    """Once per worker thread (an executor's `initializer=`): faiss's OpenMP on one thread in this thread. OpenMP
    keeps its thread count per thread, so the host's other threads are left as they are."""
    try:
        import faiss
    except ImportError:  # no faiss: nothing to limit
        return
    faiss.omp_set_num_threads(1)


def limit_for_query() -> None:
    """Once, in a process esqbe owns that answers queries (the CLI's `query`, the server's start): numpy's BLAS on
    one thread, and this thread set up as `init_query_thread` does. OpenBLAS keeps one thread count for the whole
    process, so this is process-wide: a library caller sets its own limits (threadpoolctl) instead."""
    # threadpoolctl limits the BLAS libraries loaded when it is called. numpy and faiss each bring their own
    # OpenBLAS (faiss's computes the PQ look-up tables of every ANN search), and a process that limits itself at
    # start has often loaded neither yet: load them first, or faiss's stays at the host's count and its second
    # thread spins beside BM25 (at hard 1M: warm p50 36.6 -> 26.5 ms with both limited, docs/performance.md)
    import numpy  # noqa: F401
    from threadpoolctl import threadpool_limits

    try:
        import faiss  # noqa: F401
    except ImportError:  # no faiss: its BLAS is not there to limit
        pass
    threadpool_limits(limits=1, user_api="blas")
    init_query_thread()


__all__ = ["init_query_thread", "limit_for_query"]
