"""Reading back the pickles tracewhy's own helper processes make of tracewhy's own objects: the
Kineto reader's parts (``readers/kineto/parallel``) and a small diff's run B
(``reports/diff_elsewhere``), and the job the command gives that helper.

The unpickler builds only what those pickles hold: tracewhy's classes, polars' frames and
series, numpy's arrays and dtypes, and paths. A pickle that names anything else (a function such
as ``os.system``, the way a pickle runs code) is refused with ``pickle.UnpicklingError``, which
the callers take as a failed helper: the command then does that work itself. So even a helper
made to write something else could not run code in the command. No trace file is read this way
(the memory snapshot reader has its own unpickler, which builds plain data only:
``readers/memory/snapshot.py``). Standard library only.
"""

from __future__ import annotations

import io
import pickle
from typing import IO, Final

#: The package whose classes are built, any of them.
_OWN: Final = "tracewhy"
#: Everything else a pickle of ours may name: what numpy's arrays, polars' frames and paths
#: pickle as (``numpy.core`` is numpy 1's name of ``numpy._core``).
_OTHERS: Final = frozenset({
    ("numpy", "dtype"), ("numpy", "ndarray"),
    *((core, name) for core in ("numpy._core.multiarray", "numpy.core.multiarray")
      for name in ("_reconstruct", "scalar")),
    *((core, "_frombuffer") for core in ("numpy._core.numeric", "numpy.core.numeric")),
    ("polars.dataframe.frame", "DataFrame"), ("polars.series.series", "Series"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
})


class _OwnObjects(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if (module, name) in _OTHERS:
            return super().find_class(module, name)
        if module == _OWN or module.startswith(_OWN + "."):
            found = super().find_class(module, name)
            if isinstance(found, type):  # (a class: a function of ours is never pickled)
                return found
        raise pickle.UnpicklingError(f"not one of tracewhy's own objects: {module}.{name}")


def load(stream: IO[bytes]) -> object:
    """The next object pickled on ``stream``; ``pickle.UnpicklingError`` for anything else."""
    return _OwnObjects(stream).load()


def loads(data: bytes) -> object:
    return load(io.BytesIO(data))
