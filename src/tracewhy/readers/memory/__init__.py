"""PyTorch's memory inputs: CUDA caching-allocator snapshots (``snapshot``) and memory-timeline
exports (``timeline``), each told apart by content (``sniff``)."""
