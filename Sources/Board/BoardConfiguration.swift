import Devices
import Hardware

/// Everything a board file says, validated. Built only by ``BoardFile``;
/// every value in here is already known to be usable.
public struct BoardConfiguration: Sendable, Equatable {
    /// A name for logs and status (`simulator`, `raspberry-pi`, …).
    public var name: String
    /// I2C buses by the name the devices refer to them with.
    public var buses: [String: BusConfiguration]
    /// The PCA9685 and its channels, if the board has one.
    public var servo: ServoConfiguration?
    /// The HD44780 on its PCF8574 backpack, if the board has one.
    public var lcd: LCDConfiguration?
    /// The status LED, if the board has one.
    public var led: LEDConfiguration?
    /// Digital outputs SWITCH_VAL drives, by switch index.
    public var switches: [SwitchConfiguration] = []
    /// The BLE peripheral's settings.
    public var ble: BLEConfiguration
    /// The TCP transport, nil when disabled.
    public var tcp: TCPConfiguration?
    /// The HM-10 serial transport, nil when there is none.
    public var serial: SerialConfiguration? = nil
    /// The MQTT transport, nil when there is none.
    public var mqtt: MQTTConfiguration? = nil
    /// Where the control socket for `blecontrol` listens.
    public var controlSocketPath: String
    /// A partial frame older than this is discarded (docs/protocol.md); nil: never.
    public var protocolIdleTimeout: Duration?
    /// No frame from any central for this long triggers the failsafe; nil: off.
    public var silenceTimeout: Duration?
    /// The servo thread inside one bus transfer this long is a stall: failsafe.
    public var stallTimeout: Duration
    /// The PCA9685 failing this long triggers the failsafe.
    public var faultTimeout: Duration
    /// SCHED_FIFO priority of the servo thread (1…99); 0: default scheduler.
    public var realtimePriority: Int32
    /// Lock the daemon's memory (mlockall) so the servo path never page-faults.
    public var lockMemory: Bool
    /// The file this came from, for messages.
    public var sourcePath: String
}

/// One I2C bus.
public struct BusConfiguration: Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        /// An in-process emulated bus with the board's emulated devices.
        case emulated
        /// A Linux i2c-dev character device such as `/dev/i2c-1`.
        case device(path: String)
        /// The Linux adapter with this name in sysfs (`/sys/bus/i2c/devices/
        /// i2c-N/name`, e.g. "bcm2835 (i2c@7e804000)"), whose i2c-dev node is
        /// looked up each time the bus is opened (`LinuxI2CBus.devicePath(adapterNamed:)`):
        /// adapter numbers depend on the kernel and its device tree, names do not.
        case adapter(name: String)
    }
    public var kind: Kind
    /// Emulated buses only: how long each byte occupies the bus, so the
    /// simulator can behave like a 100 kHz bus (about 90 µs per byte).
    public var byteTime: Duration = .zero
    /// The longest single write the adapter accepts (some SMBus-only
    /// adapters stop at 32 bytes); nil: no limit known.
    public var maxWriteLength: Int?
}

/// What a servo-path channel does when its controller is gone (issue #5
/// builds the engine; the board file already says the policy).
public enum FailsafeAction: Sendable, Equatable, CustomStringConvertible {
    /// Keep the last pulse (servo default: a steering servo stays put).
    case hold
    /// Stop producing pulses (ESC and PWM default).
    case off
    /// Go to this pulse width.
    case pulse(Microseconds)

    public var description: String {
        switch self {
        case .hold: return "hold"
        case .off: return "off"
        case .pulse(let width): return "\(Int(width.value)) us"
        }
    }
}

/// The role of a channel decides how values are limited and what the
/// failsafe does.
public enum ChannelRole: String, Sendable, Equatable, CaseIterable, CustomStringConvertible {
    case servo, esc, pwm
    public var description: String { rawValue }
}

/// How fast a channel's pulse may change (`speed_us_per_s`,
/// `accel_us_per_s2`): the servo thread moves it there once per PWM period
/// along a profile within these limits. An ESC's throttle ramp is the same
/// slew limit. Either may be absent; both absent, the pulse jumps.
public struct MotionLimits: Sendable, Equatable {
    /// µs per second; nil: no limit.
    public var speed: Double?
    /// µs per second²; nil: no limit (the speed changes at once).
    public var acceleration: Double?

    public init(speed: Double? = nil, acceleration: Double? = nil) {
        self.speed = speed
        self.acceleration = acceleration
    }

    /// No limit at all: every value is written as it comes.
    public var isUnlimited: Bool { speed == nil && acceleration == nil }
}

