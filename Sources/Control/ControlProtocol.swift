/// The control socket's wire format, shared by the daemon and the CLI: one
/// JSON object per line each way.
///
/// Requests: `{"op":"status"}`, `{"op":"poll"}`, `{"op":"send","hex":"02030001f4"}`,
/// `{"op":"pulse","channel":0,"us":1500}` (`send` and `pulse` take
/// `"over_ms":1500` too: a timed move), `{"op":"forget-bonds"}`,
/// `{"op":"clear-failsafe"}`, `{"op":"central","peer":"127.0.0.1:50312"}`.
/// Responses: `{"ok":true,"status":{…}}`, `{"ok":true,"poll":{…}}`,
/// `{"ok":true,"replies":"ff0109"}` (the frames the board sent back, hex),
/// `{"ok":true,"forgotten":["AA:BB:…"]}`, or `{"ok":false,"error":"…"}`.
public enum ControlProtocol {
    /// What a request asks for.
    public enum Operation: String, Codable, Sendable, CaseIterable {
        /// The whole status report.
        case status
        /// A small snapshot for tight loops (``PollReport``).
        case poll
        /// Frames, as a central would send them.
        case send
        /// A servo or ESC channel's pulse in µs: the daemon turns it into
        /// the SERVO_VAL that gives it with the channel's calibration, and
        /// refuses one outside it; then as `send`.
        case pulse
        /// Remove every BLE bond of the board's adapter (each central must pair again).
        case forgetBonds = "forget-bonds"
        /// End the failsafe on purpose, as the operator at the board
        /// (outputs stay where it put them until a command moves them).
        case clearFailsafe = "clear-failsafe"
        /// From now on this connection is a central (transport `web`, as
        /// `peer` names it), not the CLI: its frames keep the board out of
        /// failsafe, and its going away is a central leaving. For
        /// `blecontrol web`'s bridge; answered `{"ok":true}`.
        case central
    }

    /// The most characters `central`'s `peer` may have (it is shown in the
    /// status and the log).
    public static let maximumPeerLength = 64

    public struct Request: Codable, Sendable {
        public var op: Operation
        public var hex: String?
        /// `pulse`: the channel and the width in µs.
        public var channel: Int?
        public var us: Double?
        /// `send` and `pulse`: the servo and PWM values they carry move there
        /// in this many milliseconds, together (1…600000).
        public var overMs: Int?
        /// `central`: who the central is (the browser's address).
        public var peer: String?
        public init(op: Operation, hex: String? = nil, channel: Int? = nil, us: Double? = nil, overMs: Int? = nil, peer: String? = nil) {
            self.op = op
            self.hex = hex
            self.channel = channel
            self.us = us
            self.overMs = overMs
            self.peer = peer
        }

        enum CodingKeys: String, CodingKey {
            case op, hex, channel, us, peer
            case overMs = "over_ms"
        }
    }

    public struct Response: Codable, Sendable {
        public var ok: Bool
        public var error: String?
        public var status: StatusReport?
        public var poll: PollReport?
        /// Frames the board sent back while applying a `send`, hex encoded.
        public var replies: String?
        /// The addresses whose bonds `forget-bonds` removed.
        public var forgotten: [String]?
        /// The reason of the failsafe `clear-failsafe` ended (absent: none held).
        public var cleared: String?
        public init(ok: Bool, error: String? = nil, status: StatusReport? = nil, poll: PollReport? = nil, replies: String? = nil, forgotten: [String]? = nil,
                    cleared: String? = nil) {
            self.ok = ok
            self.error = error
            self.status = status
            self.poll = poll
            self.replies = replies
            self.forgotten = forgotten
            self.cleared = cleared
        }
    }

    /// Reads a request line: a clear error for anything else, including an
    /// unknown operation.
    public static func request(from line: [UInt8]) throws -> Request {
        let value: JSONValue
        do {
            value = try JSONValue.parse(line)
        } catch {
            throw JSONError("not a control request: \(error)")
        }
        guard case .string(let name)? = value["op"] else { throw JSONError("not a control request: no \"op\"") }
        guard Operation(rawValue: name) != nil else {
            throw JSONError("unknown op \"\(name)\" (\(Operation.allCases.map(\.rawValue).joined(separator: ", ")))")
        }
        return try JSONDecoderLite().decode(Request.self, from: value)
    }

    /// A response as one line (newline included).
    public static func line(_ response: Response) throws -> [UInt8] {
        try line(encoding: response)
    }

    /// A request as one line (newline included).
    public static func line(_ request: Request) throws -> [UInt8] {
        try line(encoding: request)
    }

    private static func line(encoding value: some Encodable) throws -> [UInt8] {
        var bytes = try JSONEncoderLite().encode(value)
        bytes.append(UInt8(ascii: "\n"))
        return bytes
    }

    /// Hex text (spaces, colons, commas and a 0x prefix per byte allowed) → bytes, or nil.
    public static func bytes(fromHex text: String) -> [UInt8]? {
        var digits: [UInt8] = []
        var chunk = Array(text.lowercased().utf8)[...]
        while let first = chunk.first {
            if first == UInt8(ascii: "0"), chunk.dropFirst().first == UInt8(ascii: "x") {
                chunk = chunk.dropFirst(2)
                continue
            }
            chunk = chunk.dropFirst()
            switch first {
            case UInt8(ascii: " "), UInt8(ascii: ":"), UInt8(ascii: ","), UInt8(ascii: "\n"), UInt8(ascii: "\t"): continue
            default: digits.append(first)
            }
        }
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        var index = 0
        while index < digits.count {
            guard let high = hexValue(digits[index]), let low = hexValue(digits[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
            index += 2
        }
        return bytes
    }

    private static func hexValue(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return digit - UInt8(ascii: "a") + 10
        default: return nil
        }
    }

    /// Bytes → lowercase hex without separators.
    public static func hex<C: Collection>(_ bytes: C) -> String where C.Element == UInt8 {
        let digits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: text, as: UTF8.self)
    }
}
