"""An iPhone-like central for the VM tier (issue 19): what a real iPhone does
to a BlueZ peripheral that a polite test central does not.

- Its own GATT server, as iOS exposes one: Battery (Battery Level readable
  only on an authenticated link: iOS answers an unpaired read with
  Insufficient Authentication), Current Time, Device Information (with a
  PnP ID) and Apple's vendor services (ANCS, Continuity).
- A new resolvable private address for every connection.
- MTU 185, and writes without response in bursts paced like a 15 ms
  connection interval.
- It never answers an SMP Security Request: a real iPhone shows a pairing
  pop-up instead, which is what a board in open mode must never cause.

The phase runs the demo app's session twice against the real bluetoothd
5.66: as Debian starts it (no settings of ours), where bluetoothd's own GATT
client reads Battery Level and asks for security (the pop-up, proved here so
that the check can see it), and with the arguments the package's drop-in
for bluetooth.service gives it (systemd/bluetooth-blecontrol.conf), where
nothing may ask for security.

Synchronisation, not sleeps: bluetoothd's plugins read the phone's
characteristics in handle order once its discovery is done (Battery before
Device Information here), so once the PnP ID read has arrived, a Battery
Level read would already have arrived too.
"""
import asyncio
import time

from rig.board import enable_frame, lcd_text_frame, pwm_frame, servo_frame, switch_frame  # scripts/lib, on the path ble_central.py set

from bumble import hci
from bumble.core import UUID
from bumble.gatt import (
    GATT_BATTERY_LEVEL_CHARACTERISTIC,
    GATT_BATTERY_SERVICE,
    GATT_CURRENT_TIME_CHARACTERISTIC,
    GATT_CURRENT_TIME_SERVICE,
    GATT_DEVICE_INFORMATION_SERVICE,
    GATT_MANUFACTURER_NAME_STRING_CHARACTERISTIC,
    GATT_MODEL_NUMBER_STRING_CHARACTERISTIC,
    GATT_PNP_ID_CHARACTERISTIC,
    Characteristic,
    Service,
)

READ = Characteristic.Properties.READ
NOTIFY = Characteristic.Properties.NOTIFY
WRITE = Characteristic.Properties.WRITE


class Watched(Characteristic):
    """A characteristic that counts the reads asked of it (before the
    permission check, so refused reads count) and wakes waiters."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads = 0
        self.read_event = asyncio.Event()

    async def read_value(self, bearer):
        self.reads += 1
        self.read_event.set()
        return await super().read_value(bearer)


def shared(device):
    """The one IPhone of `device` (its services can be added only once)."""
    if getattr(device, "blecontrol_phone", None) is None:
        device.blecontrol_phone = IPhone(device)
    return device.blecontrol_phone


class IPhone:
    """The phone's side: its GATT database and what it saw."""

    def __init__(self, device):
        self.device = device
        self.battery = Watched(GATT_BATTERY_LEVEL_CHARACTERISTIC, READ | NOTIFY,
                               Characteristic.READ_REQUIRES_AUTHENTICATION, bytes([87]))
        self.pnp_id = Watched(GATT_PNP_ID_CHARACTERISTIC, READ, Characteristic.READABLE,
                              bytes([0x02, 0xAC, 0x05, 0x2C, 0x12, 0x00, 0x01]))  # USB IF, Apple 0x05AC
        # Handle order matters (see the module's text): Battery first.
        device.add_services([
            Service(GATT_BATTERY_SERVICE, [self.battery]),
            Service(GATT_CURRENT_TIME_SERVICE, [
                Characteristic(GATT_CURRENT_TIME_CHARACTERISTIC, READ | NOTIFY, Characteristic.READABLE, bytes(10)),
            ]),
            Service(GATT_DEVICE_INFORMATION_SERVICE, [
                Characteristic(GATT_MANUFACTURER_NAME_STRING_CHARACTERISTIC, READ, Characteristic.READABLE, b"Apple Inc."),
                Characteristic(GATT_MODEL_NUMBER_STRING_CHARACTERISTIC, READ, Characteristic.READABLE, b"iPhone15,2"),
                self.pnp_id,
            ]),
            # Apple Notification Center Service: its sources need encryption.
            Service(UUID("7905F431-B5CE-4E99-A40F-4B1E122D00D0"), [
                Characteristic(UUID("9FBF120D-6301-42D9-8C58-25E699A21DBD"), NOTIFY, Characteristic.READ_REQUIRES_ENCRYPTION, b""),
                Characteristic(UUID("69D1D8F3-45E1-49A8-9821-9BBDFDAAD9D9"), WRITE, Characteristic.WRITE_REQUIRES_ENCRYPTION, b""),
            ]),
            # Continuity.
            Service(UUID("D0611E78-BBB4-4591-A5F8-487910AE4366"), [
                Characteristic(UUID("8667556C-9A37-4C91-84ED-54EE27D90049"), WRITE | NOTIFY,
                               Characteristic.WRITE_REQUIRES_ENCRYPTION, b""),
            ]),
        ])
        self.security_requests = []
        self.security_event = asyncio.Event()
        self.addresses = []
        device.on("connection", self._on_connection)

    def _on_connection(self, connection):
        def on_security_request(auth_req):
            # A real iPhone shows the pairing pop-up here; this one only counts.
            self.security_requests.append((time.monotonic(), auth_req))
            self.security_event.set()
        connection.on(connection.EVENT_SECURITY_REQUEST, on_security_request)

    def reset(self):
        self.battery.reads = 0
        self.pnp_id.reads = 0
        self.battery.read_event.clear()
        self.pnp_id.read_event.clear()
        self.security_requests.clear()
        self.security_event.clear()

    async def rotate_address(self):
        """A new resolvable private address, as iOS uses for each connection."""
        address = hci.Address.generate_private_address(self.device.irk)
        await self.device.send_command(hci.HCI_LE_Set_Random_Address_Command(random_address=address), check_result=True)
        self.device.random_address = address
        self.addresses.append(str(address))
        return address


# The original demo app's session (docs/protocol.md, "The original demo
# app's layout"): channels 0-7 enabled with response; servo sliders 0-3 and
# PWM sliders 4-7 resent in full whenever one moves, without response; the
# four switches without response; two LCD lines with response.
def demo_session(label=b"central"):
    frames = []
    for ch in range(8):
        frames.append((enable_frame(ch), True))
    for step in (0, 250, 500, 750, 1000, 600):
        for ch in range(4):
            frames.append((servo_frame(ch, step), False))
    for step in (0, 500, 1000, -500):
        value = step & 0xFFFF  # the app's Int16, two's complement
        for ch in range(4, 8):
            frames.append((pwm_frame(ch, value), False))
    for sw in range(4):
        frames.append((switch_frame(sw, True), False))
    for line, text in ((0, b"iPhone-like"), (1, label)):
        frames.append((lcd_text_frame(line, text), True))
    return frames


async def run_session(char, interval_s, label=b"central"):
    """Writes the session: with response waits for its answer (an error
    answer raises); without response in bursts paced at the connection
    interval, as iOS queues them."""
    answered = 0
    for frame, with_response in demo_session(label):
        if with_response:
            await char.write_value(frame, with_response=True)
            answered += 1
        else:
            await char.write_value(frame, with_response=False)
            await asyncio.sleep(interval_s)
    return answered