/// One protocol channel and the PCA9685 output it drives.
public struct ChannelConfiguration: Sendable, Equatable {
    /// The channel number centrals use (docs/protocol.md `ch`).
    public var channel: Int
    /// The PCA9685 output pin (LED0…LED15).
    public var output: Int
    public var role: ChannelRole
    /// The safe pulse range for servo and ESC channels.
    public var minimum: Microseconds
    public var center: Microseconds
    public var maximum: Microseconds
    /// Mirror values around the centre of the range (servo mounted reversed).
    public var invert: Bool
    public var failsafe: FailsafeAction
    /// How long an ESC failsafe holds its neutral pulse before pulses stop.
    public var failsafeDwell: Duration
    /// Which PCA9685 of the board (index into ``ServoConfiguration/chips``).
    public var chip: Int = 0
    /// What the user calls it ("steering", "throttle"): shown by Home
    /// Assistant, `blecontrol status` and `watch`; nil: "Servo N" and the like.
    public var name: String?
    /// How fast its pulse may move (servo and ESC channels); none: it
    /// jumps to each new value, as the original board's did.
    public var motion: MotionLimits
    /// `start_us`: the pulse the channel produces from start-up, enabled,
    /// so its first move starts from a known place; nil: no pulses until a
    /// central enables it (the original board's way).
    public var start: Microseconds?
    /// `release_after_ms` (servo channels): once the servo has been still
    /// this long its pulses stop (no buzz, less current); the next command
    /// resumes from where it was. nil: it is held for ever.
    public var releaseAfter: Duration?

    public init(channel: Int, output: Int, role: ChannelRole, minimum: Microseconds, center: Microseconds, maximum: Microseconds,
                invert: Bool = false, failsafe: FailsafeAction, failsafeDwell: Duration = .milliseconds(500), chip: Int = 0, name: String? = nil,
                motion: MotionLimits = MotionLimits(), start: Microseconds? = nil, releaseAfter: Duration? = nil) {
        self.channel = channel
        self.output = output
        self.role = role
        self.minimum = minimum
        self.center = center
        self.maximum = maximum
        self.invert = invert
        self.failsafe = failsafe
        self.failsafeDwell = failsafeDwell
        self.chip = chip
        self.name = name
        self.motion = motion
        self.start = start
        self.releaseAfter = releaseAfter
    }

    /// Its name, or what it is called without one: "Servo 0", "ESC 4", "PWM 5".
    public var displayName: String {
        name ?? "\(role == .esc ? "ESC" : role == .pwm ? "PWM" : "Servo") \(channel)"
    }
}

/// One PCA9685 of the board.
public struct PCA9685Chip: Sendable, Equatable, CustomStringConvertible {
    public var bus: String
    public var address: I2CAddress
    public var frequency: Hertz
    /// The chip's oscillator as measured on this board (23–27 MHz is common).
    public var oscillator: Hertz
    /// Totem-pole outputs (servo boards) rather than open-drain.
    public var totemPole: Bool

    public init(bus: String, address: I2CAddress, frequency: Hertz, oscillator: Hertz, totemPole: Bool) {
        self.bus = bus
        self.address = address
        self.frequency = frequency
        self.oscillator = oscillator
        self.totemPole = totemPole
    }

    /// `PCA9685 0x40 on i2c1`, as messages name it.
    public var description: String { "PCA9685 \(address) on \(bus)" }
}

/// The PCA9685 servo controllers and the protocol channels they drive.
public struct ServoConfiguration: Sendable, Equatable {
    /// The chips, in board-file order (at least one);
    /// ``ChannelConfiguration/chip`` indexes this list.
    public var chips: [PCA9685Chip]
    /// Sorted by channel number; channel numbers and (chip, output) pairs
    /// are unique.
    public var channels: [ChannelConfiguration]
    /// Flush budget per PWM period (0: unlimited); see `ServoPath.Timing`.
    public var maxFlushesPerPeriod: Int = 4
    /// The GPIO line wired to the chips' OE pin (`servo.output_enable`), if
    /// any: driven to its active level (low by default: OE is active low,
    /// datasheet §7.4) once every output is off at start, and inactive when
    /// the daemon stops. A pull-up on OE then switches the outputs off
    /// whenever nothing drives the line: a reset or hung SoC, a daemon the
    /// kernel took the line from.
    public var outputEnable: LEDConfiguration? = nil
}

/// The HD44780 character LCD on a PCF8574 backpack.
public struct LCDConfiguration: Sendable, Equatable {
    public var bus: String
    public var address: I2CAddress
    public var columns: Int
    public var rows: Int
    public var pins: PCF8574PinMap
    /// Characters per bus transaction: the unit the servo path may have to
    /// wait behind.
    public var charsPerTransaction: Int
    /// What the user calls each line, top first (`lcd.line_names`); lines
    /// without one are "LCD line N".
    public var lineNames: [String] = []

