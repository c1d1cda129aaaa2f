"""The HTTP handlers of each API surface a simulated server serves (SGLang's native and OpenAI
endpoints, vLLM's, llama.cpp's), and which of them each flavour mounts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from aiohttp import web

from fleetgen.simulator import info, llama
from fleetgen.simulator.chat import parse_chat, render_chat, tokenize
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.faults import HANG_ANSWER, HANG_S, Fault
from fleetgen.simulator.httpio import json_response, read_json
from fleetgen.simulator.openai_api import (
    openai_error_body,
    parse_completions,
    render_completions,
    vllm_error_body,
)
from fleetgen.simulator.parts import ServerParts
from fleetgen.simulator.request import QUEUE_FULL_MESSAGE, ApiError, GenerationRequest, ServedItem
from fleetgen.simulator.request import InFlight as RidInFlight
from fleetgen.simulator.sglang_api import native_error_body, parse_generate, render_native
from fleetgen.simulator.vllm_api import (
    parse_chat_vllm,
    render_chat_vllm,
    render_completions_vllm,
)

DROPPED = web.RequestKey("fleetgen_sim_dropped", bool)


@dataclass(frozen=True)
class Api:
    """How one generation endpoint reads requests and shapes answers and errors."""

    parse: Callable[[Any, SimConfig, RidInFlight], GenerationRequest]
    render: Callable[[GenerationRequest, list[ServedItem], SimConfig], Any]
    error_body: Callable[[ApiError], dict[str, Any]]


NATIVE = Api(parse_generate, render_native, native_error_body)
CHAT = Api(parse_chat, render_chat, openai_error_body)
OPENAI = Api(parse_completions, render_completions, openai_error_body)
VLLM_OPENAI = Api(parse_completions, render_completions_vllm, vllm_error_body)
VLLM_CHAT = Api(parse_chat_vllm, render_chat_vllm, vllm_error_body)
LLAMA = Api(llama.parse, llama.render, llama.error_body)


class Routes:
    """The generation, tokenizer and model-info endpoints of one server, acting on its parts."""

    def __init__(self, parts: ServerParts) -> None:
        self.parts = parts
        self.config = parts.config
        self._created = int(time.time())
        self._started_at = time.time()

    def mount(self, app: web.Application) -> None:
        app.add_routes([web.post("/v1/completions", self._completions),
                        web.get("/v1/models", self._models), *self._surface()])

    def _surface(self) -> list[web.RouteDef]:
        """The flavour's own endpoints beside the OpenAI completions every flavour serves."""
        if self.config.flavor == "llama":
            return [web.get("/props", self._llama_props),
                    web.post("/apply-template", self._llama_apply_template),
                    web.post("/tokenize", self._llama_tokenize)]
        # SGLang 0.5.23 and vLLM both render messages on /tokenize (http_server
        # `openai_v1_tokenize`, also /v1/tokenize; vLLM's `tokenize`).
        tokenizer = [web.post(path, self._tokenize) for path in ("/tokenize", "/v1/tokenize")]
        if self.config.flavor == "vllm":
            return [*tokenizer, web.post("/v1/chat/completions", self._chat_vllm)]
        info_paths = {"/get_server_info": self._server_info, "/server_info": self._server_info,
                      "/get_model_info": self._model_info, "/model_info": self._model_info}
        return [*tokenizer, web.post("/generate", self._generate),
                web.post("/v1/chat/completions", self._chat),
                *(web.get(path, handler) for path, handler in info_paths.items())]

    # ------------------------------------------------------------ generation

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, NATIVE)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        api = {"vllm": VLLM_OPENAI, "llama": LLAMA}.get(self.config.flavor, OPENAI)
        return await self._serve(request, api)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, CHAT)

    async def _chat_vllm(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, VLLM_CHAT)

    async def _serve(self, request: web.Request, api: Api) -> web.StreamResponse:
        server = self.parts
        with server.in_flight.track() as leave:
            try:
                refusal = server.availability.refusal()
                if refusal is not None:
                    raise ApiError(503, refusal)
                tickets = server.scheduler.tickets
                job = api.parse(await read_json(request), self.config, tickets.__contains__)
                with server.scheduler.reserved(job) as reserved:
                    hang = await self._fault(request, leave)
                    outcomes = await server.scheduler.run(job, reserved, hang)
                payload, status = api.render(job, outcomes, self.config), 200
            except ApiError as error:
                payload, status = api.error_body(error), error.status
            # Written here, not after return, so a drain waits for the last byte.
            response = json_response(payload, status)
            await response.prepare(request)
            await response.write_eof()
            return response

    async def _fault(self, request: web.Request, leave: Callable[[], None]) -> bool:
        """This request's fault, if any: raised, or True for a hang. Faults hit only
        requests that passed validation, so length errors stay exact whatever the rates."""
        faults, metrics = self.parts.faults, self.parts.scheduler.metrics
        fault = Fault.HANG if self.parts.availability.hung else faults.draw()
        if fault is not Fault.NONE:
            metrics.count_fault(fault.value)
        if fault is Fault.ERROR:
            raise ApiError(*faults.error_answer())
        if fault is Fault.QUEUE_FULL:
            raise ApiError(503, QUEUE_FULL_MESSAGE)
        if fault is Fault.DROP:
            await _drop(request)
        if fault is Fault.HANG:
            leave()  # it never finishes, so a drain must not wait for it
        return fault is Fault.HANG

    # ------------------------------------------------------------ tokenizer

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        """No slot and no fault: the tokenizer manager answers it without the scheduler."""
        error_body = vllm_error_body if self.config.flavor == "vllm" else openai_error_body
        try:
            answer = tokenize(await read_json(request), self.config)
            if self.config.flavor == "vllm":
                answer["token_strs"] = None  # vLLM's `TokenizeResponse`: with return_token_strs
            return json_response(answer)
        except ApiError as error:
            return json_response(error_body(error), error.status)

    async def _llama_props(self, request: web.Request) -> web.StreamResponse:
        return json_response(llama.props(self.config))

    async def _llama_apply_template(self, request: web.Request) -> web.StreamResponse:
        try:
            return json_response(llama.apply_template(await read_json(request), self.config))
        except ApiError as error:
            return json_response(llama.error_body(error), error.status)

    async def _llama_tokenize(self, request: web.Request) -> web.StreamResponse:
        try:
            return json_response(llama.tokenize(await read_json(request)))
        except ApiError as error:
            return json_response(llama.error_body(error), error.status)

    # ------------------------------------------------------------ info

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return json_response(info.models(self.config, self._created))

    async def _server_info(self, request: web.Request) -> web.StreamResponse:
        """http_server `server_info`: resolved args at top level, live state per DP rank."""
        port = self.parts.lifecycle.port
        return json_response(info.server_info(self.config, port, self._started_at))

    async def _model_info(self, request: web.Request) -> web.StreamResponse:
        return json_response(info.model_info(self.config))


async def _drop(request: web.Request) -> NoReturn:
    request[DROPPED] = True
    if request.transport is not None:
        request.transport.abort()
    # Losing the connection cancels this handler (handler_cancellation) before
    # this wait ends; the error below is only a backstop.
    await asyncio.sleep(HANG_S)
    raise ApiError(*HANG_ANSWER)
