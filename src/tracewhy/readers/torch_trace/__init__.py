"""TORCH_TRACE structured compile logs (``TORCH_TRACE=DIR``, what tlparse reads): ``lines``
iterates a log's entries as (envelope, payload) pairs; ``reader`` turns a directory of rank logs
into ``model/torch_logs``' tables."""
