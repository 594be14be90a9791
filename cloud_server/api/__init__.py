"""OpenAI-compatible HTTP API of the cloud server (FastAPI)."""
