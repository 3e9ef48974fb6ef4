import Reactor

/// The WebSocket protocol (RFC 6455), server side, without I/O: the opening
/// handshake's accept key and the framing, for `blecontrol web`'s bridge
/// between the control page and the daemon.
///
/// Deliberately narrow: messages are small (a write of protocol frames, a
/// state report), so one message is at most ``maximumMessage`` bytes and a
/// frame that announces more closes the connection before its payload is
/// read; no extensions (no compression) are offered, so the reserved bits
/// must be clear.
public enum WebSocket {
    /// RFC 6455 §1.3: appended to the client's key before hashing.
    static let guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    /// The most bytes one message (all its fragments) may carry.
    public static let maximumMessage = 16 * 1024

    /// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key` (§4.2.2):
    /// base64(SHA-1(key + GUID)).
    public static func accept(key: String) -> String {
        base64(sha1(Array((key.trimmed + guid).utf8)))
    }

    /// Whether `key` is a plausible `Sec-WebSocket-Key`: base64 of 16 bytes
    /// (§4.1: 24 characters ending in "==").
    public static func isValid(key: String) -> Bool {
        let text = Array(key.trimmed.utf8)
        guard text.count == 24, text[22] == UInt8(ascii: "="), text[23] == UInt8(ascii: "=") else { return false }
        return text[..<22].allSatisfy { alphabet.contains($0) }
    }

    /// Frame opcodes (§5.2).
    public enum Opcode: UInt8, Sendable {
        case continuation = 0x0, text = 0x1, binary = 0x2, close = 0x8, ping = 0x9, pong = 0xA
        var isControl: Bool { rawValue & 0x8 != 0 }
    }

    /// What the peer sent, as the decoder reassembles it.
    public enum Event: Equatable, Sendable {
        case text([UInt8])
        case binary([UInt8])
        case ping([UInt8])
        case pong
        /// The peer's close frame: its status code, if it gave one.
        case close(UInt16?)
    }

    /// Why the connection must close (the code to send, §7.4.1), and a
    /// line for the log.
    public struct Violation: Error, Equatable, Sendable, CustomStringConvertible {
        public var code: UInt16
        public var description: String
        /// 1002: the frames break the protocol.
        static func `protocol`(_ text: String) -> Violation { Violation(code: 1002, description: text) }
    }

    /// Splits the client's bytes into messages. Client frames must be
    /// masked (§5.1), control frames short and whole (§5.5), and nothing
    /// may exceed ``maximumMessage``: any breach is a ``Violation`` and the
    /// decoder takes nothing more.
    public struct Decoder: Sendable {
        private var buffer: [UInt8] = []
        /// The data message being reassembled from fragments.
        private var fragments: (opcode: Opcode, payload: [UInt8])?
        private var failed = false

        public init() {}

        /// Appends `bytes` and returns the whole messages they complete.
        public mutating func push(_ bytes: some Collection<UInt8>) throws(Violation) -> [Event] {
            switch feed(bytes) {
            case .success(let events): return events
            case .failure(let violation): throw violation
            }
        }

        /// ``push(_:)`` as a result (no `do`/`catch` needed to read the
        /// violation's code).
        public mutating func feed(_ bytes: some Collection<UInt8>) -> Result<[Event], Violation> {
            guard !failed else { return .success([]) }
            buffer.append(contentsOf: bytes)
            var events: [Event] = []
            while true {
                switch next() {
                case .success(let event?):
                    events.append(event)
                case .success(nil):
                    return .success(events)
                case .failure(let violation):
                    failed = true
                    buffer = []
                    return .failure(violation)
                }
            }
        }

        private mutating func next() -> Result<Event?, Violation> {
            while true {
                guard buffer.count >= 2 else { return .success(nil) }
                let first = buffer[0], second = buffer[1]
                guard first & 0x70 == 0 else { return .failure(.protocol("reserved bits set (no extension was agreed)")) }
                guard let opcode = Opcode(rawValue: first & 0x0F) else { return .failure(.protocol("unknown opcode \(first & 0x0F)")) }
                let final = first & 0x80 != 0
                guard second & 0x80 != 0 else { return .failure(.protocol("a client frame without a mask")) }
                var length = UInt64(second & 0x7F)
                var offset = 2
                if length == 126 {
                    guard buffer.count >= 4 else { return .success(nil) }
                    length = UInt64(buffer[2]) << 8 | UInt64(buffer[3])
                    offset = 4
                } else if length == 127 {
                    guard buffer.count >= 10 else { return .success(nil) }
                    length = buffer[2..<10].reduce(0) { $0 << 8 | UInt64($1) }
                    offset = 10
                }
                if opcode.isControl {
                    guard final, length <= 125 else { return .failure(.protocol("a control frame fragmented or over 125 bytes")) }
                }
                let held = UInt64(fragments?.payload.count ?? 0)
                guard length <= UInt64(maximumMessage) - (opcode.isControl ? 0 : held) else {
                    return .failure(Violation(code: 1009, description: "a message over \(maximumMessage) bytes"))
                }
                let total = offset + 4 + Int(length)
                guard buffer.count >= total else { return .success(nil) }
                let mask = Array(buffer[offset..<(offset + 4)])
                var payload = Array(buffer[(offset + 4)..<total])
                for index in payload.indices { payload[index] ^= mask[index & 3] }
                buffer.removeFirst(total)
                switch opcode {
                case .ping:
                    return .success(.ping(payload))
                case .pong:
                    return .success(.pong)
                case .close:
                    guard payload.count != 1 else { return .failure(.protocol("a close frame with a one-byte body")) }
                    return .success(.close(payload.count >= 2 ? UInt16(payload[0]) << 8 | UInt16(payload[1]) : nil))
                case .continuation:
                    guard var message = fragments else { return .failure(.protocol("a continuation frame with no message to continue")) }
                    message.payload += payload
                    fragments = final ? nil : message
                    if final { return .success(Self.message(message.opcode, message.payload)) }
                case .text, .binary:
                    guard fragments == nil else { return .failure(.protocol("a new message before the last one's final fragment")) }
                    if final { return .success(Self.message(opcode, payload)) }
                    fragments = (opcode, payload)
                }
            }
        }

