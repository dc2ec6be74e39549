"""Telemetry at the edge: Prometheus metrics (``metrics``), structured logs (``logs``)
and OpenTelemetry spans (``tracing``). The pure core (facts, model, admission) never
imports it."""
