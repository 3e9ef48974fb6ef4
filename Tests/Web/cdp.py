"""Chromium's DevTools protocol over --remote-debugging-pipe: the browser
reads NUL-terminated JSON commands on its fd 3 and writes replies and events
on its fd 4. Standard library only (no websocket client to pin)."""
import fcntl
import json
import os
import queue
import subprocess
import threading
import time


class ProtocolError(RuntimeError):
    pass


class Chromium:
    def __init__(self, arguments, env=None, log=None):
        to_browser_read, to_browser_write = os.pipe()
        from_browser_read, from_browser_write = os.pipe()
        # The child needs the pipe ends at exactly fds 3 and 4; park them
        # above 4 first so one dup2 cannot overwrite the other's source.
        high_in = fcntl.fcntl(to_browser_read, fcntl.F_DUPFD, 100)
        high_out = fcntl.fcntl(from_browser_write, fcntl.F_DUPFD, 100)
        os.close(to_browser_read)
        os.close(from_browser_write)

        def child_setup():
            os.dup2(high_in, 3)
            os.dup2(high_out, 4)

        self.process = subprocess.Popen(
            arguments + ["--remote-debugging-pipe"], env=env, preexec_fn=child_setup,
            pass_fds=(3, 4), stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True)
        os.close(high_in)
        os.close(high_out)
        self._write = os.fdopen(to_browser_write, "wb", buffering=0)
        self._read = os.fdopen(from_browser_read, "rb", buffering=0)
        self._next_id = 0
        self._pending = {}
        self._lock = threading.Lock()
        self._events = queue.Queue()
        self.history = []  # every event seen, for later checks
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        buffer = b""
        while True:
            try:
                chunk = self._read.read(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._events.put(None)
                with self._lock:
                    for waiter in self._pending.values():
                        waiter.put({"error": {"message": "the browser closed the pipe"}})
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                waiter = None
                with self._lock:
                    if "id" in message:
                        waiter = self._pending.pop(message["id"], None)
                if waiter is not None:
                    waiter.put(message)
                else:
                    self._events.put(message)

    def send(self, method, params=None, session=None, timeout=120):
        """Sends a command and returns its result (raises ProtocolError). The
        timeout only ends a hang: a busy machine may take its time."""
        waiter = queue.Queue()
        with self._lock:
            self._next_id += 1
            message = {"id": self._next_id, "method": method, "params": params or {}}
            if session:
                message["sessionId"] = session
            self._pending[self._next_id] = waiter
            try:
                self._write.write(json.dumps(message).encode() + b"\0")
            except OSError as error:
                raise ProtocolError(method + ": " + str(error))
        try:
            reply = waiter.get(timeout=timeout)
        except queue.Empty:
            raise ProtocolError(method + ": no reply within %d s" % timeout)
        if "error" in reply:
            raise ProtocolError(method + ": " + json.dumps(reply["error"]))
        return reply.get("result", {})

    def pump(self, timeout=0.0):
        """Moves events that arrived into history; returns the new ones."""
        fresh = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                event = self._events.get(timeout=max(0.0, remaining)) if remaining > 0 else self._events.get_nowait()
            except queue.Empty:
                return fresh
            if event is None:
                raise ProtocolError("the browser exited (status %s)" % self.process.poll())
            self.history.append(event)
            fresh.append(event)
            timeout = 0.0
            deadline = time.monotonic()

    def wait_event(self, predicate, since=0, tries=1200, give_up=None):
        """The first event from history[since] on (old or new) for which
        predicate holds, or None once `tries` waits of 0.1 s have brought no
        event (two minutes and more of quiet: bounded by tries, not a clock,
        so a busy machine only stretches the wait), or as soon as `give_up()`,
        asked before each wait, is true (the event will not come)."""
        for event in self.history[since:]:
            if predicate(event):
                return event
        quiet = 0
        while quiet < tries:
            if give_up is not None and give_up():
                return None
            fresh = self.pump(0.1)
            if not fresh:
                quiet += 1
            for event in fresh:
                if predicate(event):
                    return event
        return None

    def close(self):
        try:
            self.send("Browser.close", timeout=30)
        except ProtocolError:
            pass
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
