"""A stand-in for SGLang's `sgl_kernel`, for the test tier's CPU server only.

PyPI has CUDA builds of the kernel package alone (`sglang-kernel`, `sgl-kernel`: they fail at
import without libcuda.so.1) and no source distribution. The CPU engine of SGLang 0.5.23 calls
one of its kernels for every batch: `assign_req_to_token_pool_cpu`
(sglang/srt/mem_cache/allocation.py `assign_req_to_token_pool_func`), memory-pool bookkeeping
that this file writes in torch. Every other name is importable (modules import them at load)
and raises NotImplementedError when called: they are reached only by speculative decoding,
the hybrid (linear-attention) layers and quantized kernels, which the tier does not run. This
replaces one bookkeeping kernel, not the server: the scheduler, radix cache, sampler and HTTP
side are SGLang's own.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch

__version__ = "0.0.0+fleetgen-cpu-standin"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    width: int,
) -> None:
    """For each request i, the next end[i] - start[i] entries of out_cache_loc go into
    req_to_token[req_pool_indices[i], start[i]:end[i]] (the kernel's own contract)."""
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    taken = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        count = end - start
        req_to_token[row, start:end] = out_cache_loc[taken:taken + count].to(req_to_token.dtype)
        taken += count


def _missing(name: str) -> Any:
    def call(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"sgl_kernel.{name}: not in fleetgen's CPU stand-in")

    call.__name__ = name
    return call


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(name)
