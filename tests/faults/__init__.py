"""Fault tests: crashes, garbage input, retries and lost attempts."""
