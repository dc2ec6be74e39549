"""Test pipelines and helpers shared by the fault and CLI tests."""
