/// Everything `blecontrol status` shows, as one value. Encoded with
/// snake_case keys (`pulse_us`, `lcd.lines`, …): the `--json` contract.
public struct StatusReport: Codable, Sendable, Equatable {
    public struct Channel: Codable, Sendable, Equatable {
        public var channel: Int
        public var output: Int
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
    }

    public struct LCD: Codable, Sendable, Equatable {
        public var online: Bool
        public var error: String?
        public var columns: Int
        public var rows: Int
        /// What the display shows (emulated: decoded by the emulated HD44780).
        public var lines: [String]
        public var busWrites: Int
    }

    public struct LED: Codable, Sendable, Equatable {
        public var pattern: String
        public var lit: Bool
        public var error: String?
    }

    public struct SessionInfo: Codable, Sendable, Equatable {
        public var id: Int
        public var transport: String
        public var peer: String
        public var bytes: Int
        public var frames: Int
        public var errors: Int
        public var connectedSeconds: Double
    }

    public struct Counters: Codable, Sendable, Equatable {
        public var frames: Int
        public var errors: Int
        public var discardedPartials: Int
        public var sessionsTotal: Int
    }

    public var board: String
    public var version: String
    public var uptimeSeconds: Double
    public var simulated: Bool
    public var channels: [Channel]
    public var servo: Servo?
    public var lcd: LCD?
    public var led: LED?
    public var sessions: [SessionInfo]
    public var counters: Counters
    /// Transport name → where it listens, or why it is not running.
    public var transports: [String: String]
}
