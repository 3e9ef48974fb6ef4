"""A small WebSocket client (RFC 6455) for `blecontrol web`'s bridge: what a
page does, and what a page elsewhere or a local user without the token would
try. Standard library only.

    python3 bridge_client.py PORT TOKEN HEX...   # send frames, print answers
"""
import base64
import json
import os
import socket
import struct
import sys


class Refused(Exception):
    """The server answered the handshake with an HTTP status, not 101."""

    def __init__(self, status, body):
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


class Bridge:
    def __init__(self, port, token=None, origin=None, host="127.0.0.1", path="/bridge", version="13", timeout=20.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        query = f"?token={token}" if token is not None else ""
        key = base64.b64encode(os.urandom(16)).decode()
        origin = origin if origin is not None else f"http://{host}:{port}"
        lines = [f"GET {path}{query} HTTP/1.1", f"Host: {host}:{port}", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Key: {key}", f"Sec-WebSocket-Version: {version}"]
        if origin:
            lines.append(f"Origin: {origin}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            head += chunk
        head, _, self.buffer = head.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
        if status != 101:
            body = self.buffer
            try:
                while True:
                    chunk = self.sock.recv(4096)
                    if not chunk:
                        break
                    body += chunk
            except OSError:
                pass
            self.sock.close()
            raise Refused(status, body.decode(errors="replace").strip())
        import hashlib
        expected = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        if f"Sec-WebSocket-Accept: {expected}".encode() not in head:
            raise Refused(101, "wrong Sec-WebSocket-Accept")

    def send_frame(self, opcode, payload, masked=True, final=True):
        self.sock.sendall(self.frame(opcode, payload, masked, final))

    @staticmethod
    def frame(opcode, payload, masked=True, final=True):
        """One client frame's bytes."""
        header = bytes([(0x80 if final else 0) | opcode])
        length = len(payload)
        mask_bit = 0x80 if masked else 0
        if length < 126:
            header += bytes([mask_bit | length])
        elif length <= 0xFFFF:
            header += bytes([mask_bit | 126]) + struct.pack(">H", length)
        else:
            header += bytes([mask_bit | 127]) + struct.pack(">Q", length)
        if masked:
            mask = os.urandom(4)
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            header += mask
        return header + payload

    def send(self, data):
        self.send_frame(0x2, bytes(data))

    def _read(self, count):
        while len(self.buffer) < count:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the bridge closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def receive(self):
        """The next message: ('text', object), ('binary', bytes), ('close', code) or ('ping', b'')."""
        first, second = self._read(2)
        opcode = first & 0x0F
        length = second & 0x7F
        if length == 126:
            length = struct.unpack(">H", self._read(2))[0]
        elif length == 127:
            length = struct.unpack(">Q", self._read(8))[0]
        payload = self._read(length)
        if opcode == 0x1:
            return "text", json.loads(payload)
        if opcode == 0x2:
            return "binary", payload
        if opcode == 0x8:
            return "close", struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else None
        if opcode == 0x9:
            self.send_frame(0xA, payload)
            return "ping", payload
        return "other", payload

    def write(self, data):
        """Sends frames; returns (replies, answer) once the bridge says they were applied."""
        self.send(data)
        replies = b""
        while True:
            kind, value = self.receive()
            if kind == "binary":
                replies += value
            elif kind == "text" and "applied" in value:
                return replies, value
            elif kind == "close":
                raise EOFError(f"closed with {value}")

    def state(self, predicate=lambda state: True, tries=200):
        """The next state message that satisfies predicate."""
        for _ in range(tries):
            kind, value = self.receive()
            if kind == "text" and "state" in value and predicate(value["state"]):
                return value["state"]
            if kind == "close":
                raise EOFError(f"closed with {value}")
        raise TimeoutError("no such state")

    def close(self):
        try:
            self.send_frame(0x8, struct.pack(">H", 1000))
        except OSError:
            pass
        self.sock.close()


if __name__ == "__main__":
    bridge = Bridge(int(sys.argv[1]), sys.argv[2])
    for text in sys.argv[3:]:
        print(bridge.write(bytes.fromhex(text)))
    print(bridge.state())
    bridge.close()
