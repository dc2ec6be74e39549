"""The processor loop (the one place that orders effects) and the host that runs it."""
