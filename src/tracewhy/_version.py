"""The tool's version, in a module that imports nothing: the package root re-exports it, and the
parse cache (``model/cache.py``) keys its entries by it without importing the root, which would
pull the readers into the model layer, or asking the installed metadata (a search of every
distribution on ``sys.path``, 10-20 ms of each cache hit)."""

__version__ = "0.1.0"
