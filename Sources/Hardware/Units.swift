/// A frequency in hertz.
public struct Hertz: Hashable, Sendable, Comparable, CustomStringConvertible {
    public var value: Double
    public init(_ value: Double) { self.value = value }
    public static func < (lhs: Hertz, rhs: Hertz) -> Bool { lhs.value < rhs.value }
    /// The length of one period in microseconds.
    public var periodMicroseconds: Microseconds { Microseconds(1_000_000 / value) }
    /// "50.029 Hz": three decimals at most, enough for a prescaled
    /// PCA9685 frequency (datasheet §7.3.5), none of float noise.
    public var description: String { "\(Self.show(value, decimals: 3)) Hz" }

    /// `value` with at most `decimals` decimals, trailing zeros dropped.
    static func show(_ value: Double, decimals: Int) -> String {
        var scale = 1.0
        for _ in 0..<decimals { scale *= 10 }
        let rounded = (value * scale).rounded() / scale
        if rounded == rounded.rounded(), abs(rounded) < 1e15 { return String(Int64(rounded)) }
        var text = "\(rounded)"
        if let dot = text.firstIndex(of: "."), text.distance(from: dot, to: text.endIndex) - 1 > decimals {
            text = String(text[...text.index(dot, offsetBy: decimals)])
        }
        return text
    }
}

/// A time span in microseconds, the unit servo pulses are specified in.
public struct Microseconds: Hashable, Sendable, Comparable, CustomStringConvertible {
    public var value: Double
    public init(_ value: Double) { self.value = value }
    public static func < (lhs: Microseconds, rhs: Microseconds) -> Bool { lhs.value < rhs.value }
    /// "2000.8 µs": a tenth of a microsecond at most.
    public var description: String { "\(Hertz.show(value, decimals: 1)) µs" }
}

extension Duration {
    /// This duration in seconds as a floating-point number: what
    /// `Thread.sleep(forTimeInterval:)`, `Date` and rate arithmetic take.
    public var inSeconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
