import Reactor

/// Everything `blecontrol status` shows, as one value. Its JSON (the
/// `--json` contract) has snake_case keys, spelled out in each type's
/// CodingKeys: no key conversion and no sorting at encode time, which is
/// what made a status request cost ~75 µs of CPU.
public struct StatusReport: Codable, Sendable, Equatable {
    public struct Channel: Codable, Sendable, Equatable {
        public var channel: Int
        /// The PCA9685 output pin (on a multi-chip board, `chip:output` is `chip`/`output`).
        public var output: Int
        public var chip: String?
        public var role: String
        public var enabled: Bool
        /// The last value command: "servo" or "pwm", and its raw value.
        public var command: String?
        public var value: Int?
        /// The pulse the chip produces: on an emulated bus what the emulated
        /// PCA9685 decoded from the bus traffic, on hardware what was written.
        public var pulseUs: Double
        public var duty: Double
        /// An ESC stopped by a failsafe, waiting for ANALOG_OUT_EN on.
        public var latched: Bool
        /// The board file's name for it, if any.
        public var name: String?
        /// What its last command asks for, in the unit a user thinks in: the
        /// pulse in µs (servo and ESC channels, calibration applied) or the
        /// duty in % (PWM channels), whether or not the output is enabled;
        /// nil when never commanded. Absent from older daemons.
        public var setpointUs: Double?
        public var setpointPercent: Double?
        /// A channel with motion limits, or in a timed move: true while its
        /// pulse is on its way to the setpoint (``pulseUs`` is where it has
        /// got to); absent for channels without limits and not moving.
        public var moving: Bool?
        /// A servo or ESC channel with motion limits or in a timed move,
        /// producing pulses: the
        /// SERVO_VAL (0…1000, through its calibration) of the pulse it has
        /// got to, so a slider can follow the move; absent otherwise.
        public var position: Int?
        /// A servo with `release_after_ms`: true once it has let go (no
        /// pulses until the next command); absent for other channels.
        public var released: Bool?

        public init(channel: Int, output: Int, chip: String? = nil, role: String, enabled: Bool, command: String?, value: Int?, pulseUs: Double, duty: Double, latched: Bool,
                    name: String? = nil, setpointUs: Double? = nil, setpointPercent: Double? = nil, moving: Bool? = nil, position: Int? = nil, released: Bool? = nil) {
            self.channel = channel
            self.output = output
            self.chip = chip
            self.role = role
            self.enabled = enabled
            self.command = command
            self.value = value
            self.pulseUs = pulseUs
            self.duty = duty
            self.latched = latched
            self.name = name
            self.setpointUs = setpointUs
            self.setpointPercent = setpointPercent
            self.moving = moving
            self.position = position
            self.released = released
        }

        enum CodingKeys: String, CodingKey {
            case channel, output, chip, role, enabled, command, value
            case pulseUs = "pulse_us"
            case duty, latched, name
            case setpointUs = "setpoint_us"
            case setpointPercent = "setpoint_percent"
            case moving, position, released
        }
    }

    public struct Switch: Codable, Sendable, Equatable {
        public var `switch`: Int
        public var on: Bool
        /// Where it goes: "gpiochip0:GPIO22", "pca9685 0x40 output 12", "emulated".
        public var output: String
        public var error: String?
        /// The board file's name for it, if any.
        public var name: String?

        public init(switch index: Int, on: Bool, output: String, error: String? = nil, name: String? = nil) {
            self.switch = index
            self.on = on
            self.output = output
            self.error = error
            self.name = name
        }
    }

