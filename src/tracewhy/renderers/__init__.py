"""Turn finished results into text: terminal tables, the one JSON envelope, the HTML report and the
Perfetto export (annotated traces)."""
