"""Turn finished results into text: terminal tables, versioned JSON (later: HTML, annotated traces)."""