    /// Line `row`'s name, or "LCD line N".
    public func lineName(_ row: Int) -> String {
        row < lineNames.count ? lineNames[row] : "LCD line \(row)"
    }
}

/// One SWITCH_VAL output (docs/protocol.md, "SWITCH_VAL").
public struct SwitchConfiguration: Sendable, Equatable {
    /// Where the switch goes.
    public enum Output: Sendable, Equatable, CustomStringConvertible {
        /// An in-process line (the simulator).
        case emulated
        /// A GPIO line through libgpiod, by chip and offset or line name;
        /// `chip` is a device or a label, empty for "whichever chip has a
        /// line of that name" (see `GPIODLine.locate`).
        case gpio(chip: String, line: Int?, lineName: String?, activeLow: Bool)
        /// A PCA9685 output held fully on or off (datasheet §7.3.3, the
        /// full-on and full-off bits); `chip` indexes
        /// ``ServoConfiguration/chips``.
        case pca9685(chip: Int, output: Int)

        public var description: String {
            switch self {
            case .emulated: return "emulated"
            case .gpio(let chip, let line, let lineName, let activeLow):
                let which = lineName ?? line.map(String.init) ?? "?"
                return "\(chip.isEmpty ? which : "\(chip):\(which)")\(activeLow ? " (active low)" : "")"
            case .pca9685(let chip, let output): return chip == 0 ? "PCA9685 output \(output)" : "PCA9685 \(chip) output \(output)"
            }
        }
    }

    /// The index SWITCH_VAL names.
    public var index: Int
    public var output: Output
    /// What a failsafe sets it to (off unless the board file says on).
    public var safeOn: Bool
    /// What the user calls it ("headlights", "horn"); nil: "Switch N".
    public var name: String?

    public init(index: Int, output: Output, safeOn: Bool = false, name: String? = nil) {
        self.index = index
        self.output = output
        self.safeOn = safeOn
        self.name = name
    }

    /// Its name, or "Switch N".
    public var displayName: String { name ?? "Switch \(index)" }
}

/// The status LED.
/// A GPIO output line of the board file (`led`, `servo.output_enable`):
/// emulated (the simulator) or a line through libgpiod.
public enum LEDConfiguration: Sendable, Equatable {
    case emulated
    /// A GPIO line by chip (`gpiochip0`, a label such as `pinctrl-rp1`, or
    /// empty: every chip is searched for `lineName`) and offset or line name.
    case gpio(chip: String, line: Int?, lineName: String?, activeLow: Bool)
}

/// BLE peripheral settings (the BLE transport through BlueZ, issue #4).
public struct BLEConfiguration: Sendable, Equatable {
    /// `ble.security`: who may write. The board file's words; the BLE
    /// transport turns them into BlueZ's (`BLESecurity`, with the pairing
    /// agent each needs), so parsing a board file needs no D-Bus.
    public enum Security: String, Sendable, CaseIterable {
        /// Anyone may write, as the original HM-10 board.
        case open
        /// Writes need an encrypted link.
        case encrypted
        /// Writes need an authenticated (MITM-protected) encrypted link.
        case authenticated
    }

    public var enabled: Bool
    public var name: String
    public var adapter: String
    public var security: Security = .open
    /// Switch the adapter on when it is off.
    public var powerOn: Bool = true
    /// Addresses (`AA:BB:CC:DD:EE:FF`) allowed to write; empty: anyone.
    public var allow: [String] = []
    /// Offer AcquireWrite on FFE1: write-without-response frames then reach
    /// the daemon through a socket with no D-Bus round trip per write. Off by
    /// default because bluetoothd then routes writes *with* response through
    /// that socket too and acknowledges them at once, before they are applied,
    /// which breaks docs/protocol.md's acknowledgement rule.
    public var acquireWrite: Bool = false
    /// Set the adapter's Alias to `name` while running (what iOS lists).
    public var setAlias: Bool = false
    /// Drop write-without-response from FFE1 so bluetoothd answers every
    /// write only once it is applied.
    public var acknowledgedWrites: Bool = false

    public init(enabled: Bool, name: String, adapter: String, security: Security = .open, powerOn: Bool = true, allow: [String] = [],
                acquireWrite: Bool = false, setAlias: Bool = false, acknowledgedWrites: Bool = false) {
        self.setAlias = setAlias
        self.acknowledgedWrites = acknowledgedWrites
        self.enabled = enabled
        self.name = name
        self.adapter = adapter
        self.security = security
        self.powerOn = powerOn
        self.allow = allow
        self.acquireWrite = acquireWrite
    }
}

