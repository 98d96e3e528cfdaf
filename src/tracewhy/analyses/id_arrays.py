"""Integer arrays held through a whole diagnosis, kept as int32 where their values fit.

A large export's analyses hold many arrays with a value per slice, instant or edge (slice ids,
node ids, name codes, process ids): on the 606 MB export of ``bench/bench_nsys_scale.py`` (8 M
slices, 16 M instants, 17 M edges) each int64 one is 61-136 MB, and the step account and its
replay window hold about twenty of them until the last prediction. Narrowed, they take half.

What narrowing changes for a reader of the array is its dtype only: indexing with it, comparing
it, ``np.unique``, ``np.isin`` and ``tolist`` give the same answers. Arithmetic does not: a value
computed from an int32 array stays int32 and can wrap, so code that multiplies or packs such
values widens them first (``distinct_rows``).
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt

#: An array of ids or codes: int32 where they fit (``narrow``), else int64.
Ids = npt.NDArray[np.signedinteger[Any]]

I32_MIN: Final = -(2**31)
I32_MAX: Final = 2**31 - 1


def narrow(values: Ids) -> Ids:
    """``values`` as int32 when every one of them fits, else as they are (an empty array:
    int32). Values are never changed, only their width."""
    if values.dtype == np.int32:
        return values
    if values.size and (int(values.max()) > I32_MAX or int(values.min()) < I32_MIN):
        return values
    return values.astype(np.int32)
