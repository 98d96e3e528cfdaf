"""Compiled kernel frames in the step account: host time inside the frame of a compiled kernel
(``kernel_lines``, from the compile record's provenance) belongs to the source line the kernel
is named by, not to the frame it ran under. Their codes sit below -1 so they never meet a
slice's name code."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]


class CompiledFrames:
    """Compiled kernel frames (slice id) and the source line each is named by."""

    def __init__(self, lines_of: dict[int, str] | None) -> None:
        self.lines_of = lines_of or {}
        self.ids = np.array(sorted(self.lines_of), dtype=np.int64)
        labels = sorted(set(self.lines_of.values()))
        self._code = {sid: -2 - labels.index(label) for sid, label in self.lines_of.items()}

    def codes(self, frames: I64, name_codes: I64) -> I64:
        """``name_codes`` of these frames, a compiled kernel frame's replaced by its line's."""
        if self.lines_of:
            at = np.flatnonzero(np.isin(frames, self.ids))
            name_codes[at] = [self._code[int(f)] for f in frames[at].tolist()]
        return name_codes

    def frame_or(self, inner: I64, frame: I64) -> I64:
        """The innermost slice where it is a compiled kernel frame, else the user frame."""
        return np.where(np.isin(inner, self.ids), inner, frame)