/// The serial transport: an HM-10 BLE module on a UART, as on the
/// original board (docs/protocol.md, "The HM-10 link").
public struct SerialConfiguration: Sendable, Equatable {
    /// The tty, e.g. `/dev/serial0` (a Pi's header UART) or `/dev/ttyUSB0`.
    public var device: String
    /// The module's rate (an HM-10 ships at 9600); 8N1, no flow control.
    public var baud: Int
    /// Set the module up at start with AT commands (connection
    /// notifications on, the name); off for a module already set up, or
    /// one that is not an HM-10.
    public var atSetup: Bool
    /// The name the module advertises (AT+NAME; at most 12 characters).
    public var name: String?

    public init(device: String, baud: Int = 9600, atSetup: Bool = true, name: String? = nil) {
        self.device = device
        self.baud = baud
        self.atSetup = atSetup
        self.name = name
    }
}

/// The TCP transport.
public struct TCPConfiguration: Sendable, Equatable {
    public var host: String
    public var port: UInt16
    /// Connections open at once; more are accepted and closed at once.
    public var maxConnections: Int = 64

    public init(host: String, port: UInt16, maxConnections: Int = 64) {
        self.host = host
        self.port = port
        self.maxConnections = maxConnections
    }

    /// Whether `host` can only be reached from this machine: `localhost`, an
    /// IPv4 address in 127.0.0.0/8 written as four decimal parts, or `::1`.
    /// Anything else (a host name, `0.0.0.0`, a short form such as
    /// `127.1` that getaddrinfo would also take) counts as the network.
    public var isLoopback: Bool {
        if host == "localhost" || host == "::1" || host == "0:0:0:0:0:0:0:1" { return true }
        let parts = host.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4, parts.allSatisfy({ (1...3).contains($0.utf8.count) && $0.utf8.allSatisfy { (0x30...0x39).contains($0) } && UInt8($0) != nil }) else {
            return false
        }
        return parts[0] == "127"
    }
}

/// The MQTT transport: the board as a client of a broker (docs/protocol.md,
/// "MQTT").
public struct MQTTConfiguration: Sendable, Equatable {
    public var host: String
    public var port: UInt16
    /// The client id; nil: `blecontrol-` and the board's topic name.
    public var clientID: String?
    /// The first levels of every topic (the board's name follows).
    public var topicPrefix = "blecontrol"
    /// Seconds between keepalive pings; the broker declares the board
    /// offline (its will) after 1.5 times this without a packet.
    public var keepalive = 15
    public var username: String?
    /// A file holding the password (first line), readable by root and the
    /// service user only: the board file is world-readable.
    public var passwordFile: String?
    /// TLS: the CA certificate the broker's certificate must chain to.
    public var caFile: String?
    public var certFile: String?
    public var keyFile: String?
    /// How often the retained status is refreshed when it changed.
    public var statusInterval: Duration = .seconds(1)
    /// Home Assistant discovery: the board as a device, an entity per output.
    public var discovery = true
    public var discoveryPrefix = "homeassistant"
    /// Where the board's control page is served, for Home Assistant's
    /// device page ("Visit"); nil: none.
    public var configurationURL: String?

    public init(host: String, port: UInt16) {
        self.host = host
        self.port = port
    }

    /// A broker given as HOST or HOST:PORT (the board file's `broker`,
    /// `blecontrol --mqtt`): the port defaults to MQTT's, 1883, or 8883
    /// with TLS. Nil when it is neither.
    public static func broker(_ text: String, tls: Bool) -> (host: String, port: UInt16)? {
        if let endpoint = TCPConfiguration(endpoint: text), endpoint.port != 0 { return (endpoint.host, endpoint.port) }
        guard !text.isEmpty, !text.contains(where: { $0 == " " || $0 == "/" || $0 == ":" }) else { return nil }
        return (text, tls ? 8883 : 1883)
    }

    /// Whether TLS is on (it is when a CA file is given).
    public var tls: Bool { caFile != nil }

    /// Whether `text` can stand in a topic: no wildcards, no NUL, no empty
    /// level; `/` only where several levels are allowed.
    public static func isTopicLevel(_ text: String, allowSlash: Bool) -> Bool {
        guard !text.isEmpty, text.utf8.count < 256 else { return false }
        if text.contains(where: { $0 == "+" || $0 == "#" || $0 == "\0" }) { return false }
        if !allowSlash { return !text.contains("/") }
        return !text.split(separator: "/", omittingEmptySubsequences: false).contains(where: \.isEmpty)
    }

    /// The board's name as one topic level: characters a topic or Home
    /// Assistant's ids cannot take become `_`.
    public static func topicName(_ board: String) -> String {
        String(board.map { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") ? $0 : "_" })
    }
}
