"""The wire: the WebSocket protocol's messages and frames, their fixed sizes, and the HTTP
speech body (`docs/protocol.md`)."""
