import Foundation

/// The control socket's wire format, shared by the daemon and the CLI: one
/// JSON object per line each way.
///
/// Requests: `{"op":"status"}`, `{"op":"send","hex":"0203000 1f4"}`.
/// Responses: `{"ok":true,"status":{…}}`, `{"ok":true,"replies":"ff0109"}`
/// (the frames the board sent back, hex), or `{"ok":false,"error":"…"}`.
public enum ControlProtocol {
    public struct Request: Codable, Sendable {
        public var op: String
        public var hex: String?
        public init(op: String, hex: String? = nil) {
            self.op = op
            self.hex = hex
        }
    }

    public struct Response: Codable, Sendable {
        public var ok: Bool
        public var error: String?
        public var status: StatusReport?
        /// Frames the board sent back while applying a `send`, hex encoded.
        public var replies: String?
        public init(ok: Bool, error: String? = nil, status: StatusReport? = nil, replies: String? = nil) {
            self.ok = ok
            self.error = error
            self.status = status
            self.replies = replies
        }
    }

    public static func encoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.keyEncodingStrategy = .convertToSnakeCase
        encoder.outputFormatting = [.sortedKeys]
        return encoder
    }

    public static func decoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        return decoder
    }

    /// Hex text (spaces, colons and a 0x prefix allowed) → bytes, or nil.
    public static func bytes(fromHex text: String) -> [UInt8]? {
        var digits = text.lowercased().replacingOccurrences(of: "0x", with: "")
        digits.removeAll { $0 == " " || $0 == ":" || $0 == "," || $0 == "\n" || $0 == "\t" }
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        var index = digits.startIndex
        while index < digits.endIndex {
            let next = digits.index(index, offsetBy: 2)
            guard let byte = UInt8(digits[index..<next], radix: 16) else { return nil }
            bytes.append(byte)
            index = next
        }
        return bytes
    }

    /// Bytes → lowercase hex without separators.
    public static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef")
        var text = ""
        text.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0F)])
        }
        return text
    }
}
