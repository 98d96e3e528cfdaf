"""``reduce-every-microbatch``: gradient accumulation whose gradients are reduced after every
backward pass of a step. A step that runs backward several times (micro-batches) before its
optimizer step needs the gradients reduced once, after the last; a data-parallel wrapper not
told so (DDP's ``no_sync()``, FSDP2's ``set_requires_gradient_sync(False)``) reduces them after
each (``analyses/backward_passes``: the passes from the autograd engine's structure, the
collectives each issues). Priced by the step replayed with the earlier passes' communication
gone (``ReduceOnce``); the advice names the wrapper's switch, found from the block it opens.
"""

from __future__ import annotations

import statistics

import numpy as np

from tracewhy.analyses import api_names
from tracewhy.analyses.backward_passes import backward_passes
from tracewhy.findings import source_line as sl
from tracewhy.findings.anti_patterns import prediction_evidence, priced, priced_severity
from tracewhy.findings.applicability import run_facts, slice_names
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding

#: What to do, per wrapper (``api_names.DATA_PARALLEL_WRAPPERS``), for the passes before the last.
_SWITCH = {
    "DDP": "Run the forward and backward of every micro-batch but the last under `with model.no_sync():` "
           "(DistributedDataParallel.no_sync), so only the last backward all-reduces",
    "FSDP2": "Call model.set_requires_gradient_sync(False) before the micro-batches before the last and "
             "set_requires_gradient_sync(True) before the last, so only its backward reduce-scatters",
    "FSDP": "Run every micro-batch but the last under `with model.no_sync():` (FullyShardedDataParallel.no_sync; "
            "it keeps unsharded gradients meanwhile, more memory), so only the last backward reduces",
}


def findings(ctx: Context) -> list[Finding]:
    account = ctx.account()
    if account is None:
        return []
    model = ctx.step_model()
    parent = ctx.host_tree().parent
    passes = [backward_passes(model, p, parent) for p in model.paths]
    hits = [bp for bp in passes if len(bp.starts) >= 2 and bp.reducing >= 2]
    if not passes or 2 * len(hits) < len(passes):  # in most analysed steps
        return []
    backward = statistics.median(len(bp.starts) for bp in hits)
    reducing = statistics.median(bp.reducing for bp in hits)
    calls = statistics.median(sum(len(c) for c in bp.calls) for bp in hits)
    names = sorted({model.rules.ctx.name(c) for bp in hits for cs in bp.calls for c in cs})
    wrapper = _wrapper(ctx)
    line = sl.line_above(ctx, "grad_sync", lambda: np.asarray([c for bp in hits for cs in bp.calls for c in cs],
                                                                dtype=np.int64))
    reducer = " and the DDP reducer's work there" if wrapper == "DDP" else ""
    p, saving = priced(ctx, Code.REDUCE_EVERY_MICROBATCH, f"with the earlier passes' collectives{reducer} gone")
    hooks = (f", and {wrapper}'s gradient hooks run in every pass: the replay keeps both" if wrapper else
             ": the replay keeps that")
    beside = (f" On this CPU run the backend's threads share the cores with backward{hooks}, so the saving may be "
              "larger." if run_facts(ctx).cpu_only and p is not None and p.saved_ns > 0 else "")
    who = f"{wrapper} " if wrapper else ""
    return [Finding(
        code=Code.REDUCE_EVERY_MICROBATCH, severity=priced_severity(p),
        statement=f"Each step runs backward {backward:g} times (gradient accumulation over micro-batches) and "
                  f"{who}reduces the gradients after {reducing:g} of them ({calls:g} collective calls per step: "
                  f"{', '.join(names[:3])}{sl.named(line, '; under ', '')}), where the optimizer step needs them "
                  "reduced once, after the last."
                  f"{saving}{beside}",
        next_step=_SWITCH.get(wrapper or "", "Skip the collectives on the micro-batches before the last (accumulate "
                              "the gradients locally, reduce them once before the optimizer step)")
        + sl.named(line, " (the backward at ", ")") + ".",
        evidence={"backward_passes_per_step": backward, "reducing_passes_per_step": reducing,
                  "collective_calls_per_step": calls, "collectives": names, "wrapper": wrapper, **sl.evidence(line),
                  **prediction_evidence(p)},
    )]


def _wrapper(ctx: Context) -> str | None:
    """The data-parallel wrapper whose forward block the trace holds (the first of
    ``api_names.DATA_PARALLEL_WRAPPERS`` found), None for none."""
    names = slice_names(ctx)
    return next((wrapper for block, wrapper in api_names.DATA_PARALLEL_WRAPPERS
                 if any(n.startswith(block) for n in names)), None)
