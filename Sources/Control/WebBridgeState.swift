/// What `blecontrol web`'s bridge tells the control page about the board,
/// whenever it changes (whoever changed it: the page, another central, the
/// CLI, the failsafe), so the page's sliders and switches show where the
/// outputs are:
///
///     {"state":{"board":"simulator","failsafe":null,
///       "channels":[{"channel":0,"enabled":true,"command":"servo","value":500}],
///       "switches":[{"switch":0,"on":false}],"lcd":["Hello",""]}}
///
/// Only these fields of the status go to the page: never a pairing passkey,
/// a peer's address or a counter, whoever runs the bridge.
public struct WebBridgeState: Codable, Sendable, Equatable {
    public struct Channel: Codable, Sendable, Equatable {
        public var channel: Int
        public var enabled: Bool
        /// "servo" or "pwm": the last value command, and its raw value.
        public var command: String?
        public var value: Int?
        /// A channel with motion limits: whether it is on its way, and the
        /// SERVO_VAL of where it has got to (the slider follows it).
        public var moving: Bool?
        public var position: Int?
    }

    public struct Switch: Codable, Sendable, Equatable {
        public var `switch`: Int
        public var on: Bool
    }

    public var board: String
    /// The failsafe's reason while it holds.
    public var failsafe: String?
    public var channels: [Channel]
    public var switches: [Switch]
    /// The LCD's lines as it shows them (empty without an LCD).
    public var lcd: [String]

    /// The page's part of a daemon's status.
    public init(_ status: StatusReport) {
        board = status.board
        failsafe = status.servo?.failsafe
        channels = status.channels.map {
            Channel(channel: $0.channel, enabled: $0.enabled, command: $0.command, value: $0.value, moving: $0.moving, position: $0.position)
        }
        switches = status.switches.map { Switch(switch: $0.switch, on: $0.on) }
        lcd = status.lcd?.lines ?? []
    }

    /// The message the page reads: one line of JSON.
    public var message: [UInt8] {
        (try? JSONEncoderLite().encode(Envelope(state: self))) ?? []
    }

    private struct Envelope: Encodable {
        var state: WebBridgeState
    }
}
