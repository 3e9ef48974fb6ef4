"""What Home Assistant must show for the tier's board: the device and every
entity, from the board's outputs. The one table of the tier's expectations
(the checks only compare): change a name, a unit or an icon here.

The board is board/simulator.yaml with a few outputs named (TIER_BOARD
below; Tests/HomeAssistant/board.py writes its file). Entities are found by
unique id (`blecontrol_<board>_<object>`), which never changes; their entity
ids follow the names Home Assistant was first given and are only read from
the registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

MANUFACTURER = "BLEControl for Linux"
# The simulator's model; on a Raspberry Pi the device tree's model.
MODEL = "BLEControl simulator"
# transports.mqtt.configuration_url of the tier's board file (the board's
# control page, as `blecontrol web` would serve it).
CONFIGURATION_URL = "http://127.0.0.1:8000/"

# Microseconds as Home Assistant writes them: GREEK SMALL LETTER MU (U+03BC),
# its UnitOfTime.MICROSECONDS. A MICRO SIGN (U+00B5) from the board is
# mapped to it (the MQTT number's AMBIGUOUS_UNITS), silently.
MICROSECONDS = "\u03bcs"

# The PCA9685's resolution at 50 Hz: 20000 µs / 4096 counts (datasheet
# §7.3.3); the emulated chip's pulse is within one count of what was asked.
PULSE_TOLERANCE_US = 5.0


@dataclass(frozen=True)
class Channel:
    channel: int
    role: str                      # servo | esc | pwm
    min_us: int = 1000
    max_us: int = 2000
    center_us: Optional[int] = None
    name: Optional[str] = None

    @property
    def label(self) -> str:
        """The name a user reads: its `name:`, else the role and number."""
        return self.name or {"servo": "Servo", "esc": "ESC", "pwm": "PWM"}[self.role] + f" {self.channel}"

    @property
    def object_id(self) -> str:
        return f"{'pwm' if self.role == 'pwm' else 'servo'}_{self.channel}"

    def pulse_us(self, value: int) -> float:
        """The pulse SERVO_VAL `value` asks for: nominal 1000/1500/2000 µs
        (0/500/1000) land on min_us/center_us/max_us (docs/protocol.md)."""
        center = self.center_us if self.center_us is not None else (self.min_us + self.max_us) / 2
        if value <= 500:
            return self.min_us + (center - self.min_us) * value / 500
        return center + (self.max_us - center) * (value - 500) / 500


@dataclass(frozen=True)
class Switch:
    switch: int
    name: Optional[str] = None

    @property
    def label(self) -> str:
        return self.name or f"Switch {self.switch}"


@dataclass(frozen=True)
class LCD:
    columns: int
    rows: int
    line_names: tuple = ()

    def label(self, row: int) -> str:
        return self.line_names[row] if row < len(self.line_names) else f"LCD line {row}"


@dataclass(frozen=True)
class Board:
    name: str
    channels: tuple
    switches: tuple
    lcd: Optional[LCD]

    @property
    def node(self) -> str:
        return f"blecontrol_{self.name}"

    def channel(self, number: int) -> Channel:
        return next(item for item in self.channels if item.channel == number)

    def without(self, number: int) -> "Board":
        return Board(self.name, tuple(item for item in self.channels if item.channel != number),
                     self.switches, self.lcd)


# The tier's board: board/simulator.yaml, with these names added.
TIER_BOARD = Board(
    name="simulator",
    channels=(
        Channel(0, "servo", name="steering"),
        Channel(1, "servo"),
        Channel(2, "servo"),
        Channel(3, "servo"),
        Channel(4, "pwm", name="headlights"),
        Channel(5, "pwm"),
        Channel(6, "pwm"),
        Channel(7, "pwm"),
    ),
    switches=(Switch(0), Switch(1, name="horn"), Switch(2), Switch(3)),
    lcd=LCD(columns=16, rows=2, line_names=("Top line", "Bottom line")),
)


def device(board: Board, version: str) -> dict:
    """The device registry's fields for the board (None: not set)."""
    return {
        "name": board.name,
        "manufacturer": MANUFACTURER,
        "model": MODEL,
        "serial_number": None,     # the simulator has none; a Pi its own
        "sw_version": version,     # blecontrold --version
        "configuration_url": CONFIGURATION_URL,
    }


@dataclass(frozen=True)
class Entity:
    """One entity as Home Assistant must register and show it."""
    domain: str
    object_id: str                 # the unique id is NODE_OBJECT
    name: str                      # the registry's original_name
    icon: Optional[str] = None
    category: Optional[str] = None  # None, "config" or "diagnostic"
    unit: Optional[str] = None     # the state's unit_of_measurement
    device_class: Optional[str] = None
    capabilities: dict = field(default_factory=dict, hash=False)

    def unique_id(self, board: Board) -> str:
        return f"{board.node}_{self.object_id}"


def entities(board: Board) -> list[Entity]:
    found: list[Entity] = []
    for item in board.channels:
        if item.role == "pwm":
            found.append(Entity("number", item.object_id, item.label, icon="mdi:square-wave", unit="%",
                                capabilities={"min": 0, "max": 100, "step": 0.1}))
        else:
            icon = "mdi:engine" if item.role == "esc" else "mdi:axis-arrow"
            found.append(Entity("number", item.object_id, item.label, icon=icon, unit=MICROSECONDS,
                                capabilities={"min": item.min_us, "max": item.max_us, "step": 1}))
            # Where it has got to (the number is where it is going), and the
            # transition of the commands that give none.
            found.append(Entity("sensor", f"position_{item.channel}", f"{item.label} position", icon=icon,
                                category="diagnostic", unit=MICROSECONDS, capabilities={"state_class": "measurement"}))
            found.append(Entity("number", f"transition_{item.channel}", f"{item.label} transition", icon="mdi:timer-outline",
                                category="config", unit="s", capabilities={"min": 0, "max": 600, "step": 0.1}))
        found.append(Entity("switch", f"enable_{item.channel}", f"{item.label} output", icon="mdi:power",
                            category="config"))
    for item in board.switches:
        found.append(Entity("switch", f"switch_{item.switch}", item.label, icon="mdi:toggle-switch-outline"))
    if board.lcd:
        for row in range(board.lcd.rows):
            found.append(Entity("text", f"lcd_{row}", board.lcd.label(row), icon="mdi:card-text-outline",
                                capabilities={"max": board.lcd.columns}))
    found.append(Entity("binary_sensor", "failsafe", "Failsafe", category="diagnostic", device_class="problem"))
    return found


# The state of an output never commanded since the board started.
NEVER_COMMANDED = "unknown"
# The failsafe's attribute with its reason, and how the reason starts after
# a TCP central that commanded an output disconnects.
FAILSAFE_REASON_ATTRIBUTE = "reason"
CENTRAL_LEFT = "central left:"


def servo_state(channel: Channel, value: int) -> float:
    """A servo or ESC number's state after SERVO_VAL `value`: the pulse in µs."""
    return channel.pulse_us(value)


def pwm_state(value: int) -> float:
    """A PWM number's state after PWM_VAL `value`: the duty in %."""
    return value / 10
