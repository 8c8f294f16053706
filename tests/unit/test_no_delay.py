"""Every connection sends at once (`TCP_NODELAY`): with Nagle's algorithm on, a keep-alive
request's response body waited behind its headers for the client's delayed acknowledgement."""

from __future__ import annotations

import asyncio
import socket

from server.cli.run import bind_socket
from server.net.transport import no_delay


def _nodelay(sock) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_connections_accepted_on_the_servers_socket_send_at_once():
    async def accepted_nodelay() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_connect(reader, writer) -> None:
            seen.set_result(_nodelay(writer.get_extra_info("socket")))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=bind_socket("127.0.0.1", 0))
        port = server.sockets[0].getsockname()[1]
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            value = await asyncio.wait_for(seen, 10)
            writer.close()
        return value

    assert asyncio.run(accepted_nodelay()) != 0


def test_no_delay_sets_it_on_a_socket_asyncio_left_alone():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # protocol 0: asyncio skips it
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    async def accepted() -> tuple[int, int]:
        seen: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()

        def on_connect(reader, writer) -> None:
            sock = writer.get_extra_info("socket")
            before = _nodelay(sock)
            no_delay(writer.transport)
            seen.set_result((before, _nodelay(sock)))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=listener)
        async with server:
            _, writer = await asyncio.open_connection(*listener.getsockname())
            result = await asyncio.wait_for(seen, 10)
            writer.close()
        return result

    before, after = asyncio.run(accepted())
    assert before == 0 and after != 0
