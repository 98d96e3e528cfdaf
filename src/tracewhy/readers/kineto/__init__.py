"""PyTorch profiler (Kineto) Chrome-trace JSON: ``reader.read_kineto`` reads it into a Trace,
``raw_events.read_raw_events`` keeps its events as written, ``sniff.is_kineto`` tells it by content.

Nothing is imported here: the registry imports ``sniff`` alone to tell a file, and the reader's
imports (about 50 ms) only when a Kineto file is read."""
