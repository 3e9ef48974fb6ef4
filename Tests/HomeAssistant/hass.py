"""Home Assistant's own APIs, as its frontend and a user's scripts use them:
the REST API (onboarding, tokens, config flows, states, services) and the
websocket API (the device and entity registries). Standard library only,
like the rest of the rigs: the websocket client is the few lines of RFC
6455 a client needs (text frames, masked; pings answered)."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class APIError(Exception):
    """An answer Home Assistant should not have given (its status and body),
    or none at all."""


class AuthInvalid(APIError):
    """The websocket API refused the access token."""


class HomeAssistant:
    """One Home Assistant at `url` (http://HOST:PORT), and the access token
    once onboarding or a login gave one."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.token: "str | None" = None
        # indieauth: a client id is a URL, and the redirect goes to its host.
        self.client_id = self.url + "/"
        self.refresh_token: "str | None" = None

    # --- REST ---

    def request(self, method: str, path: str, body: Any = None, *, form: "dict | None" = None,
                auth: bool = True, timeout: float = 30) -> tuple[int, Any]:
        """(status, decoded JSON or text). A refused connection raises
        APIError; an HTTP error status is returned, not raised. An access
        token that has expired (they last 30 minutes; a run that fails
        waits long) is refreshed once."""
        status, answer = self._request(method, path, body, form, auth, timeout)
        if status == 401 and auth and self.refresh_token:
            self.refresh()
            status, answer = self._request(method, path, body, form, auth, timeout)
        return status, answer

    def _request(self, method: str, path: str, body: Any, form: "dict | None", auth: bool,
                 timeout: float) -> tuple[int, Any]:
        headers = {}
        data = None
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        elif body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if auth and self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        except (OSError, urllib.error.URLError) as error:
            raise APIError(f"{method} {path}: {error}") from None
        text = raw.decode(errors="replace")
        try:
            return status, json.loads(text) if text else None
        except ValueError:
            return status, text

    def call(self, method: str, path: str, body: Any = None, **kwargs) -> Any:
        """request() that wants a 2xx answer: its JSON."""
        status, answer = self.request(method, path, body, **kwargs)
        if not 200 <= status < 300:
            raise APIError(f"{method} {path}: HTTP {status}: {str(answer)[:300]}")
        return answer

    def up(self) -> bool:
        """Whether it has started: its HTTP server listens once every
        integration is set up, and the frontend's manifest needs no token
        (the onboarding views are gone once onboarding is done)."""
        try:
            return self.request("GET", "/manifest.json", auth=False, timeout=5)[0] == 200
        except APIError:
            return False

    # --- Onboarding and tokens: what the frontend does for a new user ---

    def onboard(self, name: str, username: str, password: str) -> None:
        """The four onboarding steps: the owner's account (answered with an
        authorization code, traded for tokens), the core configuration (the
        location as it is), analytics (left off), and the integrations step
        (the frontend's last page)."""
        answer = self.call("POST", "/api/onboarding/users", {
            "client_id": self.client_id, "name": name, "username": username,
            "password": password, "language": "en"}, auth=False)
        self.token_from_code(answer["auth_code"])
        self.call("POST", "/api/onboarding/core_config", {})
        self.call("POST", "/api/onboarding/analytics", {})
        self.call("POST", "/api/onboarding/integration",
                  {"client_id": self.client_id, "redirect_uri": self.client_id + "?auth_callback=1"})

    def token_from_code(self, code: str) -> None:
        answer = self.call("POST", "/auth/token", form={
            "grant_type": "authorization_code", "code": code, "client_id": self.client_id}, auth=False)
        self.token = answer["access_token"]
        self.refresh_token = answer.get("refresh_token")

    def refresh(self) -> None:
        """A new access token from the refresh token (a restart keeps the
        refresh token)."""
        answer = self.call("POST", "/auth/token", form={
            "grant_type": "refresh_token", "refresh_token": self.refresh_token,
            "client_id": self.client_id}, auth=False)
        self.token = answer["access_token"]

    # --- Config flows ---

    def config_flow(self, handler: str, *steps: dict) -> dict:
        """Starts the integration's config flow and answers each form step
        with the next of steps: the flow's last answer (a create_entry when
        it worked)."""
        result = self.call("POST", "/api/config/config_entries/flow",
                           {"handler": handler, "show_advanced_options": False})
        for answer in steps:
            if result.get("type") != "form":
                break
            result = self.call("POST", f"/api/config/config_entries/flow/{result['flow_id']}", answer)
        return result

    # --- States and services ---

    def states(self) -> dict[str, dict]:
        return {state["entity_id"]: state for state in self.call("GET", "/api/states")}

    def service(self, domain: str, name: str, data: dict) -> Any:
        return self.call("POST", f"/api/services/{domain}/{name}", data)

    # --- The websocket API ---

    def ws(self) -> "WebSocket":
        """A websocket session, authenticated with the access token (a
        fresh one if it has expired)."""
        try:
            return WebSocket(self.url, self.token or "")
        except AuthInvalid:
            self.refresh()
            return WebSocket(self.url, self.token or "")


class WebSocket:
    """Home Assistant's websocket API: `command(type, **fields)` sends one
    command and returns its result."""

    def __init__(self, url: str, token: str, timeout: float = 30) -> None:
        parts = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /api/websocket HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise APIError("websocket: closed during the handshake")
            head += chunk
        head, _, self.buffer = head.partition(b"\r\n\r\n")
        status_line = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status_line:
            raise APIError(f"websocket: {status_line.decode(errors='replace')}")
        self.next_id = 0
        if self.receive().get("type") != "auth_required":
            raise APIError("websocket: no auth_required")
        self.send({"type": "auth", "access_token": token})
        answer = self.receive()
        if answer.get("type") == "auth_invalid":
            self.sock.close()
            raise AuthInvalid(f"websocket: {answer}")
        if answer.get("type") != "auth_ok":
            raise APIError(f"websocket: {answer}")

    def close(self) -> None:
        try:
            self._frame(0x8, b"")
        except OSError:
            pass
        self.sock.close()

    def __enter__(self) -> "WebSocket":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def command(self, kind: str, **fields: Any) -> Any:
        self.next_id += 1
        self.send({"id": self.next_id, "type": kind, **fields})
        while True:
            answer = self.receive()
            if answer.get("id") == self.next_id and answer.get("type") == "result":
                if not answer.get("success"):
                    raise APIError(f"websocket {kind}: {answer.get('error')}")
                return answer.get("result")

    def send(self, message: dict) -> None:
        self._frame(0x1, json.dumps(message).encode())

    def _frame(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        length = len(payload)
        if length < 126:
            header = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
        elif length < 1 << 16:
            header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
        masked = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def _read(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise APIError("websocket: closed by Home Assistant")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def receive(self) -> dict:
        """The next JSON message (a message may be fragmented; pings are
        answered on the way)."""
        message = b""
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack("!H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", self._read(8))[0]
            payload = self._read(length)  # a server's frames are not masked
            opcode = first & 0x0F
            if opcode == 0x9:
                self._frame(0xA, payload)
                continue
            if opcode == 0x8:
                raise APIError("websocket: closed by Home Assistant")
            if opcode in (0x0, 0x1, 0x2):
                message += payload
                if first & 0x80:
                    return json.loads(message)
