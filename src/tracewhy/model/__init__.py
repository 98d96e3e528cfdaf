"""The normalized model every reader produces and every analysis reads."""

from tracewhy.model.schema import Col, Kind
from tracewhy.model.trace import Capture, ModelError, Trace, TraceMeta, Truncation

__all__ = ["Capture", "Col", "Kind", "ModelError", "Trace", "TraceMeta", "Truncation"]
