"""Nsight Systems input: ``nsys export --type sqlite`` files, plain or gzipped, and reports
exported through ``nsys`` itself, read by ``reader.read_nsys`` into a Trace; ``sniff`` tells them
by content. Nothing is imported here, so that telling a file costs no reader imports."""
