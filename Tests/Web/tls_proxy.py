#!/usr/bin/env python3
"""A TLS-terminating reverse proxy, the way a phone would reach
`blecontrol web` over HTTPS: accepts TLS on 127.0.0.1 (a free port,
printed as "port N") with the given certificate and forwards the bytes to
127.0.0.1:TARGET. Standard library only.

Usage: tls_proxy.py CERT KEY TARGET_PORT
"""
import asyncio
import ssl
import sys


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        pass
    finally:
        writer.close()


async def main(cert, key, target):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    async def serve(client_reader, client_writer):
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, upstream_writer), pipe(upstream_reader, client_writer))

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    print("port", server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
