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
3. BlueZoo reports a device it already knows without a signal: a second
   scan finds the board again and says nothing. bluetoothd updates the
   device's RSSI with every advertisement it hears while discovering, and
   that is what puts an already-known device in Chromium's chooser: after
   the page disconnected, Connect never listed the board again. Each scan
   that finds a known, unconnected device now changes its RSSI (by one
   dBm, back and forth), as an advertisement heard again would.
4. BlueZoo leaves a disconnected device's GATT objects on the bus and
   exports them again on the next Connect, which sd-bus refuses: the second
   connection failed ("Unknown error when connecting"). bluetoothd, for a
   device that is not bonded, drops them on disconnect and sets
   ServicesResolved false; so does this.
"""
import sys

from bluezoo import adapter, bluezoo, device
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

_add_device = adapter.Adapter.add_device


async def _add_device_heard_again(self, found):
    # (add_device attaches `found` to this adapter, which gives its path.)
    known = self.devices.get("%s/dev_%s" % (self.get_object_path(), found.address.replace(":", "_")))
    await _add_device(self, found)
    if known is not None and not known.connected:
        known.rssi = -50 if known.rssi != -50 else -51
        known.properties_changed.emit(("org.bluez.Device1", {"RSSI": ("n", known.rssi)}, []))


adapter.Adapter.add_device = _add_device_heard_again

_disconnect = device.Device.disconnect


async def _disconnect_forgetting_services(self, uuid=None):
    await _disconnect(self, uuid)
    for link in list(self.services.values()):
        self.peer_adapter.mock.remove_object(link)
    self.services.clear()
    if self.services_resolved:
        await self.ServicesResolved.set_async(False)


device.Device.disconnect = _disconnect_forgetting_services

if __name__ == "__main__":
    sys.argv[0] = "bluezoo"
    sys.exit(bluezoo.main())
