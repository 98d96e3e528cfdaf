"""One module per question; each is a pure function from a Trace to a typed result."""
