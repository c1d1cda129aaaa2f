"""`fleetgen run --measure-acceptance`: refuse servers that do not speculate, and once the run
is written print the drafter's acceptance on these prompts (pooled, the per-request mean, by
server and the other breakdowns, the lowest groups, weak.jsonl), as the report computed it
from the files; vLLM servers started without --per-request-spec-decode-metrics, which report
acceptance only as counters, by the counters' growth the workers wrote into the results."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetgen.engine.speculation import (
    PER_REQUEST_ADVICE,
    answers_per_request,
    speculative_algorithm,
)
from fleetgen.errors import ConfigError
from fleetgen.settings import envvars

if TYPE_CHECKING:
    from fleetgen.monitor.report import Built

SHOWN_GROUPS = 8  # groups printed per breakdown (the report has them all)


@dataclass
class Measure:
    """The servers' algorithms, read before the run."""

    algorithms: dict[str, str | None]

    @classmethod
    def check(cls, urls: list[str]) -> Measure:
        """ConfigError (exit 3) when no server speculates; a warning naming those that do
        not, whose answers carry no acceptance."""
        api_key = envvars.ENGINE_API_KEY.value()
        algorithms = {url: speculative_algorithm(url, api_key=api_key) for url in urls}
        if not any(algorithms.values()):
            raise ConfigError(
                "--measure-acceptance: no --engine-url runs a speculative algorithm "
                "(SGLang /server_info speculative_algorithm is null, vLLM /metrics has no "
                "spec_decode counters); start the servers with the drafter (e.g. "
                "--speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT)")
        plain = [url for url, algorithm in algorithms.items() if not algorithm]
        if plain:
            print(f"fleetgen run: --measure-acceptance: {', '.join(plain)} run no speculative "
                  "algorithm: their answers carry no acceptance", file=sys.stderr)
        counters_only = [url for url, algorithm in algorithms.items() if algorithm == "vllm"
                         and not answers_per_request(url, api_key=api_key)]
        if counters_only:
            print(f"fleetgen run: --measure-acceptance: {', '.join(counters_only)}: "
                  f"{PER_REQUEST_ADVICE}", file=sys.stderr)
        return cls(algorithms)

    def print_report(self, built: Built) -> None:
        """The acceptance lines at the end of the run."""
        for line in acceptance_lines(built.data.get("spec"), built.weak):
            print(f"fleetgen run: {line}", flush=True)


def acceptance_lines(spec: dict[str, Any] | None, weak: Any) -> list[str]:
    if not spec:
        return ["no answer carried speculative figures"]
    lines = _vllm_lines(spec.get("vllm"))
    if not spec["requests"]:
        return lines
    without = spec.get("without_spec") or 0
    lines += [f"acceptance: {_fig(spec['accept_length'])} tokens per verify step pooled "
             f"(sum of tokens / sum of verify steps over {spec['requests']} answers); "
             f"per-request mean {_fig(spec['accept_length_mean'])}; accept rate "
             f"{_fig(spec['accept_rate'])}",
             *([f"  {without} more answers carried no acceptance (their server does not "
                "speculate): in summary.json's without_spec, in no figure here"]
               if without else []),
             *_missing_field(spec),
             "  the pooled figure weighs every verify step alike, the mean every answer alike: "
             "compare drafters on the pooled one"]
    if spec.get("compared"):
        lines.append(f"  the breakdowns compare {spec['compared']}")
    for name, groups in spec["breakdowns"].items():
        lines += _breakdown_lines(name, groups)
    if spec["lowest_groups"]:
        lowest = ", ".join(f"{_within(g)}{g['by'].replace('field:', '')}={g['group']} "
                           f"{_fig(g['accept_length'])}" for g in spec["lowest_groups"])
        lines.append(f"  lowest groups: {lowest}")
    if weak is not None:
        lines.append(f"  the {len(spec['lowest_rows'])} lowest answers' rows: {weak} (`fleetgen "
                     f"run {weak} ...` generates more of them)")
    return lines


def _missing_field(spec: dict[str, Any]) -> list[str]:
    fields = spec.get("group_by_missing")
    if fields is None:
        return []
    return [f"  warning: --group-by {spec['group_by']}: no answered row has that field, every "
            f"row is (none); the rows' fields: {', '.join(fields) or 'none'} (a nested one "
            "with dots: meta.src)"]


def _breakdown_lines(name: str, groups: list[dict[str, Any]]) -> list[str]:
    """One line a breakdown, or one a server where the groups are a server x group table."""
    lines = []
    label = name.replace("field:", "")
    for server in dict.fromkeys(g.get("server", "") for g in groups):
        mine = [g for g in groups if g.get("server", "") == server]
        if len(mine) < 2 and not name.startswith("field:"):
            continue
        shown = ", ".join(f"{g['group']} {_fig(g['accept_length'])} ({g['requests']})"
                          for g in mine[:SHOWN_GROUPS])
        more = f", ... {len(mine) - SHOWN_GROUPS} more" if len(mine) > SHOWN_GROUPS else ""
        where = f" within {server}" if server else ""
        lines.append(f"  by {label}{where}, lowest first: {shown}{more}")
    return lines


def _within(group: dict[str, Any]) -> str:
    return f"{group['server']}: " if group.get("server") else ""


def _vllm_lines(vllm: dict[str, Any] | None) -> list[str]:
    if not vllm:
        return []
    workers = ", ".join(f"{w} {_fig(f['accept_length'])}" for w, f in vllm["by_worker"].items())
    return [f"vLLM acceptance (its /metrics counters, as the workers read them): "
            f"{_fig(vllm['accept_length'])} tokens per step (1 + {vllm['accepted']} accepted / "
            f"{vllm['drafts']} drafts); by worker: {workers}",
            f"  no answer carried its own acceptance, so no breakdown: {PER_REQUEST_ADVICE}"]


def _fig(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
