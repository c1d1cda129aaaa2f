"""A remote-control command's handler runs on the thread that received it (Celery's consumer
loop) and its reply is published on a thread of its own: workers/control.py. Here with kombu's
own `Node`, its reply's publish held as one on a cut link is."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from kombu.pidbox import Mailbox

from workers.control import CONTROL, ControlRepliesOffLoop


class _Mailbox(Mailbox):
    """kombu's mailbox whose `_publish_reply` waits until the test lets it go, then records
    what it published and on which thread (or fails, once asked to)."""

    def __init__(self) -> None:
        super().__init__("test", type="fanout")
        self.go = threading.Event()
        self.published: list[tuple[str, Any, str]] = []
        self.fail = False

    def _publish_reply(self, reply: Any, exchange: Any, routing_key: Any, ticket: Any,
                       channel: Any = None, producer: Any = None, **opts: Any) -> None:
        self.go.wait(10)
        if self.fail:
            self.fail = False
            raise ConnectionError("Valkey gone")
        self.published.append((threading.current_thread().name, reply, routing_key))


def _node(handled_on: list[str]) -> tuple[Any, _Mailbox]:
    def ping(state: Any, **_: Any) -> dict[str, str]:
        handled_on.append(threading.current_thread().name)
        return {"ok": "pong"}

    mailbox = _Mailbox()
    node = mailbox.Node("w1@host", state=SimpleNamespace(), handlers={"ping": ping})
    c = SimpleNamespace(blueprint=SimpleNamespace(
        steps={CONTROL: SimpleNamespace(box=SimpleNamespace(node=node))}))
    ControlRepliesOffLoop(c)
    return node, mailbox


def _command(ticket: str) -> dict[str, Any]:
    # What `Mailbox._broadcast` sends for `inspect().ping()`.
    return {"method": "ping", "arguments": {}, "destination": None, "pattern": None,
            "matcher": None, "ticket": ticket,
            "reply_to": {"exchange": "reply.test.pidbox", "routing_key": "caller"}}


def _wait(cond: Any) -> None:
    deadline = time.monotonic() + 5
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_handler_runs_here_and_the_reply_is_published_off_this_thread() -> None:
    handled_on: list[str] = []
    node, mailbox = _node(handled_on)
    started = time.monotonic()
    node.handle_message(_command("t1"))  # what Celery's `Pidbox.on_message` calls
    # A publish on this thread would wait the 10 s of `go`; 5 s of bound leaves room for a stall.
    assert time.monotonic() - started < 5.0, "the receiving thread waited for the publish"
    assert handled_on == [threading.current_thread().name]
    assert mailbox.published == []
    mailbox.go.set()
    _wait(lambda: mailbox.published)
    assert mailbox.published == [("fleetgen-replies", {"w1@host": {"ok": "pong"}}, "caller")]


def test_a_failed_reply_is_logged_and_the_next_one_published(
        caplog: pytest.LogCaptureFixture) -> None:
    node, mailbox = _node([])
    mailbox.fail = True
    mailbox.go.set()
    with caplog.at_level(logging.WARNING, logger="fleetgen.worker"):
        node.handle_message(_command("t1"))
        node.handle_message(_command("t2"))
        _wait(lambda: mailbox.published)
    assert len(mailbox.published) == 1
    assert "did not reach Valkey (ConnectionError: Valkey gone)" in caplog.text