        private static func message(_ opcode: Opcode, _ payload: [UInt8]) -> Event {
            opcode == .text ? .text(payload) : .binary(payload)
        }
    }

    /// One unmasked, unfragmented server frame (§5.2).
    public static func frame(_ opcode: Opcode, _ payload: some Collection<UInt8>) -> [UInt8] {
        var bytes: [UInt8] = [0x80 | opcode.rawValue]
        let count = payload.count
        if count < 126 {
            bytes.append(UInt8(count))
        } else if count <= 0xFFFF {
            bytes += [126, UInt8(count >> 8), UInt8(count & 0xFF)]
        } else {
            bytes.append(127)
            bytes += (0..<8).reversed().map { UInt8(truncatingIfNeeded: UInt64(count) >> (UInt64($0) * 8)) }
        }
        bytes += payload
        return bytes
    }

    /// A close frame with `code` (§5.5.1).
    public static func closeFrame(_ code: UInt16) -> [UInt8] {
        frame(.close, [UInt8(code >> 8), UInt8(code & 0xFF)])
    }

    // MARK: SHA-1 and base64, for the accept key alone

    /// SHA-1 (FIPS 180-4 §6.1). Only the handshake uses it, as RFC 6455
    /// requires; it protects nothing here.
    static func sha1(_ message: [UInt8]) -> [UInt8] {
        var h: [UInt32] = [0x6745_2301, 0xEFCD_AB89, 0x98BA_DCFE, 0x1032_5476, 0xC3D2_E1F0]
        var padded = message
        padded.append(0x80)
        while padded.count % 64 != 56 { padded.append(0) }
        let bits = UInt64(message.count) * 8
        padded += (0..<8).reversed().map { UInt8(truncatingIfNeeded: bits >> (UInt64($0) * 8)) }
        var w = [UInt32](repeating: 0, count: 80)
        for block in stride(from: 0, to: padded.count, by: 64) {
            for t in 0..<16 {
                let i = block + t * 4
                w[t] = UInt32(padded[i]) << 24 | UInt32(padded[i + 1]) << 16 | UInt32(padded[i + 2]) << 8 | UInt32(padded[i + 3])
            }
            for t in 16..<80 { w[t] = rotate(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], 1) }
            var a = h[0], b = h[1], c = h[2], d = h[3], e = h[4]
            for t in 0..<80 {
                let f: UInt32, k: UInt32
                switch t {
                case 0..<20: f = (b & c) | (~b & d); k = 0x5A82_7999
                case 20..<40: f = b ^ c ^ d; k = 0x6ED9_EBA1
                case 40..<60: f = (b & c) | (b & d) | (c & d); k = 0x8F1B_BCDC
                default: f = b ^ c ^ d; k = 0xCA62_C1D6
                }
                let temp = rotate(a, 5) &+ f &+ e &+ k &+ w[t]
                e = d; d = c; c = rotate(b, 30); b = a; a = temp
            }
            h[0] &+= a; h[1] &+= b; h[2] &+= c; h[3] &+= d; h[4] &+= e
        }
        return h.flatMap { word in (0..<4).reversed().map { UInt8(truncatingIfNeeded: word >> (UInt32($0) * 8)) } }
    }

    private static func rotate(_ value: UInt32, _ count: UInt32) -> UInt32 { value << count | value >> (32 - count) }

    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    /// Base64 with padding (RFC 4648 §4).
    static func base64(_ bytes: [UInt8]) -> String {
        var text: [UInt8] = []
        for start in stride(from: 0, to: bytes.count, by: 3) {
            let chunk = Array(bytes[start..<min(start + 3, bytes.count)])
            let value = chunk.enumerated().reduce(UInt32(0)) { $0 | UInt32($1.element) << (16 - 8 * UInt32($1.offset)) }
            for index in 0..<4 {
                text.append(index <= chunk.count ? alphabet[Int(value >> (18 - 6 * UInt32(index)) & 0x3F)] : UInt8(ascii: "="))
            }
        }
        return String(decoding: text, as: UTF8.self)
    }
}
