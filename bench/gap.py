"""Where a fleet run's time over the ideal goes (issue 48): start-up, idle slots while prompts
were still queued, the tail, and the drain's end; and which server finished last.

Every answer's slot time comes from the result line: it came back at `finished_at` (wall
clock, written by the worker) after holding a slot for its service time on its server
(ttft + tpot x completion tokens, over the server's speed: the simulator's own model), so
it held the slot from `finished_at - slot_s`. The request was sent at `finished_at -
latency_s` (what waited in the engine's own queue, the K+1-th request, waited between the
two). Idle capacity in each phase is what the fleet could have served and did not, in
full-speed slot-seconds; divided by the fleet's rate (K x the sum of the speeds) it is
seconds of makespan, and the phases add up to makespan - ideal (up to the service model's
rounding). The perfect dispatcher's own excess (replay - ideal) is the tail that a
zero-overhead dispatcher in the same order also meets.

Phases, on the clock of the run (0 = the producer's first row):
- start-up: 0 to the moment every slot first holds a request;
- steady: from there to the last request sent (the queue was not empty before it);
- tail: from the last request sent to the last answer;
- end: from the last answer to the end of the run (the drainer's last line).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_SERVER = re.compile(r"gpu(\d+)@")


@dataclass(frozen=True)
class Answer:
    line: int
    server: int
    sent_s: float  # the request went to the server
    start_s: float  # it took a slot there
    end_s: float  # it came back
    service_s: float  # its full-speed service time


def answers_of(records: Iterable[Mapping[str, Any]], t0_unix: float,
               speeds: Sequence[float], service: Any) -> list[Answer]:
    """The result lines as answers on the run's clock; `service(tokens)` is the full-speed
    time of an answer of that many tokens (bench/fleet.py Model.service_s)."""
    answers = []
    for r in records:
        match = _SERVER.search(str(r["worker"]))
        if match is None:
            raise ValueError(f"worker {r['worker']!r}: not a gpuN@host name")
        server = int(match.group(1))
        end = float(r["finished_at"]) - t0_unix
        full = float(service(r["completion_tokens"]))
        answers.append(Answer(line=int(r["line"]), server=server,
                              sent_s=end - float(r["latency_s"]),
                              start_s=end - full / speeds[server], end_s=end, service_s=full))
    return sorted(answers, key=lambda a: a.end_s)


def idle_capacity(answers: Sequence[Answer], speeds: Sequence[float], slots: int,
                  spans: Sequence[tuple[float, float]]) -> list[float]:
    """Full-speed slot-seconds left idle in each span [a, b): per server, K less the slots
    its answers held (at most K), times its speed."""
    events: list[tuple[float, int, int]] = []  # (t, server, +1/-1)
    for a in answers:
        events += [(a.start_s, a.server, 1), (a.end_s, a.server, -1)]
    events.sort()
    idle = [0.0] * len(spans)
    running = [0] * len(speeds)
    capacity = slots * sum(speeds)
    t = min([0.0] + [e[0] for e in events])
    for when, server, step in [*events, (max(b for _, b in spans), -1, 0)]:
        if when > t:
            rate = capacity - sum(min(n, slots) * s for n, s in zip(running, speeds,
                                                                     strict=True))
            for i, (a, b) in enumerate(spans):
                overlap = min(b, when) - max(a, t)
                if overlap > 0:
                    idle[i] += rate * overlap
            t = when
        if server >= 0:
            running[server] += step
    return idle


def all_busy_at(answers: Sequence[Answer], speeds: Sequence[float], slots: int) -> float:
    """The first moment every slot of the fleet holds a request (inf: never)."""
    events = sorted([(a.start_s, a.server, 1) for a in answers]
                    + [(a.end_s, a.server, -1) for a in answers])
    running = [0] * len(speeds)
    for when, server, step in events:
        running[server] += step
        if all(n >= slots for n in running):
            return when
    return float("inf")


def decompose(answers: Sequence[Answer], speeds: Sequence[float], slots: int,
              times: tuple[float, float, float], busy_slot_s: Sequence[float]
              ) -> dict[str, Any]:
    """The run's excess over the ideal, phase by phase, in seconds of makespan; and the
    last answers (on which server, sent when, held its slot how long). `times`: the run's
    makespan, ideal and perfect dispatcher's makespan; `busy_slot_s`: each simulator's own
    count of busy slot-seconds, whose excess over the service model is the simulator's time
    per request beyond its model (an idle gap in the answers' slot times, not dispatch)."""
    makespan_s, ideal_s, replay_s = times
    rate = slots * sum(speeds)
    service = sum(a.service_s for a in answers)
    beyond = sum(b * s for b, s in zip(busy_slot_s, speeds, strict=True)) - service
    busy = all_busy_at(answers, speeds, slots)
    last_sent = max(a.sent_s for a in answers)
    last_end = max(a.end_s for a in answers)
    bounds = [0.0, min(busy, last_sent), last_sent, last_end, max(makespan_s, last_end)]
    names = ["startup", "steady", "tail", "end"]
    spans = list(itertools.pairwise(bounds))
    idle = idle_capacity(answers, speeds, slots, spans)
    phases = {name: {"from_s": a, "to_s": b, "idle_s": lost / rate,
                     "utilization": 1 - lost / (rate * (b - a)) if b > a else 1.0}
              for name, (a, b), lost in zip(names, spans, idle, strict=True)}
    slow = {g for g, s in enumerate(speeds) if s < max(speeds)}
    fast_done = max((a.end_s for a in answers if a.server not in slow), default=0.0)
    after_fast = [a for a in answers if a.end_s > fast_done]
    return {
        "makespan_s": makespan_s, "ideal_s": ideal_s, "replay_s": replay_s,
        "over_ideal_s": makespan_s - ideal_s,
        "replay_over_ideal_s": replay_s - ideal_s,  # what a perfect dispatcher also meets
        "over_replay_s": makespan_s - replay_s,
        "first_sent_s": min(a.sent_s for a in answers),
        "all_busy_s": busy, "last_sent_s": last_sent, "last_end_s": last_end,
        "phases": phases,
        "sum_idle_s": sum(p["idle_s"] for p in phases.values()),
        "simulator_beyond_model_s": beyond / rate,
        "simulator_beyond_model_per_answer_ms": 1000 * beyond / len(answers),
        "last_server": max(answers, key=lambda a: a.end_s).server,
        "fast_servers_done_s": fast_done,
        # Answers still running on the slow servers when the fast ones had all finished.
        "after_fast_done": [a.__dict__ for a in after_fast],
        "last_answers": [a.__dict__ for a in answers[-8:]],
    }


def report(gap: Mapping[str, Any]) -> str:
    """The decomposition as lines of text."""
    lines = [f"makespan {gap['makespan_s']:.2f} s, perfect dispatcher {gap['replay_s']:.2f} s "
             f"({gap['makespan_s'] / gap['replay_s']:.3f} x), ideal {gap['ideal_s']:.2f} s "
             f"({gap['makespan_s'] / gap['ideal_s']:.3f} x)",
             f"over ideal {gap['over_ideal_s']:.2f} s, of which the perfect dispatcher's own "
             f"{gap['replay_over_ideal_s']:.2f} s; idle capacity adds up to "
             f"{gap['sum_idle_s']:.2f} s:"]
    for name, p in gap["phases"].items():
        lines.append(f"  {name:<8} {p['from_s']:7.2f} - {p['to_s']:7.2f} s: "
                     f"{p['idle_s']:5.2f} s idle ({100 * p['utilization']:.1f} % used)")
    lines.append(f"  of the idle: the simulators held their slots "
                 f"{gap['simulator_beyond_model_s']:.2f} s (of the fleet's time) beyond their "
                 f"service model, {gap['simulator_beyond_model_per_answer_ms']:.1f} ms an "
                 f"answer: a gap in the answers' slot times, not dispatch")
    lines.append(f"first request sent at {gap['first_sent_s']:.2f} s, every slot busy at "
                 f"{gap['all_busy_s']:.2f} s; last sent {gap['last_sent_s']:.2f} s, last "
                 f"answer {gap['last_end_s']:.2f} s on gpu{gap['last_server']}; fast servers "
                 f"done at {gap['fast_servers_done_s']:.2f} s")
    for a in gap["after_fast_done"]:
        lines.append(f"  after them: line {a['line']} on gpu{a['server']}, sent "
                     f"{a['sent_s']:.2f} s, slot {a['start_s']:.2f}-{a['end_s']:.2f} s "
                     f"({a['service_s']:.2f} s at full speed)")
    return "\n".join(lines)
