"""NVIDIA's ncu_report logs protobuf parse errors of a damaged report straight to file descriptor
2 ("message_lite.cc:195] Can't parse message of type ..."), which broke the one-line contract
(fuzz run). The reader keeps fd 2 for itself while ncu_report reads and says it as a warning,
or inside the one-line error. Both inputs are real reports with the fuzz run's byte flips."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import shared_trace

pytest.importorskip("ncu_report")

#: (position, byte) pairs the fuzz run flipped (found by comparing its saved inputs with the seeds).
FLIPS_WARNED = [(5482, 173), (622520, 67), (921790, 78), (1157216, 0)]
FLIPS_REFUSED = [(26853, 22), (32088, 19), (74944, 193), (81471, 222), (139607, 165), (173300, 115),
                 (176142, 78), (202183, 113), (223843, 148), (229732, 167), (304823, 94), (305196, 112),
                 (313815, 254), (317140, 217), (380109, 13), (406427, 122)]


def _flipped(seed: str, flips: list[tuple[int, int]], tmp_path: Path) -> Path:
    data = bytearray(shared_trace(seed).read_bytes())
    for pos, byte in flips:
        data[pos] = byte
    out = tmp_path / Path(seed).name
    out.write_bytes(bytes(data))
    return out


def _run(path: Path) -> subprocess.CompletedProcess[str]:
    # A child process: only there does the native library write to a real fd 2 the test can read.
    return subprocess.run([sys.executable, "-m", "tracewhy", "roofline", str(path), "--json"], capture_output=True,
                          text=True, timeout=120)


def test_parse_errors_are_a_warning(tmp_path: Path) -> None:
    proc = _run(_flipped("ncu/h100_appliedai_stochround_base2.ncu-rep", FLIPS_WARNED, tmp_path))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 0 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("tracewhy: warning: ") and "parse message of type" in lines[0]


def test_parse_errors_join_the_one_line_error(tmp_path: Path) -> None:
    proc = _run(_flipped("ncu/a100pcie_mistic_searchkernel_ncu2020.ncu-rep", FLIPS_REFUSED, tmp_path))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 3 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("tracewhy: error: ") and "(ncu_report: " in lines[0]


def test_a_damaged_length_is_checked_before_it_is_read(tmp_path: Path) -> None:
    """The searchkernel report with bytes 15642-15942 cut out (fuzz run): a block header then
    claims 1,814,235,747 bytes in a 412 KB file. That was read (an allocation of 1.8 GB, a
    MemoryError in a memory-bounded process) before its length was compared with the file."""
    import resource

    data = shared_trace("ncu/a100pcie_mistic_searchkernel_ncu2020.ncu-rep").read_bytes()
    path = tmp_path / "spliced.ncu-rep"
    path.write_bytes(data[:15642] + data[15942:])
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (1_500_000_000, 1_500_000_000)); "
    proc = subprocess.run([sys.executable, "-c", limit + "import sys; from tracewhy.cli import main; "
                           "sys.exit(main(['roofline', sys.argv[1], '--no-cache']))", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert resource.RLIMIT_AS  # the limit exists on this platform
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 3 and len(lines) == 1, proc.stderr
    assert "file ends inside" in lines[0] and "of 1814235747 bytes" in lines[0]
