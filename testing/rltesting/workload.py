"""A workload thread whose first error fails the test."""
import threading

class Workload(threading.Thread):
    """Calls `fn(i)` for i = 0, 1, ... in a thread until stopped or `limit`
    calls were made. The first exception is kept and re-raised by
    `finish()`, so a failing call fails the test."""

    def __init__(self, fn, limit=10**6, stop_on=()):
        super().__init__(daemon=True)
        self.fn = fn
        self.limit = limit
        self.stop_on = tuple(stop_on)  # exceptions that end the run quietly
        self.calls = 0
        self.stopped_by = None
        self.error = None
        self._stop_evt = threading.Event()

    def run(self):
        try:
            while not self._stop_evt.is_set() and self.calls < self.limit:
                self.fn(self.calls)
                self.calls += 1
        except self.stop_on as e:
            self.stopped_by = e
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.error = e

    def finish(self, timeout=60):
        self._stop_evt.set()
        self.join(timeout)
        assert not self.is_alive(), "workload thread did not stop"
        if self.error is not None:
            raise self.error


def run_pipelined(client, nops, make_op, send, check, batch=25):
    """Make `nops` operations with `make_op()` and send them `batch` at a
    time, one pipeline (no transaction) each: `send(pipe, op)` queues an
    operation's command, `check(op, reply)` checks its reply. Errors come
    back as replies (`raise_on_error=False`), so `check` sees every one."""
    done = 0
    while done < nops:
        ops = [make_op() for _ in range(min(batch, nops - done))]
        pipe = client.pipeline(transaction=False)
        for op in ops:
            send(pipe, op)
        for op, reply in zip(ops, pipe.execute(raise_on_error=False)):
            check(op, reply)
        done += len(ops)
