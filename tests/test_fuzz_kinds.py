"""The fuzz harness's inputs that are not profiler traces (tests/fuzzing_kinds.py): snapshot
pickles mutated opcode by opcode, memory timelines, instrument-log directories, TORCH_LOGS
files. These tests check the harness itself: its seeds read cleanly, its mutants are what it
says they are, a pickle that names a global is refused (never run), and the long run's table
counts every kind. Whether tracewhy survives the mutants is the fuzz run's question."""

from __future__ import annotations

import json
import pickle
import pickletools
import random
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from fuzzing_kinds import (
    KIND_COMMANDS,
    KIND_FORMATS,
    KIND_SEEDS,
    check_kind_read,
    kind_seed_files,
    mutate_kind,
    original_path,
    pick_kind_commands,
)
from fuzzing_mutators import p_inject, p_memo
from fuzzing_run import VERDICTS, Outcome, command_argv, run_cli
from tracewhy.errors import TraceError
from tracewhy.readers.memory.snapshot import read_memory_snapshot


@pytest.mark.parametrize("seed", KIND_SEEDS, ids=lambda s: f"{s.kind}:{s.relative}")
def test_every_seed_reads_and_its_commands_run(seed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Unmutated, each seed is read by its reader and the commands that read its kind end 0 or 1
    (``info`` and ``diagnose`` refuse a non-trace with the command to run instead: exit 3)."""
    path = original_path(seed, tmp_path)
    outcome = Outcome()
    check_kind_read(path, seed.kind, outcome)
    assert outcome.verdict in ("handled", "warned"), outcome.problems
    for command, _ in KIND_COMMANDS[seed.kind]:
        if seed.companion is None and "{companion}" in command:
            continue
        filled = tuple(str(ROOT / "tests/data/generated" / seed.companion) if p == "{companion}" else p
                       for p in command) if seed.companion else command
        code = run_cli(command_argv(filled, path, path, tmp_path / "out"), outcome)
        reads_it = command[0] in ("memory", "pipeline", "blocks", "compile") or "--logs" in command
        assert code in ((0, 1) if reads_it else (0, 1, 3)), (command, code, outcome.problems)
    assert outcome.verdict != "internal", outcome.problems


def test_snapshot_seeds_are_plain_data_pickles() -> None:
    """As torch's _dump_snapshot writes them: no global, no REDUCE, only builtin containers."""
    for seed in (s for s in KIND_SEEDS if s.kind == "snapshot"):
        data = kind_seed_files(seed)["snapshot.pickle"]
        names = {op.name for op, _, _ in pickletools.genops(data)}
        assert not names & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "PERSID"}
        doc = pickle.loads(data)
        assert set(doc) == {"segments", "device_traces", "allocator_settings"}
        assert doc["device_traces"][0] and doc["segments"][0]["blocks"]


def test_memo_mutation_changes_one_reference() -> None:
    data = kind_seed_files(KIND_SEEDS[0])["snapshot.pickle"]
    rng = random.Random(0)
    changed, what = p_memo(data, rng)
    assert changed != data and len(changed) == len(data), what
    assert "memo" in what or "PUT" in what


def test_an_injected_global_is_refused_not_run(tmp_path: Path) -> None:
    """Every injection that names a global is refused by the snapshot reader (exit 3 from memory)."""
    data = kind_seed_files(KIND_SEEDS[0])["snapshot.pickle"]
    rng = random.Random(4)
    seen = 0
    for _ in range(60):
        mutant, what = p_inject(data, rng)
        if "GLOBAL" not in what and "REDUCE" not in what:
            continue
        seen += 1
        path = tmp_path / f"g{seen}.pickle"
        path.write_bytes(mutant)
        outcome = Outcome()
        check_kind_read(path, "snapshot", outcome)
        assert outcome.verdict == "refused", (what, outcome.problems)
    assert seen >= 3


def test_injected_keys_that_all_hash_alike_are_refused(tmp_path: Path) -> None:
    """Wherever the dict of colliding big-int keys lands, the bytes are refused before unpickling."""
    data = kind_seed_files(KIND_SEEDS[0])["snapshot.pickle"]
    rng = random.Random(5)
    seen = 0
    for _ in range(200):
        mutant, what = p_inject(data, rng)
        if "hash alike" not in what:
            continue
        seen += 1
        path = tmp_path / f"h{seen}.pickle"
        path.write_bytes(mutant)
        outcome = Outcome()
        check_kind_read(path, "snapshot", outcome)
        assert outcome.verdict == "refused", (what, outcome.problems)
        with pytest.raises(TraceError, match="could share one hash"):
            read_memory_snapshot(path)
    assert seen >= 3


@pytest.mark.parametrize("kind", KIND_FORMATS)
def test_mutants_of_every_kind(kind: str, tmp_path: Path) -> None:
    """Mutants differ from their seed, say what was done, and are written as the kind is read:
    a directory of rank logs for the instrument logs, one file otherwise."""
    rng = random.Random(kind)
    seeds = [s for s in KIND_SEEDS if s.kind == kind]
    for n in range(20):
        seed = rng.choice(seeds)
        files = kind_seed_files(seed)
        mutant = mutate_kind(seed, files, rng)
        assert mutant.steps and mutant.files != files
        path = mutant.write(tmp_path / f"input{n}")
        assert path.is_dir() == (kind in ("instrument", "torch-trace"))
        for command in pick_kind_commands(seed, rng, 3):
            argv = command_argv(command, path, path, tmp_path / "out")
            assert "{" not in " ".join(argv) and str(path) in argv


@pytest.mark.slow
def test_fuzz_script_counts_every_kind(tmp_path: Path) -> None:
    """A few seconds of scripts/fuzz.py over the new kinds: the table has a row per kind with
    inputs in it, and the results carry the peak RSS per kind."""
    out = tmp_path / "results.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fuzz.py"), "--minutes", "0.15", "--workers", "1",
                           "--seed", "7", "--formats", ",".join(KIND_FORMATS), "--commands", "1",
                           "--out", str(out), "--failures", str(tmp_path / "failures")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    results = json.loads(out.read_text())
    assert sum(sum(results["counts"][k].values()) for k in KIND_FORMATS) == results["inputs"] > 0
    assert set(VERDICTS) <= set(results["counts"]["snapshot"])
    assert all(results["peak_rss_bytes"][k] > 0 for k in KIND_FORMATS if sum(results["counts"][k].values()))
    assert "| snapshot |" in done.stdout and "| torch-logs |" in done.stdout
