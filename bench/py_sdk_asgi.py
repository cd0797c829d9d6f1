"""The official Python SDK server (`acp.http.asgi.create_asgi_app`, agent-client-protocol 0.12.1)
hosting the demo agent, as an importable ASGI application for uvicorn or daphne:

    python -m bench.serve_uvicorn bench.py_sdk_asgi:application
    python -m daphne bench.py_sdk_asgi:application
"""

from __future__ import annotations

from acp.http.asgi import create_asgi_app
from demo_project.agent import create_agent

application = create_asgi_app(lambda connection: create_agent())
