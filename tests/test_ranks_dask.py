"""``tracewhy ranks --executor dask://HOST:PORT`` gives what the process pool gives, on a small
local Dask cluster (loopback only, two worker threads, bounded time)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from conftest import GENERATED
from tracewhy.cli import main

try:
    import distributed
except ImportError:  # pragma: no cover - CI installs the dask extra
    if os.environ.get("CI"):
        raise
    pytest.skip("needs the dask extra: pip install -e '.[test,dask]'", allow_module_level=True)

#: Starting a cluster, summarizing two small traces and stopping it takes a few seconds; a
#: hang (a port that never answers) fails the test instead of stalling the suite.
LIMIT_S = 120


@pytest.fixture
def deadline() -> Iterator[None]:
    def fail(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"the Dask test took more than {LIMIT_S} s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_dask_cluster_gives_the_process_pool_result(deadline: None, capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(GENERATED / f"ddp_gloo_rank{r}.pt.trace.json.gz") for r in (0, 1)]
    assert main(["ranks", *files, "--json", "--workers", "2"]) == 0
    pool = json.loads(capsys.readouterr().out)
    # processes=False: workers are threads of this process, but the CLI still connects over TCP
    # to the scheduler's address, as it would to a remote cluster.
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp",
                                  host="127.0.0.1", dashboard_address=None) as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tcp://127.0.0.1:")
        assert main(["ranks", *files, "--json", "--executor", "dask://" + address.removeprefix("tcp://")]) == 0
    on_dask = json.loads(capsys.readouterr().out)
    assert on_dask.pop("executor") == address.replace("tcp://", "dask tcp://")
    assert pool.pop("executor") == "2 worker processes"
    assert on_dask == pool and on_dask["straggler"] == 1


def test_bad_executor_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(GENERATED / f"ddp_gloo_rank{r}.pt.trace.json.gz") for r in (0, 1)]
    assert main(["ranks", *files, "--executor", "spark://x:1"]) == 2
    assert "--executor must look like dask://HOST:PORT" in capsys.readouterr().err
