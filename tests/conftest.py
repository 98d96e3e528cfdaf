"""Shared test fixtures: where the real traces are, and a way to find them by name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The shared folder lives beside the clone (CI puts it there too).
SHARED = Path(os.environ.get("TRACEWHY_SHARED", ROOT.parent / "shared"))
TRACES = SHARED / "traces"
GENERATED = ROOT / "tests" / "data" / "generated"


def shared_trace(relative: str) -> Path:
    """Path of a real trace under ../shared/traces; skips the test only when ../shared is absent."""
    if not SHARED.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI must have the shared traces beside the clone ({SHARED} is missing)")
        pytest.skip("../shared is absent: the real-trace tests need the shared traces beside the clone")
    path = TRACES / relative
    assert path.exists(), f"missing shared trace {relative}"
    return path


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    if not TRACES.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI must have the shared traces beside the clone ({TRACES} is missing)")
        pytest.skip("../shared is absent: the real-trace tests need the shared traces beside the clone")
    return TRACES


@pytest.fixture(autouse=True)
def _json_documents_follow_their_schemas(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``--json`` document a test makes (``renderers.jsonout.envelope`` makes them all, the
    error documents and the HTML report's data too) is checked against its command's shipped
    JSON Schema; a document that breaks it fails the test (json_contract.DocumentInvalid)."""
    from json_contract import check_document
    from tracewhy.renderers import jsonout

    monkeypatch.setattr(jsonout, "document_hook", check_document)
