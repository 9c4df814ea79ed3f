"""specli serve: OpenAI's and Ollama's HTTP APIs over one Session (FastAPI + uvicorn).

``app`` builds the API; ``openai_api`` (with ``schemas``, its bodies) and ``ollama`` (with
``ollama_schemas``, ``ollama_card``, ``ollama_reply``) are the two APIs' routes; both answer
through ``answer`` on what ``shared`` holds (the served model, errors, prompts, tool-call
set-up); ``toolstream`` splits a streamed answer into content and tool calls; ``worker``
runs the generations from a bounded queue; ``runner`` starts uvicorn."""
