"""The Redis side of a worker's acks and rejects, on a thread of its own, off Celery's consumer
loop (issue 52: a consumer loop that never waits on the network).

With the threads pool, a task's ack is made by the pool thread's `Request.acknowledge`
(celery/worker/request.py), whose `_on_ack` is `promise(call_soon_ack, (message.ack_log_error,))`
(celery/worker/consumer/consumer.py `create_task_handler`); with the event loop that every
Redis worker runs, `Consumer.call_soon_ack` is `self.hub.call_soon(p)`: the hub runs it at the
top of its next turn (kombu/asynchronous/hub.py `create_loop`), so `Message.ack` ->
`Channel.basic_ack` -> `QoS.ack` and its round trip to Valkey ran on the consumer loop. A
reject (with or without requeue) takes the same road. A slow or cut Valkey held the loop for
the reply, the socket timeout (30 s) and the client's retries: no take, no health gate, no
stale-connection check meanwhile. `QoS.ack` and `QoS.reject` (fleetgen/queue/broker.py) now do
their in-memory part on the loop and hand the Redis part to `ACKS`, in the order given. So
does the record of each take (`QoS.append`, fleetgen/queue/broker.py `_record_off_loop`), given
before its tag can be acked: FIFO, so a tag's record always lands before its ack or reject.

What an ack may do is unchanged: it is still made only after the task's outcome is recorded
(the task's own order), and its script still removes only what its holder holds. An ack that
never reaches Valkey (the worker SIGKILLed with it pending, Valkey gone past the client's
retries) leaves the message held: it comes back after the holder's lease, and its done bit
stops a second generation, as for a worker killed between its outcome and its ack.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("fleetgen.worker")


class Acks:
    """A FIFO of Redis work, run by one daemon thread a process (started at the first
    submission, again in a forked child): the acks' (`ACKS`), or another caller's that must
    not wait behind them (workers/control.py's remote-control replies). `name` names the
    thread; `if_lost` says, in the warning, what a piece of work that failed leaves."""

    def __init__(self, name: str = "fleetgen-acks", if_lost: str = (
            "the message stays held until this worker's lease lapses, then the sweep hands "
            "it back (a row already answered is not generated again)")) -> None:
        self._name, self._if_lost = name, if_lost
        self._queue: queue.SimpleQueue[tuple[Callable[[], None], str]] = queue.SimpleQueue()
        self._pending = 0
        self._settled = threading.Condition()
        self._pid = 0

    def submit(self, work: Callable[[], None], what: str) -> None:
        """Runs `work` on the acks thread; `what` names it in the warning if it fails."""
        with self._settled:
            if self._pid != os.getpid():  # the first ack, or a forked child: no thread yet
                self._pid, self._pending = os.getpid(), 0
                self._queue = queue.SimpleQueue()
                threading.Thread(target=self._run, args=(self._queue,), name=self._name,
                                 daemon=True).start()
            self._pending += 1
            self._queue.put((work, what))

    def pending(self) -> int:
        with self._settled:
            return self._pending

    def settle(self, timeout_s: float) -> bool:
        """Waits until every ack given so far has reached Valkey (or failed), up to
        `timeout_s`: before a hand-back (what is acked must not be handed back too) and before
        a channel closes. False if some are still waiting."""
        with self._settled:
            return self._settled.wait_for(lambda: self._pending == 0, timeout=timeout_s)

    def _run(self, work_queue: queue.SimpleQueue[tuple[Callable[[], None], str]]) -> None:
        while True:
            work, what = work_queue.get()
            try:
                work()
            except Exception as exc:  # the thread must outlive any one ack
                log.warning("%s did not reach Valkey (%s: %s): %s", what, type(exc).__name__,
                            exc, self._if_lost)
            finally:
                with self._settled:
                    self._pending -= 1
                    self._settled.notify_all()


ACKS = Acks()
# How long a closing channel or a hand-back waits for the acks given before it.
SETTLE_S = 5.0
