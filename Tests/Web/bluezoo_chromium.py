#!/usr/bin/env python3
"""BlueZoo (pinned in Tests/BLE/requirements.txt) as Chromium needs it: the
command line is bluezoo's own; two gaps between BlueZoo 1.0.2 and a real
bluetoothd that Chromium trips over are filled at run time.

1. BlueZoo reports every discovered device with an empty AdvertisingFlags
   array. bluetoothd sends that property only with the flags byte of an
   advertisement, and Chromium's BlueZ backend reads its first byte
   unchecked: the browser dies of SIGILL (a hardened-libc++ bounds trap) as
   soon as a scan finds the board. Devices get the flags an LE-only,
   general-discoverable peripheral advertises (0x06).
2. BlueZoo mirrors a peripheral's characteristics to the central without
   the Client Characteristic Configuration descriptor (0x2902) that
   bluetoothd's GATT server adds to every notifying characteristic.
   Chromium insists on finding exactly one before it calls StartNotify, so
   startNotifications() failed with NotSupportedError. Each mirrored
   characteristic that notifies or indicates gets one; Chromium never
   reads or writes it on BlueZ (StartNotify does the work).
"""
import sys

from bluezoo import bluezoo, device
from bluezoo.gatt import GattCharacteristicClientLink, GattDescriptorClientLink

LE_GENERAL_DISCOVERABLE_NO_BREDR = b"\x06"
CCC_UUID = "00002902-0000-1000-8000-00805f9b34fb"

_device_init = device.Device.__init__


def _device_init_with_flags(self, *args, **kwargs):
    _device_init(self, *args, **kwargs)
    if not self.advertising_flags:
        self.advertising_flags = LE_GENERAL_DISCOVERABLE_NO_BREDR


device.Device.__init__ = _device_init_with_flags


class _Constant:
    """Looks like one of sdbus's client-side properties: .get(default)."""

    def __init__(self, value):
        self.value = value

    def get(self, default=None):
        return self.value


class _ConfigurationDescriptor:
    """The remote side of a synthetic 0x2902 descriptor (notifications off)."""

    def __init__(self, handle):
        self.UUID = _Constant(CCC_UUID)
        self.Handle = _Constant(handle)
        self.Value = _Constant(b"\x00\x00")
        self.Flags = _Constant(["read", "write"])

    async def ReadValue(self, options):
        return b"\x00\x00"

    async def WriteValue(self, value, options):
        return None


_export_object = bluezoo.BluezMockService.export_object


def _export_object_with_ccc(self, path, obj):
    _export_object(self, path, obj)
    if isinstance(obj, GattCharacteristicClientLink) and {"notify", "indicate"} & set(obj.client.Flags.get([])):
        descriptor = GattDescriptorClientLink(_ConfigurationDescriptor(obj.client.Handle.get() + 1), obj)
        _export_object(self, descriptor.get_object_path(), descriptor)
        obj.service.device.services[descriptor.get_object_path()] = descriptor


bluezoo.BluezMockService.export_object = _export_object_with_ccc

if __name__ == "__main__":
    sys.argv[0] = "bluezoo"
    sys.exit(bluezoo.main())
