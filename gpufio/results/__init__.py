"""Results, whatever workload made them: the one renderer, live progress's table, loading,
compare, check, --repeat and plots (each workload builds its own document)."""

# how sure a change must be before it fails the gate (check): at 99%, five runs a side
# suffice; here so the CLI can show it without importing check's NumPy
DEFAULT_CONFIDENCE = 0.99
