"""The gateway: HTTP API (OpenAI-compatible + SGLang /generate) in front of the bus.

Public interface:

- :class:`~services.gateway.pipeline.Pipeline` / ``GenerationRequest`` / ``Generation``:
  the HTTP-free request pipeline (reusable by a benchmark client).
- :func:`~services.gateway.app.create_app`: the Starlette app for a pipeline.
- :func:`~services.gateway.server.gateway_body`: the ``run_service`` body (bus + uvicorn).
"""
