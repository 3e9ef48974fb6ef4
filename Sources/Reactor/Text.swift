/// The few text helpers the daemon and its tools need where Foundation
/// would otherwise be imported for one call.
extension String {
    /// The text a C function wrote into `buffer`, up to its first NUL (or
    /// the whole buffer without one), as UTF-8 with invalid bytes replaced.
    public init(nulTerminated buffer: [CChar]) {
        self.init(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The string without leading and trailing spaces, tabs and newlines.
    public var trimmed: String {
        let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" || $0 == "\n" || $0 == "\r" }
        guard let first = firstIndex(where: { !isSpace($0) }), let last = lastIndex(where: { !isSpace($0) }) else { return "" }
        return String(self[first...last])
    }

    /// Every occurrence of `target` replaced by `replacement`.
    public func replacing(_ target: String, with replacement: String) -> String {
        guard !target.isEmpty else { return self }
        var result = ""
        var rest = self[...]
        while let range = rest.range(of: target) {
            result += rest[..<range.lowerBound]
            result += replacement
            rest = rest[range.upperBound...]
        }
        return result + rest
    }
}

extension Substring {
    /// The first range of `target` in this substring (a plain, literal search).
    func range(of target: String) -> Range<Index>? {
        let needle = Array(target)
        guard !needle.isEmpty else { return nil }
        var index = startIndex
        while index < endIndex {
            if self[index] == needle[0] {
                var match = true
                var probe = index
                for character in needle {
                    guard probe < endIndex, self[probe] == character else {
                        match = false
                        break
                    }
                    probe = self.index(after: probe)
                }
                if match { return index..<probe }
            }
            index = self.index(after: index)
        }
        return nil
    }
}

extension String {
    /// Padded with spaces on the right to `width` characters (never cut).
    public func padded(to width: Int) -> String {
        count >= width ? self : self + String(repeating: " ", count: width - count)
    }

    /// Padded with spaces on the left to `width` characters (never cut).
    public func padded(left width: Int) -> String {
        count >= width ? self : String(repeating: " ", count: width - count) + self
    }
}

extension Double {
    /// Fixed-point text with `decimals` digits after the point ("%.1f").
    public func fixed(_ decimals: Int) -> String {
        guard isFinite else { return "\(self)" }
        var scale = 1.0
        for _ in 0..<max(0, decimals) { scale *= 10 }
        let scaled = (abs(self) * scale).rounded()
        let negative = self < 0 && scaled > 0
        guard scaled < 9e18 else { return "\(self)" }
        let whole = UInt64(scaled)
        let divisor = UInt64(scale)
        var text = String(whole / divisor)
        if decimals > 0 {
            let fraction = String(whole % divisor)
            text += "." + String(repeating: "0", count: decimals - fraction.count) + fraction
        }
        return negative ? "-" + text : text
    }
}

extension String {
    /// Bytes from outside (a board's name, a broker's payload, a BLE
    /// device's name, a D-Bus string) as text that is safe to print on a
    /// terminal or write in a log line: nothing in it can move the cursor,
    /// set a window title, clear the screen, start a new (forged) line or
    /// change the colours.
    ///
    /// Printable ASCII and valid UTF-8 stay as they are; everything else
    /// becomes a visible escape: `\n`, `\r`, `\t`, `\\` for a backslash (so
    /// an escape in the input cannot pass for one of ours), `\xNN` for the
    /// other C0 controls (ESC is `\x1b`), DEL and each byte of invalid UTF-8
    /// (a stray continuation byte, an overlong form, a surrogate, a cut
    /// sequence), `\u{9b}` (the scalar in hex) for the C1 controls
    /// (U+0080…U+009F, which some terminals obey as CSI and OSC) and for
    /// the characters that reorder or break lines (U+2028, U+2029, the
    /// bidirectional embeddings, overrides and isolates).
    ///
    /// The result has at most `maximumLength` Unicode scalars (an escape is
    /// never cut); when the input does not fit, the last one is `…`. Work
    /// stops there, so a hostile megabyte costs what `maximumLength` does.
    public init<Bytes: Collection>(escaping bytes: Bytes, maximumLength: Int) where Bytes.Element == UInt8 {
        var out = String.UnicodeScalarView()
        let limit = Swift.max(maximumLength, 0)
        var count = 0
        var piece: [Unicode.Scalar] = []
        piece.reserveCapacity(12)
        var index = bytes.startIndex
        while index != bytes.endIndex {
            piece.removeAll(keepingCapacity: true)
            let next = Self.escapedPiece(bytes, at: index, into: &piece)
            // Room for a `…` is kept unless this is the input's last piece.
            let room = next == bytes.endIndex ? limit : limit - 1
            guard count + piece.count <= room else {
                if limit > 0 { out.append("…") }
                break
            }
            out.append(contentsOf: piece)
            count += piece.count
            index = next
        }
        self.init(out)
    }

    /// The string made safe to print or log, as ``init(escaping:maximumLength:)``
    /// does for bytes (a `String` is valid UTF-8, so only its control and
    /// line-breaking characters are escaped, and its length is cut).
    public func escaped(maximumLength: Int) -> String {
        String(escaping: utf8, maximumLength: maximumLength)
    }

    /// Appends to `piece` the scalars that stand for the character starting
    /// at `index`; returns the index after it.
    private static func escapedPiece<Bytes: Collection>(_ bytes: Bytes, at index: Bytes.Index, into piece: inout [Unicode.Scalar]) -> Bytes.Index where Bytes.Element == UInt8 {
        let lead = bytes[index]
        let next = bytes.index(after: index)
        func hex(_ byte: UInt8) -> Bytes.Index {
            piece += ["\\", "x", hexDigits[Int(byte >> 4)], hexDigits[Int(byte & 0xF)]]
            return next
        }
        switch lead {
        case UInt8(ascii: "\\"): piece += ["\\", "\\"]; return next
        case 0x0A: piece += ["\\", "n"]; return next
        case 0x0D: piece += ["\\", "r"]; return next
        case 0x09: piece += ["\\", "t"]; return next
        case 0x20..<0x7F: piece.append(Unicode.Scalar(lead)); return next
        case 0..<0x20, 0x7F: return hex(lead)
        default: break
        }
        // A multi-byte UTF-8 sequence (RFC 3629, section 4): its length and
        // the range its second byte must be in (which rules out overlong
        // forms, surrogates and scalars past U+10FFFF).
        let length: Int, second: ClosedRange<UInt8>
        switch lead {
        case 0xC2...0xDF: (length, second) = (2, 0x80...0xBF)
        case 0xE0: (length, second) = (3, 0xA0...0xBF)
        case 0xE1...0xEC, 0xEE...0xEF: (length, second) = (3, 0x80...0xBF)
        case 0xED: (length, second) = (3, 0x80...0x9F)
        case 0xF0: (length, second) = (4, 0x90...0xBF)
        case 0xF1...0xF3: (length, second) = (4, 0x80...0xBF)
        case 0xF4: (length, second) = (4, 0x80...0x8F)
        default: return hex(lead)
        }
        var value = UInt32(lead) & (length == 2 ? 0x1F : length == 3 ? 0x0F : 0x07)
        var position = next
        for count in 1..<length {
            guard position != bytes.endIndex else { return hex(lead) }
            let byte = bytes[position]
            guard count == 1 ? second.contains(byte) : (0x80...0xBF).contains(byte) else { return hex(lead) }
            value = value << 6 | UInt32(byte & 0x3F)
            position = bytes.index(after: position)
        }
        guard let scalar = Unicode.Scalar(value) else { return hex(lead) }
        switch value {
        case 0x80...0x9F, 0x2028, 0x2029, 0x202A...0x202E, 0x2066...0x2069:
            piece += "\\u{\(String(value, radix: 16))}".unicodeScalars
        default:
            piece.append(scalar)
        }
        return position
    }

    private static let hexDigits = Array("0123456789abcdef".unicodeScalars)
}

/// What makes a name for an output (a channel's or switch's `name:`, an
/// entry of `lcd.line_names`) fit to show: in Home Assistant, status lines,
/// logs and the control page. One rule, so the board file refuses exactly
/// what a reader of the daemon's status would leave out.
public enum OutputName {
    /// Characters as a person counts them.
    public static let maximumCharacters = 40
    /// A character may carry any number of combining marks: bytes bound it.
    public static let maximumBytes = 160

    /// Why `name` is unfit, or nil when it is fit.
    public static func fault(_ name: String) -> String? {
        // Bytes first: counting characters costs as much as the string is long.
        guard !name.isEmpty, name.utf8.count <= maximumBytes, name.count <= maximumCharacters,
              name.contains(where: { !$0.isWhitespace }) else {
            return "must be 1 to \(maximumCharacters) characters (at most \(maximumBytes) bytes)"
        }
        guard !name.unicodeScalars.contains(where: isUnfit) else {
            return "must not contain control characters, line separators or bidirectional formatting"
        }
        return nil
    }

    /// Control characters (C0, DEL, C1), line and paragraph separators, and
    /// the bidirectional embeddings, overrides and isolates (which would
    /// reorder the label around the name).
    private static func isUnfit(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0..<0x20, 0x7F...0x9F, 0x2028, 0x2029, 0x202A...0x202E, 0x2066...0x2069: return true
        default: return false
        }
    }
}
