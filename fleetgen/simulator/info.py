"""The info bodies a simulated server answers (/server_info, /model_info, /v1/models), built
from the simulator's config.

http_server `server_info` returns `build_server_info` (the resolved server args,
then the scheduler's init info) plus `internal_states`, one per DP rank
(`SchedulerInternalStateController.get_internal_state`). Only the fields a client
might read are modelled; a real server sends many more.
"""

from __future__ import annotations

import uuid
from typing import Any

from fleetgen.simulator.config import SGLANG_VERSION, SimConfig


def resolved_args(config: SimConfig, port: int) -> dict[str, Any]:
    """`ServerArgs.resolved_dict`: CLI values after resolution (null where nothing set them)."""
    speculative = config.speculative_algorithm is not None
    return {
        "model_path": config.model_name,
        "tokenizer_path": config.model_name,
        "served_model_name": config.model_name,
        "host": config.host,
        "port": port,
        "context_length": config.context_length,
        "max_running_requests": config.resolved_max_running_requests,
        "max_queued_requests": config.max_queued_requests,
        "max_total_tokens": config.max_total_tokens,
        "page_size": config.page_size,
        "chunked_prefill_size": config.chunked_prefill_size,
        "tp_size": 1,
        "dp_size": config.dp_size,
        "skip_tokenizer_init": config.skip_tokenizer_init,
        "enable_deterministic_inference": config.enable_deterministic_inference,
        "speculative_algorithm": config.speculative_algorithm,
        "speculative_num_steps": config.speculative_num_steps if speculative else None,
        "speculative_eagle_topk": config.speculative_eagle_topk if speculative else None,
        "speculative_num_draft_tokens": (
            config.speculative_num_draft_tokens if speculative else None
        ),
        "allow_auto_truncate": config.allow_auto_truncate,
        # A server arg (`--reasoning-parser`), so at the top level as every other one.
        "reasoning_parser": config.reasoning_parser,
        "enable_metrics": True,
        # The simulator never echoes a key; a real server's args would carry it.
        "api_key": None if config.api_key is None else "<hidden>",
    }


def internal_state(config: SimConfig, port: int, started_at: float) -> dict[str, Any]:
    """One DP rank's `get_internal_state`: the args again, plus the limits in force."""
    return {
        **resolved_args(config, port),
        "world_size": config.dp_size,
        "startup_time": started_at,
        "effective_max_running_requests_per_dp": config.slots_per_dp,
        "last_gen_throughput": 0.0,
        "memory_usage": {"token_capacity": config.max_total_num_tokens},
    }


def server_info(config: SimConfig, port: int, started_at: float) -> dict[str, Any]:
    info = resolved_args(config, port)
    info["launch_command"] = "python -m fleetgen.simulator (fleetgen SGLang simulator)"
    info["kv_events"] = None
    # Scheduler.get_init_info; with DP the controller's version has no "status".
    if config.dp_size == 1:
        info["status"] = "ready"
    info["max_total_num_tokens"] = config.max_total_num_tokens
    info["max_req_input_len"] = config.max_req_input_len
    info["startup_time"] = started_at
    info["internal_states"] = [
        internal_state(config, port, started_at) for _ in range(config.dp_size)
    ]
    info["version"] = SGLANG_VERSION
    info["frontend"] = "python"
    info["simulated_by"] = "fleetgen-sim"
    return info


def model_info(config: SimConfig) -> dict[str, Any]:
    """http_server `get_model_info`."""
    name = config.model_name
    return {
        "model_path": name, "served_model_name": name, "tokenizer_path": name,
        "is_generation": True, "preferred_sampling_params": None,
        "weight_version": "default", "load_format": "auto",
        "reasoning_parser": config.reasoning_parser,
        "tool_call_parser": None, "disaggregation_mode": "null",
        "has_image_understanding": False, "has_audio_understanding": False,
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
    }


def models(config: SimConfig, created: int) -> dict[str, Any]:
    """/v1/models: the one served model, as the flavour's server describes it."""
    name = config.model_name
    return {"object": "list", "data": [{
        "id": name, "object": "model", "created": created,
        "owned_by": {"vllm": "vllm", "llama": "llamacpp"}.get(config.flavor, "sglang"),
        "root": name, "max_model_len": config.context_length,
        **(_vllm_model_fields(created) if config.flavor == "vllm" else {}),
    }]}


def _vllm_model_fields(created: int) -> dict[str, Any]:
    """vLLM's `ModelCard` beyond SGLang's: `parent` and one `ModelPermission`."""
    return {"parent": None, "permission": [{
        "id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission",
        "created": created, "allow_create_engine": False, "allow_sampling": True,
        "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
        "allow_fine_tuning": False, "organization": "*", "group": None,
        "is_blocking": False}]}
