/// A frequency in hertz.
public struct Hertz: Hashable, Sendable, Comparable, CustomStringConvertible {
    public var value: Double
    public init(_ value: Double) { self.value = value }
    public static func < (lhs: Hertz, rhs: Hertz) -> Bool { lhs.value < rhs.value }
    /// The length of one period in microseconds.
    public var periodMicroseconds: Microseconds { Microseconds(1_000_000 / value) }
    public var description: String { "\(value) Hz" }
}

/// A time span in microseconds, the unit servo pulses are specified in.
public struct Microseconds: Hashable, Sendable, Comparable, CustomStringConvertible {
    public var value: Double
    public init(_ value: Double) { self.value = value }
    public static func < (lhs: Microseconds, rhs: Microseconds) -> Bool { lhs.value < rhs.value }
    public var description: String { "\(value) µs" }
}

extension Duration {
    /// This duration in seconds as a floating-point number: what
    /// `Thread.sleep(forTimeInterval:)`, `Date` and rate arithmetic take.
    public var inSeconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
