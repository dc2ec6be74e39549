"""The HTTP layer: the FastAPI app (``app``), its uvicorn thread (``server``),
metrics and health, wired to a running processor or worker (``wiring``)."""
