"""One module per command: what that command computes, for the CLI and the Python API alike."""