    public struct Servo: Codable, Sendable, Equatable {
        public var online: Bool
        public var error: String?
        public var frequencyHz: Double
        public var updates: Int
        public var coalesced: Int
        public var flushes: Int
        public var busWrites: Int
        public var failedFlushes: Int
        public var latencyP50Us: Int?
        public var latencyP99Us: Int?
        public var latencyMaxUs: Int?
        /// Updates slower than one PWM period.
        public var deadlineMisses: Int
        /// Why the outputs are in failsafe now (nil: they are not).
        public var failsafe: String?
        public var failsafeSeconds: Double?
        /// How long the failsafe outputs took to reach the chip.
        public var failsafeAppliedMs: Double?
        /// Failsafes engaged since start.
        public var failsafes: Int
        /// The servo thread's scheduling policy.
        public var scheduling: String
        /// The most LCD transactions one servo write waited behind (≤ 1 by design).
        public var maxLcdChunksWaited: Int
        /// The longest a servo write waited for the bus.
        public var maxBusWaitUs: Int
        /// Motion (channels with limits, timed moves): the PWM periods whose
        /// step was due, those the servo thread missed (it was late by a
        /// period or more and took two steps in one write), and how late
        /// each step was after its period began. Absent until something moved.
        public var motionPeriods: Int?
        public var motionPeriodsMissed: Int?
        public var motionLatenessP50Us: Int?
        public var motionLatenessP99Us: Int?
        public var motionLatenessMaxUs: Int?

        public init(online: Bool, error: String?, frequencyHz: Double, updates: Int, coalesced: Int, flushes: Int, busWrites: Int, failedFlushes: Int,
                    latencyP50Us: Int?, latencyP99Us: Int?, latencyMaxUs: Int?, deadlineMisses: Int, failsafe: String?, failsafeSeconds: Double?,
                    failsafeAppliedMs: Double?, failsafes: Int, scheduling: String, maxLcdChunksWaited: Int, maxBusWaitUs: Int,
                    motionPeriods: Int? = nil, motionPeriodsMissed: Int? = nil, motionLatenessP50Us: Int? = nil, motionLatenessP99Us: Int? = nil,
                    motionLatenessMaxUs: Int? = nil) {
            self.online = online
            self.error = error
            self.frequencyHz = frequencyHz
            self.updates = updates
            self.coalesced = coalesced
            self.flushes = flushes
            self.busWrites = busWrites
            self.failedFlushes = failedFlushes
            self.latencyP50Us = latencyP50Us
            self.latencyP99Us = latencyP99Us
            self.latencyMaxUs = latencyMaxUs
            self.deadlineMisses = deadlineMisses
            self.failsafe = failsafe
            self.failsafeSeconds = failsafeSeconds
            self.failsafeAppliedMs = failsafeAppliedMs
            self.failsafes = failsafes
            self.scheduling = scheduling
            self.maxLcdChunksWaited = maxLcdChunksWaited
            self.maxBusWaitUs = maxBusWaitUs
            self.motionPeriods = motionPeriods
            self.motionPeriodsMissed = motionPeriodsMissed
            self.motionLatenessP50Us = motionLatenessP50Us
            self.motionLatenessP99Us = motionLatenessP99Us
            self.motionLatenessMaxUs = motionLatenessMaxUs
        }

        enum CodingKeys: String, CodingKey {
            case online, error
            case frequencyHz = "frequency_hz"
            case updates, coalesced, flushes
            case busWrites = "bus_writes"
            case failedFlushes = "failed_flushes"
            case latencyP50Us = "latency_p50_us"
            case latencyP99Us = "latency_p99_us"
            case latencyMaxUs = "latency_max_us"
            case deadlineMisses = "deadline_misses"
            case failsafe
            case failsafeSeconds = "failsafe_seconds"
            case failsafeAppliedMs = "failsafe_applied_ms"
            case failsafes, scheduling
            case motionPeriods = "motion_periods"
            case motionPeriodsMissed = "motion_periods_missed"
            case motionLatenessP50Us = "motion_lateness_p50_us"
            case motionLatenessP99Us = "motion_lateness_p99_us"
            case motionLatenessMaxUs = "motion_lateness_max_us"
            case maxLcdChunksWaited = "max_lcd_chunks_waited"
            case maxBusWaitUs = "max_bus_wait_us"
        }
    }

