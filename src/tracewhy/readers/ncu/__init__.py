"""Nsight Compute output: ``.ncu-rep`` reports (``rep``, through NVIDIA's ``ncu_report`` module)
and CSV exports (``csv_export``), read by ``reader.read_ncu`` into ``model/ncu``'s launches."""
