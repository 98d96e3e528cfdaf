"""The capture side, run inside the user's job: block timers and stage clocks that write
tracewhy's instrument log (JSON Lines per rank), read by ``tracewhy blocks LOG`` and
``tracewhy pipeline LOGS``.

    from tracewhy.instrument import block, StageClock, next_step, flush

    with block("denoise"):          # NVTX + record_function + host/GPU time, no synchronize
        ...
    clock = StageClock()
    clock.mark("tA0", chunk=k)      # a named instant on this rank's own clock

Importing it imports nothing heavy: torch is used only if the job already imported it.
"""

from tracewhy.instrument.recorder import (
    LOG_FORMAT,
    LOG_NAME,
    Recorder,
    StageClock,
    block,
    configure,
    flush,
    next_step,
    recorder,
)

__all__ = ["LOG_FORMAT", "LOG_NAME", "Recorder", "StageClock", "block", "configure", "flush", "next_step", "recorder"]
