"""A WebSocket client at the byte level, for clients no library would be: one that never
reads what it is sent (with a tiny receive buffer, so the server's writes back up)."""

from __future__ import annotations

import base64
import os
import socket
import struct


def masked_text_frame(text: str) -> bytes:
    """One client-to-server text frame (clients must mask)."""
    data = text.encode()
    mask = os.urandom(4)
    n = len(data)
    if n < 126:
        head = bytes([0x81, 0x80 | n])
    elif n < 1 << 16:
        head = bytes([0x81, 0x80 | 126]) + struct.pack("!H", n)
    else:
        head = bytes([0x81, 0x80 | 127]) + struct.pack("!Q", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def connect_ws(port: int, rcvbuf: int | None = None, path: str = "/v1/stream") -> socket.socket:
    """Open a WebSocket to 127.0.0.1:port and return the socket just after the 101 (unread
    frames, such as `ready`, stay in the socket)."""
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(120)
    s.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        byte = s.recv(1)
        if not byte:
            raise ConnectionError(f"closed during the handshake: {head!r}")
        head += byte
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        raise ConnectionError(f"handshake refused: {head!r}")
    return s
