"""Telemetry: Prometheus metrics (``metrics``), shared by the engine, workers and restore."""
