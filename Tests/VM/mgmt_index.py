"""Prints the kernel's Bluetooth management index list: the controllers
bluetoothd would see (one `hciN` a line), the way bluetoothd asks for it
(Read Controller Index List, opcode 0x0003, on the HCI control channel;
BlueZ doc/mgmt-api.txt). A controller whose kernel set-up failed or has
not finished (HCI_SETUP) is left out of this list, though it is in sysfs.
btmgmt asks the same, but waits for a terminal.

Usage: python3 mgmt_index.py   (root; exit 1 when the kernel did not answer)
"""
import ctypes
import select
import socket
import struct
import sys

AF_BLUETOOTH = 31
BTPROTO_HCI = 1
HCI_CHANNEL_CONTROL = 3
HCI_DEV_NONE = 0xFFFF
MGMT_OP_READ_INDEX_LIST = 0x0003
MGMT_EV_CMD_COMPLETE = 0x0001


def main():
    sock = socket.socket(AF_BLUETOOTH, socket.SOCK_RAW | socket.SOCK_CLOEXEC, BTPROTO_HCI)
    # Python's bind() for BTPROTO_HCI takes no channel: struct sockaddr_hci
    # { sa_family_t family; unsigned short dev; unsigned short channel; }.
    libc = ctypes.CDLL(None, use_errno=True)
    address = struct.pack("<HHH", AF_BLUETOOTH, HCI_DEV_NONE, HCI_CHANNEL_CONTROL)
    if libc.bind(sock.fileno(), ctypes.c_char_p(address), len(address)) != 0:
        print("bind to the management channel failed: errno %d" % ctypes.get_errno(), file=sys.stderr)
        return 1
    sock.send(struct.pack("<HHH", MGMT_OP_READ_INDEX_LIST, HCI_DEV_NONE, 0))
    for _ in range(50):  # other events may come first; bounded
        ready, _, _ = select.select([sock], [], [], 5.0)
        if not ready:
            break
        packet = sock.recv(4096)
        event, _, _ = struct.unpack_from("<HHH", packet)
        if event != MGMT_EV_CMD_COMPLETE or len(packet) < 9:
            continue
        opcode, status = struct.unpack_from("<HB", packet, 6)
        if opcode != MGMT_OP_READ_INDEX_LIST:
            continue
        if status != 0:
            print("Read Controller Index List: status %d" % status, file=sys.stderr)
            return 1
        (count,) = struct.unpack_from("<H", packet, 9)
        for index in struct.unpack_from("<%dH" % count, packet, 11):
            print("hci%d" % index)
        return 0
    print("no answer to Read Controller Index List", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
