"""The engine state of one simulated server (slots, KV pool, prefix cache, prefill lane,
metrics) and the running of a request's items through it, as SGLang's scheduler runs them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fleetgen.simulator.answers import compose
from fleetgen.simulator.capacity import KvPool, QueueFull, Slots, Ticket, Tickets
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.faults import HANG_ANSWER, HANG_S
from fleetgen.simulator.metrics import ServerMetrics
from fleetgen.simulator.model import Completion, per_token_s, tokens_done, ttft_s
from fleetgen.simulator.prefill import Prefill, PrefillLane
from fleetgen.simulator.prefix_cache import (
    PrefixCache,
    finished_hashes,
    prefix_hashes,
    reuse_for,
)
from fleetgen.simulator.request import (
    QUEUE_FULL_MESSAGE,
    RUNNING_ABORT_REASON,
    WAITING_ABORT_MESSAGE,
    ApiError,
    GenerationRequest,
    Item,
    ServedItem,
)
from fleetgen.simulator.spec import decode_steps, steps_for


class Scheduler:
    """What one server's scheduler holds, and each item's wait, prefill and decode in it."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.metrics = ServerMetrics(config.model_name, config.total_slots, config.speed)
        self.slots = Slots(
            config.total_slots, config.max_queued_requests, self.metrics.on_running
        )
        self.tickets = Tickets()
        self.kv_pool = KvPool(config.max_total_num_tokens)
        self.prefix_cache = PrefixCache(config.max_total_num_tokens, reuse_for(config))
        # One GPU's forward passes (a DP server's ranks share it: first order).
        self.prefill_lane = PrefillLane(
            config.prefill_tokens_per_s * config.speed, config.chunked_prefill_size)

    def stats(self) -> dict[str, Any]:
        stats = self.metrics.stats(self.slots.running, self.slots.queued)
        stats.update(
            # The prompt tokens the GPU computed (the uncached ones, a retraction's twice), in
            # how many forward passes and how long; the cache's hits are cached_tokens_total.
            prefill_tokens_total=self.prefill_lane.tokens_total,
            prefill_chunks_total=self.prefill_lane.chunks_total,
            prefill_busy_seconds_total=self.prefill_lane.busy_s_total,
        )
        return stats

    @contextmanager
    def reserved(self, job: GenerationRequest) -> Iterator[list[Ticket]]:
        """The job's rids count as in flight from here to the answer (or the error), which
        is what the duplicate-rid check of the next request sees."""
        tickets = self.tickets.reserve([item.rid for item in job.items])
        try:
            yield tickets
        finally:
            for ticket in tickets:
                self.tickets.close(ticket)

    async def run(
        self, job: GenerationRequest, tickets: list[Ticket], hang: bool
    ) -> list[ServedItem]:
        """Every item at once, each in a slot of its own; a full queue fails the request."""
        tasks = [
            asyncio.ensure_future(self._run_item(item, ticket, hang))
            for item, ticket in zip(job.items, tickets, strict=True)
        ]
        try:
            return list(await asyncio.gather(*tasks))
        except QueueFull:
            raise ApiError(503, QUEUE_FULL_MESSAGE) from None
        finally:
            for task in tasks:
                task.cancel()  # siblings of a failed batch item stop and free their slots

    async def _run_item(self, item: Item, ticket: Ticket, hang: bool) -> ServedItem:
        arrived = time.monotonic()
        ticket.task = asyncio.current_task()
        completion = self._answer(item)
        try:
            if hang:
                await asyncio.sleep(HANG_S)
                raise ApiError(*HANG_ANSWER)
            async with self.slots.hold():
                await self._serve_in_slot(item, ticket, completion)
        except asyncio.CancelledError:
            if not ticket.aborted:
                raise
            _uncancel_current_task()
            return self._aborted(item, ticket, completion, arrived)
        self.metrics.count_tokens(item.prompt_tokens, completion.completion_tokens,
                                  ticket.cached_tokens)
        self._count_spec(item, completion.completion_tokens)
        return ServedItem(
            item, completion, time.monotonic() - arrived, ticket.cached_tokens,
            ticket.num_retractions,
        )

    def _answer(self, item: Item) -> Completion:
        return compose(item.key, self.config.output_tokens_mean, item.max_new_tokens,
                       item.prompt, item.style)

    async def _serve_in_slot(self, item: Item, ticket: Ticket, completion: Completion) -> None:
        """Prefill the uncached tokens on the lane, then decode; the ticket records both."""
        config = self.config
        hashes = prefix_hashes(item.prompt)
        hit = self.prefix_cache.lookup(hashes)
        ticket.cached_tokens = hit.cached
        with self.kv_pool.hold(item.prompt_tokens + item.max_new_tokens) as over:
            ticket.num_retractions = 1 if over else 0
            # A retracted request is prefilled a second time when it is re-admitted.
            uncached = max(1, item.prompt_tokens - ticket.cached_tokens)
            prefill = self.prefill_lane.schedule(
                uncached * (1 + ticket.num_retractions), time.monotonic())
            first_token_s = ttft_s(config) * (1 + ticket.num_retractions)
            tokens = completion.completion_tokens
            # One forward pass per token, or per verify step when speculating: the answer
            # takes its steps' time, and an abort sees tokens at the answer's mean pace.
            step_s = per_token_s(config, self.slots.running)
            decode_s = step_s * decode_steps(config, item.key, item.prompt, tokens)
            ticket.start_service(first_token_s, decode_s / tokens if tokens else step_s,
                                 self.prefill_lane, prefill)
            # The tree takes the prompt once its prefill ran (`checkpoint_kv_cache`), not on
            # admission: a request arriving meanwhile computes it again.
            if (delay_s := prefill.end_s - time.monotonic()) > 0:
                await asyncio.sleep(delay_s)
            self.prefix_cache.after_prefill(hashes, hit)
            await self._decode_until(prefill, first_token_s + decode_s)
        self.prefix_cache.after_decode(finished_hashes(hashes, item.prompt, completion),
                                       len(hashes))

    async def _decode_until(self, prefill: Prefill, decode_s: float) -> None:
        """Sleep until `decode_s` of decoding after the prefill; a chunk scheduled meanwhile
        (another request's prefill) moves the moment back, so look again on waking. One
        sleep for the whole answer otherwise, which keeps thousands of requests cheap."""
        lane, target = self.prefill_lane, prefill.decode_clock_s + decode_s
        # The clock stands still during the prefill itself: never done before its end.
        while (delay_s := max(lane.time_at(target), prefill.end_s) - time.monotonic()) > 0:
            await asyncio.sleep(delay_s)

    def _aborted(
        self, item: Item, ticket: Ticket, completion: Completion, arrived: float
    ) -> ServedItem:
        """Scheduler.abort_request: a waiting request is popped, a running one finishes."""
        self.metrics.aborted_total += 1
        latency_s = time.monotonic() - arrived
        if ticket.service_started is None:
            reason = {"type": "abort", "message": WAITING_ABORT_MESSAGE}
            return ServedItem(item, completion.prefix(0, reason), latency_s, waiting_abort=True)
        produced = tokens_done(
            ticket.elapsed_in_service_s(), ticket.first_token_s, ticket.per_token_s,
            completion.completion_tokens,
        )
        partial = completion.prefix(produced, dict(RUNNING_ABORT_REASON))
        self.metrics.count_tokens(item.prompt_tokens, partial.completion_tokens,
                                  ticket.cached_tokens)
        self._count_spec(item, partial.completion_tokens)
        return ServedItem(
            item, partial, latency_s, ticket.cached_tokens, ticket.num_retractions
        )

    def _count_spec(self, item: Item, completion_tokens: int) -> None:
        """The verify steps of an answer, into the /metrics counters (vLLM's spec_decode_*)."""
        if self.config.speculative_algorithm is not None:
            self.metrics.count_spec(
                steps_for(self.config, item.key, item.prompt, completion_tokens))


def _uncancel_current_task() -> None:
    # The cancel came from /abort_request, not from the client: the request goes on
    # to answer, so the pending cancellation must not linger on its task.
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
