"""acp-channels: serve Agent Client Protocol agents over HTTP+SSE and WebSocket from Django."""

__version__ = "0.1.0"