    public struct LCD: Codable, Sendable, Equatable {
        public var online: Bool
        public var error: String?
        public var columns: Int
        public var rows: Int
        /// What the display shows (emulated: decoded by the emulated HD44780).
        public var lines: [String]
        /// What centrals wrote, when a system message (failsafe, passkey)
        /// covers it; nil when the display shows the centrals' text.
        public var overlay: String?
        public var busWrites: Int
        /// The board file's names for the lines (`lcd.line_names`), if any.
        public var lineNames: [String]?

        public init(online: Bool, error: String?, columns: Int, rows: Int, lines: [String], overlay: String? = nil, busWrites: Int, lineNames: [String]? = nil) {
            self.online = online
            self.error = error
            self.columns = columns
            self.rows = rows
            self.lines = lines
            self.overlay = overlay
            self.busWrites = busWrites
            self.lineNames = lineNames
        }

        enum CodingKeys: String, CodingKey {
            case online, error, columns, rows, lines, overlay
            case busWrites = "bus_writes"
            case lineNames = "line_names"
        }
    }

    public struct LED: Codable, Sendable, Equatable {
        public var pattern: String
        public var lit: Bool
        public var error: String?

        public init(pattern: String, lit: Bool, error: String? = nil) {
            self.pattern = pattern
            self.lit = lit
            self.error = error
        }
    }

    public struct SessionInfo: Codable, Sendable, Equatable {
        public var id: Int
        public var transport: String
        public var peer: String
        public var bytes: Int
        public var frames: Int
        public var errors: Int
        public var connectedSeconds: Double
        /// The outputs whose last command was this central's ("channel 4",
        /// "switch 1"): what its leaving takes to the failsafe. Empty for an
        /// observer; absent from older daemons.
        public var inControlOf: [String]?
        /// ERROR replies not sent because the central drew more than its
        /// budget (docs/protocol.md, "Limits"); absent from older daemons.
        public var repliesDropped: Int?

        public init(id: Int, transport: String, peer: String, bytes: Int, frames: Int, errors: Int, connectedSeconds: Double,
                    inControlOf: [String]? = nil, repliesDropped: Int? = nil) {
            self.id = id
            self.transport = transport
            self.peer = peer
            self.bytes = bytes
            self.frames = frames
            self.errors = errors
            self.connectedSeconds = connectedSeconds
            self.inControlOf = inControlOf
            self.repliesDropped = repliesDropped
        }

        enum CodingKeys: String, CodingKey {
            case id, transport, peer, bytes, frames, errors
            case connectedSeconds = "connected_seconds"
            case inControlOf = "in_control_of"
            case repliesDropped = "replies_dropped"
        }
    }

    public struct Counters: Codable, Sendable, Equatable {
        public var frames: Int
        public var errors: Int
        public var discardedPartials: Int
        public var sessionsTotal: Int
        /// Connections closed at once because the session cap was reached.
        public var refusedConnections: Int

        public init(frames: Int, errors: Int, discardedPartials: Int, sessionsTotal: Int, refusedConnections: Int = 0) {
            self.frames = frames
            self.errors = errors
            self.discardedPartials = discardedPartials
            self.sessionsTotal = sessionsTotal
            self.refusedConnections = refusedConnections
        }

        enum CodingKeys: String, CodingKey {
            case frames, errors
            case discardedPartials = "discarded_partials"
            case sessionsTotal = "sessions_total"
            case refusedConnections = "refused_connections"
        }
    }

    /// Where each transport listens, or why it is not running.
    public struct Transports: Codable, Sendable, Equatable {
        public var tcp: String?
        public var ble: String?
        public var serial: String?
        public var mqtt: String?
        public var control: String?

        public init(tcp: String? = nil, ble: String? = nil, serial: String? = nil, mqtt: String? = nil, control: String? = nil) {
            self.tcp = tcp
            self.ble = ble
            self.serial = serial
            self.mqtt = mqtt
            self.control = control
        }

        /// The transports that are set, by name, in a fixed order.
        public var named: [(String, String)] {
            [("ble", ble), ("control", control), ("mqtt", mqtt), ("serial", serial), ("tcp", tcp)].compactMap { name, state in state.map { (name, $0) } }
        }
    }

