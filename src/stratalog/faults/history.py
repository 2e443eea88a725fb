"""The history of a run: every operation's invocation and completion, as JSON lines.

One event per line, in the order the harness observed them::

    {"index": 7, "time": 1.234567, "process": 3, "type": "invoke", "f": "send",
     "partition": 2, "value": 118}
    {"index": 9, "time": 1.240001, "process": 3, "type": "ok", "f": "send",
     "partition": 2, "value": 118, "offset": 40}
    {"index": 12, "time": 1.5, "process": 5, "type": "ok", "f": "poll",
     "msgs": [[2, 40, 118], [2, 41, 119]]}

``type`` is Jepsen's: ``invoke`` starts an operation, ``ok`` says it happened, ``fail`` says it
definitely did not, ``info`` says nothing is known (a timeout, a crash of the client). ``time``
is seconds since the run began (monotonic clock). ``process`` is an integer for a client
process (a new integer whenever a client is replaced), ``"nemesis"`` for faults and ``"final"``
for the final reads. Operations (``f``):

* ``send``: one record, value unique in the run, to ``partition``; ``offset`` on ``ok``;
  ``error`` on ``fail``/``info``.
* ``assign``: a consumer takes ``value`` = [[partition, start offset], ...] (-1: the end, a
  position the harness does not know); a new poll session on those partitions.
* ``subscribe`` / ``rebalance``: a group consumer joins; ``value`` = the partitions it was given
  (``rebalance`` also starts a new poll session).
* ``poll``: ``msgs`` = [[partition, offset, value], ...] in the order the consumer returned them.
* ``final-read``: after healing, ``msgs`` of one ``partition`` from offset 0, ``value`` =
  {"high": the end the broker reported, "complete": whether the read reached it}.
* nemesis operations (``kill``, ``restart``, ``pause``, ``resume``, ``heal``): ``value``
  names the processes and their PIDs.
* ``start`` (process ``"harness"``): ``value`` = {"wall_clock": Unix time}, to line the history
  up with the brokers' logs.
"""

from __future__ import annotations

import gzip
import json
import queue
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

Event = dict[str, Any]

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"


class History:
    """An append-only history written to ``path`` as it grows (JSONL), from any thread.

    :meth:`add` never blocks and takes no lock: it stamps the event and puts it on a
    ``SimpleQueue`` (whose ``put`` is reentrant), and one writer thread numbers the events in
    that order, keeps them in ``events`` and writes them out. Client callbacks (delivery
    reports, rebalances) run inside librdkafka calls and, through a client's finalizer, inside
    any allocation; with a lock around the file, one of them re-entering ``add`` froze a soak.
    ``events`` is complete once :meth:`sync` or :meth:`close` returned.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.events: list[Event] = []
        self._t0 = time.monotonic()
        self._queue: queue.SimpleQueue[Event | threading.Event | None] = queue.SimpleQueue()
        self._out: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._out = open(path, "w")  # noqa: SIM115 - closed by the writer
        self._writer = threading.Thread(target=self._write, name="history-writer", daemon=True)
        self._writer.start()

    def now(self) -> float:
        return round(time.monotonic() - self._t0, 6)

    def add(self, process: int | str, type_: str, f: str, **fields: Any) -> None:
        ev: Event = {"time": self.now(), "process": process, "type": type_, "f": f}
        ev.update({k: v for k, v in fields.items() if v is not None})
        self._queue.put(ev)

    def invoke(self, process: int | str, f: str, **fields: Any) -> None:
        self.add(process, INVOKE, f, **fields)

    def ok(self, process: int | str, f: str, **fields: Any) -> None:
        self.add(process, OK, f, **fields)

    def fail(self, process: int | str, f: str, **fields: Any) -> None:
        self.add(process, FAIL, f, **fields)

    def info(self, process: int | str, f: str, **fields: Any) -> None:
        self.add(process, INFO, f, **fields)

    def _write(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            if isinstance(item, threading.Event):
                if self._out is not None:
                    self._out.flush()
                item.set()
                continue
            ev = {"index": len(self.events), **item}
            self.events.append(ev)
            if self._out is not None:
                self._out.write(json.dumps(ev, separators=(",", ":")) + "\n")
        if self._out is not None:
            self._out.close()

    def sync(self, timeout: float = 60) -> None:
        """Until every event added before this call is in ``events`` and on disk."""
        if not self._writer.is_alive():
            return
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout)

    def close(self, timeout: float = 60) -> None:
        """Write what is queued, close the file; later :meth:`add` calls are dropped."""
        if self._writer.is_alive():
            self._queue.put(None)
            self._writer.join(timeout)


def load_history(path: Path) -> list[Event]:
    """Read a JSONL history (gzipped when it ends in ``.gz``); a torn line (the writer was
    killed) is skipped."""
    return list(iter_history(path))


def iter_history(path: Path) -> Iterator[Event]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def compress(path: Path) -> Path:
    """``path`` gzipped beside itself (``.jsonl.gz``, a tenth of the size); the original goes."""
    out = path.with_name(path.name + ".gz")
    with open(path, "rb") as src, gzip.open(out, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    return out


def write_history(path: Path, events: Iterable[Event]) -> None:
    with open(path, "w") as fh:
        for ev in events:
            fh.write(json.dumps(ev, separators=(",", ":")) + "\n")
