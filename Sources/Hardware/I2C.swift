/// A 7-bit I2C target address (0x03…0x77; the rest are reserved by the I2C
/// specification, UM10204 §3.1.12).
public struct I2CAddress: Hashable, Sendable, Comparable, CustomStringConvertible {
    /// The 7-bit address, without the R/W bit.
    public let rawValue: UInt8

    /// Accepts only the non-reserved 7-bit range 0x03…0x77.
    public init?(_ rawValue: Int) {
        guard (0x03...0x77).contains(rawValue) else { return nil }
        self.rawValue = UInt8(rawValue)
    }

    public static func < (lhs: I2CAddress, rhs: I2CAddress) -> Bool { lhs.rawValue < rhs.rawValue }

    /// `0x40` style, as i2cdetect prints addresses.
    public var description: String {
        let hex = String(rawValue, radix: 16)
        return "0x" + (hex.count < 2 ? "0" + hex : hex)
    }
}

/// One message of a combined I2C transaction (one `struct i2c_msg` of
/// i2c-dev's `I2C_RDWR`): messages are separated by repeated STARTs and the
/// transaction ends with one STOP.
public enum I2CMessage: Sendable, Hashable {
    /// Write these bytes to the target.
    case write([UInt8])
    /// Read this many bytes from the target.
    case read(count: Int)
}

/// Why an I2C transaction failed. Errors carry the address and what was
/// being done, so that a log line or `blecontrol status` can say it plainly.
public struct I2CError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Kind: Sendable, Hashable {
        /// The target did not acknowledge its address or a byte (absent,
        /// unplugged, busy). i2c-dev reports it as `ENXIO` or `EREMOTEIO`.
        case noAcknowledge
        /// The transfer did not complete in time (`ETIMEDOUT`, clock stretching).
        case timeout
        /// Arbitration lost or a malformed transfer on the wire (`EAGAIN`, `EIO`).
        case busError
        /// The adapter cannot perform this kind of transfer (`EOPNOTSUPP`).
        case notSupported
        /// Any other failure, with the operating system's error number.
        case system(errno: Int32)
    }

    public var kind: Kind
    public var address: I2CAddress?
    /// What was being attempted, e.g. "write 5 bytes" or "open /dev/i2c-1".
    public var context: String

    public init(_ kind: Kind, address: I2CAddress?, context: String) {
        self.kind = kind
        self.address = address
        self.context = context
    }

    public var description: String {
        let what: String
        switch kind {
        case .noAcknowledge: what = "no acknowledge"
        case .timeout: what = "timeout"
        case .busError: what = "bus error"
        case .notSupported: what = "not supported by the adapter"
        case .system(let errno): what = "system error \(errno)"
        }
        if let address { return "I2C \(address): \(context): \(what)" }
        return "I2C: \(context): \(what)"
    }
}

/// An I2C bus master. Everything a driver does on the bus is one call shaped
/// like a transaction, as i2c-dev's `I2C_RDWR`.
///
/// Implementations serialise transactions: two callers never interleave
/// messages on the wire. Errors thrown are ``I2CError``.
public protocol I2CBus: AnyObject, Sendable {
    /// Runs the messages as one combined transaction addressed to `address`
    /// and returns, in order, the bytes of each `.read` message.
    @discardableResult
    func transfer(_ messages: [I2CMessage], at address: I2CAddress) throws -> [[UInt8]]

    /// The longest single write message this bus can carry, or `nil` when
    /// unbounded. SMBus-only adapters are limited to a block of 32 data bytes
    /// after the command byte (SMBus 3.0 §6.5.7), i.e. 33 bytes per message.
    var maxWriteLength: Int? { get }
}

extension I2CBus {
    public var maxWriteLength: Int? { nil }

    /// Writes `bytes` as one message.
    public func write(_ bytes: [UInt8], to address: I2CAddress) throws {
        try transfer([.write(bytes)], at: address)
    }

    /// Writes `bytes` and reads `count` bytes back after a repeated START
    /// (the usual register read).
    public func writeRead(_ bytes: [UInt8], count: Int, at address: I2CAddress) throws -> [UInt8] {
        let replies = try transfer([.write(bytes), .read(count: count)], at: address)
        return replies.first ?? []
    }
}

/// A bus that takes every write and answers every read with zeros: a
/// driver's code runs in full and nothing reaches a chip (the servo path's
/// warm-up, benchmarks of a driver's own cost).
public final class DiscardingI2CBus: I2CBus, Sendable {
    public init() {}
    public var maxWriteLength: Int? { nil }
    public func transfer(_ messages: [I2CMessage], at address: I2CAddress) throws -> [[UInt8]] {
        var replies: [[UInt8]] = []
        for case .read(let count) in messages { replies.append([UInt8](repeating: 0, count: count)) }
        return replies
    }
}
