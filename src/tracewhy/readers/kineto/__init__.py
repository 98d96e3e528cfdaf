"""Reader for PyTorch profiler (Kineto) Chrome-trace JSON: ``read_kineto`` (module ``reader``)."""

from tracewhy.readers.kineto.reader import read_kineto

__all__ = ["read_kineto"]
