"""The readiness probe every fleetgen part uses (worker health gate, local fleet, `check`,
`doctor`): one quick GET that tells ready, not ready, refused and slow apart.

SGLang 0.5.23's `/health` is a generation probe (http_server.py `health_generate`: it submits
a request and polls once a second, so every call takes >= 1 s and up to 20 s before a 503);
its `/ready` is the instant check (http_server.py `ready`: 200 only when up, not paused and
not exiting). SGLang's router serves `/readiness` instead; servers that have neither answer
`/health` quickly. So: the first of these paths that is not a 404.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import httpx

READY_PATHS = ("/ready", "/readiness", "/health")


class State(enum.Enum):
    READY = "ready"  # 200
    NOT_READY = "not_ready"  # answered, not 200 (loading, paused, draining, exiting)
    REFUSED = "refused"  # no connection: the server is not there
    SLOW = "slow"  # connected, no answer in time: busy, not gone


@dataclass(frozen=True)
class Probe:
    state: State
    detail: str

    @property
    def ready(self) -> bool:
        return self.state is State.READY


def probe(http: httpx.Client, timeout_s: float = 2.0, paths: tuple[str, ...] = READY_PATHS,
          ) -> tuple[Probe, str | None]:
    """Probe with `http` (its base URL is the server). Returns the result and the path that
    answered, to be passed back as `paths=(path,)` next time."""
    for path in paths:
        try:
            response = http.get(path, timeout=timeout_s)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            return Probe(State.REFUSED, f"{path}: cannot connect ({type(exc).__name__})"), None
        except httpx.TimeoutException:
            return Probe(State.SLOW, f"{path}: no answer within {timeout_s:g} s"), path
        except httpx.HTTPError as exc:
            return Probe(State.REFUSED, f"{path}: {type(exc).__name__}"), None
        if response.status_code == 404 and path != paths[-1]:
            continue
        if response.status_code == 200:
            return Probe(State.READY, f"{path} 200"), path
        return Probe(State.NOT_READY, f"{path} answered {response.status_code}"), path
    return Probe(State.NOT_READY, "no readiness endpoint"), None


def probe_url(base_url: str, timeout_s: float = 2.0, api_key: str | None = None) -> Probe:
    """One probe of a server by URL (health endpoints need no API key on SGLang, but a
    router or proxy in front may want one)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=base_url.rstrip("/"), headers=headers) as http:
        return probe(http, timeout_s)[0]
