"""Length-prefixed JSON over a unix socket: action processes <-> the driver's gateway."""
from __future__ import annotations

import json
import socket
import struct
from typing import Any


def send(conn: socket.socket, obj: Any) -> None:
    body = json.dumps(obj).encode()
    conn.sendall(struct.pack("!I", len(body)) + body)


def recv(conn: socket.socket) -> Any:
    """The next message; None if the peer closed the connection first."""
    header = recv_exactly(conn, 4)
    if header is None:
        return None
    body = recv_exactly(conn, struct.unpack("!I", header)[0])
    return None if body is None else json.loads(body)


def recv_exactly(conn: socket.socket, n: int) -> bytes | None:
    """n bytes from a stream socket; None if the peer closed it first."""
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data