    /// The board file in use and its reloads (SIGHUP).
    public struct Configuration: Codable, Sendable, Equatable {
        public var path: String
        public var reloads: Int
        /// The last reload's outcome: "applied", or why it was refused.
        public var lastReload: String?

        public init(path: String, reloads: Int, lastReload: String?) {
            self.path = path
            self.reloads = reloads
            self.lastReload = lastReload
        }

        enum CodingKeys: String, CodingKey {
            case path, reloads
            case lastReload = "last_reload"
        }
    }

    public var board: String
    public var version: String
    public var uptimeSeconds: Double
    public var simulated: Bool
    public var channels: [Channel]
    public var switches: [Switch]
    public var servo: Servo?
    public var lcd: LCD?
    public var led: LED?
    public var sessions: [SessionInfo]
    public var counters: Counters
    public var transports: Transports
    public var configuration: Configuration?

    public init(board: String, version: String, uptimeSeconds: Double, simulated: Bool, channels: [Channel], switches: [Switch] = [], servo: Servo?,
                lcd: LCD?, led: LED?, sessions: [SessionInfo], counters: Counters, transports: Transports, configuration: Configuration? = nil) {
        self.board = board
        self.version = version
        self.uptimeSeconds = uptimeSeconds
        self.simulated = simulated
        self.channels = channels
        self.switches = switches
        self.servo = servo
        self.lcd = lcd
        self.led = led
        self.sessions = sessions
        self.counters = counters
        self.transports = transports
        self.configuration = configuration
    }

    enum CodingKeys: String, CodingKey {
        case board, version
        case uptimeSeconds = "uptime_seconds"
        case simulated, channels, switches, servo, lcd, led, sessions, counters, transports, configuration
    }
}

/// What `{"op":"poll"}` answers: the few figures a script or benchmark
/// polls in a tight loop, without building a whole status.
extension StatusReport {
    /// The report with `secret` (a pairing passkey) replaced by asterisks
    /// wherever it shows: the BLE transport's state and the LCD's lines. For
    /// everyone who may not see it: the broker, and control-socket callers
    /// other than root and the daemon's own user.
    public func hiding(_ secret: String?) -> StatusReport {
        guard let secret, !secret.isEmpty else { return self }
        let mask = String(repeating: "*", count: secret.count)
        var report = self
        report.transports.ble = report.transports.ble?.replacing(secret, with: mask)
        if var lcd = report.lcd {
            lcd.lines = lcd.lines.map { $0.replacing(secret, with: mask) }
            report.lcd = lcd
        }
        return report
    }
}

public struct PollReport: Codable, Sendable, Equatable {
    /// Frames dispatched since start (every transport).
    public var frames: Int
    /// Per configured channel: the pulse produced, in µs, in channel order.
    public var pulsesUs: [Double]
    public var failsafe: String?
    /// Bus writes the servo path made.
    public var busWrites: Int

    public init(frames: Int, pulsesUs: [Double], failsafe: String?, busWrites: Int) {
        self.frames = frames
        self.pulsesUs = pulsesUs
        self.failsafe = failsafe
        self.busWrites = busWrites
    }

    enum CodingKeys: String, CodingKey {
        case frames
        case pulsesUs = "pulses_us"
        case failsafe
        case busWrites = "bus_writes"
    }
}

extension String {
    /// Text that came from a board, a broker or a BLE device (a status's
    /// strings, a name, an error reply), safe to print on a terminal: its
    /// control characters, escape sequences and invalid UTF-8 shown as
    /// visible escapes (``Swift/String/init(escaping:maximumLength:)``),
    /// cut at ``printableLength`` characters.
    public var printable: String { escaped(maximumLength: Self.printableLength) }

    /// Bytes from outside (a payload) the same way; invalid UTF-8 is shown
    /// byte by byte, where decoding it first would show U+FFFD.
    public static func printable(_ bytes: [UInt8]) -> String { String(escaping: bytes, maximumLength: printableLength) }

    /// More than any line the CLI prints needs, little enough that a
    /// hostile megabyte costs nothing.
    public static let printableLength = 512
}
