"""`esqbe serve --follow-every DURATION`: `esqbe follow run` on a schedule, so the feeds readers subscribe to fill by
themselves. The schedule is a thread of its own that only waits: each run is handed to the service's writer
(esqbe.server.service: its one thread, one write at a time, the index's write lock taken), never run on the event
loop, and the next one is counted from the end of the last, so two runs never overlap. A run is the Python API's
(`esqbe.index.follow_run.run_follow`: every source, then every watch); a shutdown cancels the run going on, which
stops after the page being indexed (its mark not moved past what was committed). GET /stats shows `server.follow`:
the interval, the next run, the last run's outcome; each source's own counts and last error are kept with the index
(`follow`)."""
from __future__ import annotations

import logging
import threading
import time

from ..core.deadline import Deadline
from ..core.redact import mask_urls
from ..errors import EsqbeError

log = logging.getLogger("esqbe.server")


class FollowSchedule:
    """Runs every followed source, then every watch, every `every` seconds (the first run once the server is up)."""

    def __init__(self, service, every: float):
        self.service, self.every = service, float(every)
        self._quit = threading.Event()
        self._token = Deadline()
        self._thread: threading.Thread | None = None
        self.runs = 0
        self.running = False
        self.next_run: float | None = None
        self.last: dict | None = None

    def start(self) -> FollowSchedule:
        if self._thread is None:
            self.next_run = time.time()
            self._thread = threading.Thread(target=self._loop, name="esqbe-follow", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop waiting, and cancel the run going on (it stops after the page being indexed)."""
        self._quit.set()
        self._token.cancel("the server is shutting down")
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        self.service.ready.wait()  # the model and the index are warm before the first run
        while not self._quit.is_set():
            self._run_once()
            self.next_run = time.time() + self.every
            if self._quit.wait(self.every):
                return

    def _run_once(self) -> None:
        started = time.time()
        self.running = True
        try:
            run = self.service.submit_write(_follow_run, self._token).result()
            self.last = {"started": started, "seconds": round(time.time() - started, 2), "failed": run.failed,
                         "sources": len(run.sources), "indexed": sum(s.indexed + s.replaced for s in run.sources),
                         "new_finds": sum(len(w.matches) for w in run.watches), "interrupted": run.interrupted,
                         "error": None}
        except EsqbeError as e:  # the index cannot be written, the model cannot load: said, and tried at the next
            self.last = {"started": started, "seconds": round(time.time() - started, 2), "failed": True,
                         "error": mask_urls(e)}
            log.warning("the scheduled follow run failed: %s", mask_urls(e))
        except Exception as e:  # a bug: logged whole, the schedule goes on
            self.last = {"started": started, "seconds": round(time.time() - started, 2), "failed": True,
                         "error": f"internal error ({type(e).__name__}); the server log has it"}
            log.exception("the scheduled follow run failed")
        finally:
            self.running = False
            self.runs += 1

    def status(self) -> dict:
        """What GET /stats says of the schedule."""
        return {"every_s": self.every, "runs": self.runs, "running": self.running, "next_run": self.next_run,
                "last": self.last}


def _follow_run(index, token: Deadline):
    """On the writer's thread: every source, then every watch (esqbe.index.follow_run)."""
    from ..index.follow_run import run_follow

    return run_follow(index, stop=token)
