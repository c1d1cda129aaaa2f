"""What `fleetgen doctor` checks of a run's servers, before the job sends them anything: one line
for the first server that disagrees with the run's settings (exit 3) or cannot be reached
(exit 4)."""

from __future__ import annotations

import orjson

from fleetgen import exitcodes
from fleetgen.errors import ConfigError, EngineUnreachable
from producer.settings import ProducerSettings

PREFLIGHT_TIMEOUT_S = 60.0


def preflight(urls: list[str], settings: ProducerSettings) -> None:
    from fleetgen.cli import doctor

    kwargs = settings.chat_template_kwargs  # as doctor reads the flag: JSON text
    reports, fleet_checks, code = doctor.check_fleet(
        urls, settings.engine_protocol, PREFLIGHT_TIMEOUT_S, settings.tokenizer,
        orjson.dumps(kwargs).decode() if kwargs else None,
        doctor.needs_of(settings.token_ids, settings.sampling.get("stop")))
    if code == exitcodes.OK:
        return
    failed = [f"{r.url} {c.name}: {c.detail}" for r in reports for c in r.checks if not c.ok]
    failed += [c.line() for c in fleet_checks]
    first = failed[0] if failed else doctor.VERDICTS[code]
    more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    message = (f"{first}{more}; `fleetgen doctor --engine-url {urls[0]}` shows every check")
    if code == exitcodes.UNAVAILABLE:
        raise EngineUnreachable(message)
    raise ConfigError(message)
