"""specli serve: an OpenAI-compatible HTTP API over one Session (FastAPI + uvicorn).

``app`` builds the API, ``worker`` runs one generation at a time from a bounded queue,
``runner`` starts uvicorn, ``schemas`` holds the request and response bodies."""
