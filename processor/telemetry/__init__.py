"""Telemetry at the edge: structured logs and OpenTelemetry spans (and, from the
``http`` work, metrics). The pure core (facts, model, admission) never imports it."""
