"""The replies to Celery's remote-control commands (`celery inspect ...`, `celery control ...`,
Flower's dashboard) published off the consumer loop (issue 52).

A command reaches the worker on its pidbox channel, consumed by the loop: Celery's
`Pidbox.on_message` (celery/worker/pidbox.py) calls kombu's `Node.handle_message`
(kombu/pidbox.py), which calls `Node.dispatch`:

    try:
        reply = handle(method, arguments)
    ...
    if reply_to:
        self.reply({self.hostname: reply},
                   exchange=reply_to['exchange'],
                   routing_key=reply_to['routing_key'],
                   ticket=ticket)

and `Node.reply` is `self.mailbox._publish_reply(...)`: a `Producer.publish(..., retry=True)`
with a producer from the app's pool (`Mailbox.producer_or_acquire`: Celery's mailbox has one,
so not the pidbox channel the loop consumes), so a binding lookup and an LPUSH to the caller's
reply queue, synchronous, on the loop. A slow or cut Valkey held the loop for the socket timeout
(30 s) and kombu's retries, which have no limit (`Connection.ensure`, `max_retries=None`),
each time an operator or Flower asked the worker anything. `ControlRepliesOffLoop` hands
`Node.reply` to a thread of its own (`REPLIES`, FIFO); the command's handler still runs on
the loop, as Celery has it (`enable_events`, `add_consumer` and others change the consumer's
state). Not the acks thread: a reply stuck on a cut link would hold every ack behind it, and
a hand-back waits for the acks given before it (fleetgen/queue/acks.py `settle`).

What a reply may do is unchanged: published once, in the order the commands came, to the
reply queue the caller named; a caller that gave up meanwhile gets nothing, as before (kombu
drops a reply whose queue is gone). A reply that fails is logged here; on the loop the same
failure made Celery's `Pidbox.on_message` log it and reopen the pidbox channel (`reset`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

from celery import bootsteps

from fleetgen.queue.acks import Acks

log = logging.getLogger("fleetgen.worker")

# The name of Celery's remote-control step in the consumer's blueprint
# (celery/worker/consumer/control.py `Control`, whose `box` is the worker's `Pidbox`).
CONTROL = "celery.worker.consumer.control.Control"


# The replies' own FIFO thread (fleetgen/queue/acks.py's, another instance): not the acks',
# whose hand-backs wait for what was given before them.
REPLIES = Acks("fleetgen-replies", "its caller gets no answer from this worker")


def reply_off_loop(reply: Callable[..., None]) -> Callable[..., None]:
    """`reply` (a node's own `Node.reply`), given to `REPLIES` instead of run by the caller."""

    def submit(data: Any, exchange: Any, routing_key: Any, ticket: Any, **kwargs: Any) -> None:
        REPLIES.submit(partial(reply, data, exchange, routing_key, ticket, **kwargs),
                       "a reply to a remote-control command")

    return submit


class ControlRepliesOffLoop(bootsteps.Step):
    """Makes the pidbox node of Celery's `Control` step publish its replies on `REPLIES`
    (module docstring). Once a consumer: the node outlives the consumer's restarts (they
    stop and start the step, `Pidbox.start` giving the node a new channel)."""

    requires: ClassVar[set[str]] = {"celery.worker.consumer.control:Control"}

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        node = getattr(getattr(c.blueprint.steps.get(CONTROL), "box", None), "node", None)
        if node is None:  # no remote control in this Celery: nothing to move
            log.warning("remote-control replies stay on the consumer loop: no pidbox node")
            return
        # kombu's `Node.dispatch` calls `self.reply(...)`: the instance's attribute wins.
        node.reply = reply_off_loop(node.reply)
