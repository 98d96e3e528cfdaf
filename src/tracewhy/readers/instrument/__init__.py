"""Instrument logs: the JSON Lines ``tracewhy.instrument`` (or any code writing its format)
records, one file per rank, read by ``reader`` into ``model/instrument``'s tables."""
