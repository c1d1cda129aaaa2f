"""`fleetgen estimate`'s sample (fleetgen/cli/estimate.py draw): equal-count strata of prompt
length, each sampled in proportion to its size, the same rows for the same seed, and the
requests each stratum stands for summing to the input's."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from fleetgen.cli.estimate import Survey, draw


def survey(rows: int) -> Survey:
    rng = random.Random(7)
    s = Survey(rows=rows)
    for i in range(rows):
        s.lines.append(2 * i + 1)  # lines are not indices: the bad ones are not in the survey
        s.prompt_tokens.append(rng.randint(10, 4000))
        s.requests.append(rng.choice((1, 1, 2, 4)))  # a row's own n
    return s


def test_the_strata_split_the_input_by_prompt_length_and_weigh_its_requests() -> None:
    s = survey(1000)
    chosen, sizes = draw(s, 200, seed=3)
    assert len(sizes) == 10 and sum(sizes) == sum(s.requests)
    assert 190 <= len(chosen) <= 210 and set(chosen.values()) == set(range(10))
    length = {line: s.prompt_tokens[i] for i, line in enumerate(s.lines)}
    by_stratum: dict[int, list[int]] = {}
    for line, h in chosen.items():
        by_stratum.setdefault(h, []).append(length[line])
    assert all(18 <= len(v) <= 22 for v in by_stratum.values())  # 100 rows each: 20 drawn
    # Equal-count strata of prompt length: each one's prompts are at least the last one's.
    for h in range(1, 10):
        assert min(by_stratum[h]) >= max(by_stratum[h - 1])
    assert draw(s, 200, seed=3) == (chosen, sizes)
    assert draw(s, 200, seed=4)[0] != chosen


def test_a_small_sample_or_input_has_fewer_strata() -> None:
    s = survey(1000)
    chosen, sizes = draw(s, 50, seed=0)
    assert len(sizes) == 2 and sum(sizes) == sum(s.requests) and len(chosen) == 50
    every, sizes = draw(survey(3), 500, seed=0)  # no more strata than rows: all drawn
    assert len(sizes) == 3 and sorted(every) == [1, 3, 5]


def test_times_sizes_and_caps_read_as_a_person_reads_them() -> None:
    """Hours printed as `0.004206`, sizes as `0.00 GB`, and the default caps listed 8192 on a
    4,096 context (a cap the budget already is)."""
    from fleetgen.cli.estimate import caps_for, duration, size

    assert [duration(h) for h in (0.004206, 0.07, 3.44, 1250.2, None)] == [
        "15 s", "4.2 min", "3.4 h", "1,250 h", "-"]
    assert [size(b) for b in (640, 12_500, 3_400_000, 7.1e9)] == [
        "640 B", "12.5 KB", "3.4 MB", "7.1 GB"]
    assert caps_for(None, 4096) == [2048, 4096]
    assert caps_for(None, 32768) == [2048, 4096, 8192]
    assert caps_for([8192, 100], 4096) == [100, 8192]  # the user's, as given


def test_the_estimate_says_when_its_sample_is_the_whole_input() -> None:
    """It printed `generating 302 sampled rows`: the whole input, without saying so."""
    from fleetgen.cli.estimate import sample_words

    assert sample_words(302, 302) == "all 302 usable rows (the sample is the whole input)"
    assert sample_words(500, 2000) == "500 sampled rows of 2,000"


def test_an_interrupted_estimate_names_its_own_command_not_its_inner_out(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """After Ctrl-C the resume hint named the sample run's --out, which the user never typed."""
    from fleetgen.cli.job import NodeJob
    from fleetgen.cli.steps import say_interrupted

    inner = tmp_path / ".fleetgen-estimate" / "k" / "run"
    hint = f"run the same `fleetgen estimate` command (same --out {tmp_path}) to resume it"
    job = NodeJob("run", None, None, None, inner, inner / "state",  # type: ignore[arg-type]
                  resumed=False, resume_hint=hint)
    say_interrupted(job, "estimate-k")
    said = capsys.readouterr().out
    assert hint in said and str(inner) not in said


def test_a_complete_sample_run_is_read_not_run_again(tmp_path: Path) -> None:
    """Re-running the same estimate started Valkey and a worker a server to generate nothing:
    a sample run whose summary.json says complete, with no failure, is read as it is."""
    import orjson

    from fleetgen.cli.estimate import sample_done

    run = tmp_path / "run"
    assert not sample_done(run)
    run.mkdir()
    for summary, done in (({"complete": True, "failed": 0}, True),
                          ({"complete": True, "failed": 2}, False),
                          ({"complete": False, "failed": 0}, False)):
        (run / "summary.json").write_bytes(orjson.dumps(summary))
        assert sample_done(run) is done, summary
    (run / "summary.json").write_bytes(b"{torn")
    assert not sample_done(run)


def test_the_estimate_says_the_run_reuses_its_answers_and_from_where(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fleetgen run` with the same settings generated all 302 again and said nothing; it
    reuses them now, finding them in the working directory, or where --reuse-estimate says."""
    from fleetgen.cli.estimate import reuse_note

    monkeypatch.chdir(tmp_path)
    here = reuse_note(302, Path("."))
    assert here.startswith("`fleetgen run` on this input writes the sample's 302 answers as "
                           "its own") and "--reuse-estimate" not in here
    assert reuse_note(302, Path("est")).endswith(
        "(from another directory: --reuse-estimate est); it says what it reused, or why not")


def test_rows_own_caps_are_named_in_the_estimate(tmp_path: Path) -> None:
    """A Batch file's own `max_tokens: 200` made every cap row read `66.7 %` cut, with nothing
    saying the rows' own caps did it."""
    import argparse

    import orjson

    from fleetgen.cli.estimate import own_caps_note, write_sample

    source = tmp_path / "batch.jsonl"
    rows = [{"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": f"q{i}"}],
                      **({"max_tokens": 200} if i % 3 else {})}} for i in range(6)]
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    caps: list[int] = []
    args = argparse.Namespace(out=tmp_path)
    write_sample(args, source, {line: 0 for line in range(1, 7)}, caps)
    assert caps == [200] * 4
    assert own_caps_note(caps, 6).startswith("4 of the 6 sampled rows carry their own "
                                             "max_tokens (from 200 to 200)")
