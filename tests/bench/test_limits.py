"""The pace ledger (bench/limits.py) and the pace guard's arithmetic (bench/pace.py): each figure's
ratio to its limit, met or missed in the direction that is good for it, and one table of them all."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import limits
from bench.pace import hidden_share


def test_a_ratio_is_met_in_its_own_direction() -> None:
    time = limits.Ratio("bench/drain.py --makespan", "makespan", "pure compute", 1.09, 1.10, at_least=False)
    speed = limits.Ratio("bench/embed_agent.py", "sentences/s", "the fastest plain script", 0.97, 1.0, at_least=True)
    assert time.met and not speed.met
    assert time.line() == "ratio to the limit (pure compute): 1.09x, target <= 1.10x: met"
    assert speed.line().endswith("target >= 1.00x: MISSED")


def test_the_ledger_collects_every_report_and_the_table_marks_the_misses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / "ratios.jsonl"
    monkeypatch.setenv(limits.LEDGER_ENV, str(ledger))
    limits.report(limits.Ratio("a", "fig a", "limit a", 1.5, 1.3, at_least=False, machine="m"))
    limits.report(limits.Ratio("b", "fig b", "limit b", 0.95, 0.9, at_least=True, machine="m"))
    assert [r.bench for r in limits.read(ledger)] == ["a", "b"]
    assert limits.main([str(ledger)]) == 0
    out = capsys.readouterr().out
    assert "| a | fig a | limit a | 1.50x | <= 1.30x | **MISSED** |" in out
    assert "| b | fig b | limit b | 0.95x | >= 0.90x | met |" in out
    assert "1 met, 1 missed" in out


def test_no_ledger_no_table(tmp_path: Path) -> None:
    assert limits.main([str(tmp_path / "absent.jsonl")]) == 1


def test_the_hidden_share_of_the_serial_arms_round_trips() -> None:
    # 1,000 x 5 ms: serial 12 s, compute 5 s; a pipeline at 5.5 s hid 6.5 of the 7 s beyond compute.
    assert hidden_share(5.5, 12.0, 5.0) == pytest.approx(6.5 / 7.0)
    assert hidden_share(7.6, 12.6, 5.0) == pytest.approx(5.0 / 7.6)  # a3bf2a5's agent: 66%, under 80%
    assert hidden_share(5.0, 5.0, 5.0) == 1.0  # nothing to hide
