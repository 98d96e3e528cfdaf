"""``diagnose --top N`` (every command that prints rows takes --top): the terminal shows
the first N findings and names the rest; --json keeps them all."""

from __future__ import annotations

import json

import pytest

from conftest import shared_trace
from tracewhy.cli import main

TRACE = "hta/a100_ddp2_rank0_nccl2.17.json.gz"


def test_top_limits_the_terminal_not_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(shared_trace(TRACE))
    assert main(["diagnose", path, "--json"]) == 0
    codes = [f["code"] for f in json.loads(capsys.readouterr().out)["findings"]]
    assert len(codes) > 3
    assert main(["diagnose", path, "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "1. [" in out and "2. [" in out and "3. [" not in out
    assert f"... {len(codes) - 2} more ({', '.join(codes[2:])})" in " ".join(out.split())
    assert main(["diagnose", path, "--top", "2", "--json"]) == 0
    assert [f["code"] for f in json.loads(capsys.readouterr().out)["findings"]] == codes
    assert main(["diagnose", path]) == 0
    assert "more (" not in capsys.readouterr().out
