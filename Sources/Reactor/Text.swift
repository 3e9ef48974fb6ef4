/// The few text helpers the daemon and its tools need where Foundation
/// would otherwise be imported for one call.
extension String {
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
