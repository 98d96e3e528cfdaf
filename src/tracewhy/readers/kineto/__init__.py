"""Reader for PyTorch profiler (Kineto) Chrome-trace JSON."""

from tracewhy.readers.kineto.builder import read_kineto

__all__ = ["read_kineto"]
