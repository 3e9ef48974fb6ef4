#!/usr/bin/env python3
"""A TCP central that commands channel 0 about 50 times a second until the
file STOP exists, for the reload storm (Tests/BLE/run, step 6f); exits 1 if
its connection broke, and prints how many frames it sent.

Usage: storm_central.py PORT STOP
"""
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts/lib"))
from rig.board import enable_frame, init_frame, servo_frame  # noqa: E402 - scripts/lib: the rigs' frames


def main(port: int, stop: str) -> int:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(init_frame() + enable_frame(0))
    sent, value = 0, 300
    while not os.path.exists(stop):
        try:
            sock.sendall(servo_frame(0, value))
        except OSError as error:
            print("connection broke after %d frames: %s" % (sent, error))
            return 1
        sent += 1
        value = 300 if value >= 700 else value + 10
        time.sleep(0.02)
    print("%d frames" % sent)
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2]))
