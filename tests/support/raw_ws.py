"""A WebSocket client at the byte level, for clients no library would be: one that never
reads what it is sent (with a tiny receive buffer, so the server's writes back up)."""

from __future__ import annotations

import base64
import os
import socket
import struct


def text_frame_header(n: int, mask: bytes) -> bytes:
    """The header of a client-to-server text frame of `n` bytes (clients must mask)."""
    if n < 126:
        return bytes([0x81, 0x80 | n]) + mask
    if n < 1 << 16:
        return bytes([0x81, 0x80 | 126]) + struct.pack("!H", n) + mask
    return bytes([0x81, 0x80 | 127]) + struct.pack("!Q", n) + mask


def masked_text_frame(text: str) -> bytes:
    """One client-to-server text frame."""
    data = text.encode()
    mask = os.urandom(4)
    return text_frame_header(len(data), mask) + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def _read_exactly(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed mid-frame")
        data += chunk
    return data


def read_frame(s: socket.socket) -> tuple[int, bytes]:
    """One server-to-client frame (unmasked, unfragmented): its opcode and payload."""
    first, second = _read_exactly(s, 2)
    n = second & 0x7F
    if n == 126:
        n = struct.unpack("!H", _read_exactly(s, 2))[0]
    elif n == 127:
        n = struct.unpack("!Q", _read_exactly(s, 8))[0]
    return first & 0x0F, _read_exactly(s, n)


def upgrade(port: int, source: str | None = None, rcvbuf: int | None = None, path: str = "/v1/stream",
            timeout: float = 120) -> tuple[socket.socket, bytes]:
    """Send a WebSocket upgrade to 127.0.0.1:port (from local address `source` if given) and read
    the response head: the socket, left just after the head (unread frames, such as `ready`,
    stay in it), and the status line, whatever the status."""
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    if source is not None:
        s.bind((source, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        byte = s.recv(1)
        if not byte:
            break  # closed during the handshake: the status line says what came
        head += byte
    return s, head.split(b"\r\n", 1)[0]


def connect_ws(port: int, rcvbuf: int | None = None, path: str = "/v1/stream") -> socket.socket:
    """Open a WebSocket to 127.0.0.1:port and return the socket just after the 101 (unread
    frames, such as `ready`, stay in the socket)."""
    s, status = upgrade(port, rcvbuf=rcvbuf, path=path)
    if b" 101 " not in status + b" ":
        s.close()
        raise ConnectionError(f"handshake refused: {status!r}")
    return s
