"""OpenAI-compatible HTTP server over the engine (`shrike serve`)."""
