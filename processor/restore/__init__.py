"""Catch-up, replay and verify: projections rebuilt from runs.facts, and their tuning."""
