"""TORCH_LOGS captures (``TORCH_LOGS="graph_breaks,recompiles"``, stderr saved to a file): graph
breaks and recompiles, read by ``reader`` into ``model/torch_logs``'s tables."""
