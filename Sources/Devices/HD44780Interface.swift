import Hardware

/// How an HD44780 in 4-bit mode is wired to the machine. The driver
/// (``HD44780``) decides which nibbles reach the LCD, with which RS, in
/// which transactions; an interface turns each nibble into the pin changes
/// of its transport and puts a transaction on the wire. The PCF8574 I2C
/// backpack is one (``PCF8574Interface``); an MCP23008 expander or four GPIO
/// lines would be others, with the same driver.
public protocol HD44780Interface: Sendable, CustomStringConvertible {
    /// Appends what strobes one nibble into the LCD (E high with the data,
    /// then E low: the HD44780 latches on the falling edge of E, datasheet
    /// Figure 25) to a transaction.
    func appendNibble(_ nibble: UInt8, rs: Bool, backlight: Bool, to transaction: inout [UInt8])
    /// Appends an idle state (E, RS, RW and data low): changes nothing on the
    /// LCD but the backlight.
    func appendIdle(backlight: Bool, to transaction: inout [UInt8])
    /// Transaction bytes per nibble.
    var bytesPerNibble: Int { get }
    /// The longest transaction the transport carries at once (nil: any).
    var maxTransactionBytes: Int? { get }
    /// Puts one transaction on the wire (split if the transport must);
    /// returns how many bus transactions that took.
    func send(_ transaction: [UInt8]) throws -> Int
    /// Checks the wiring before the driver relies on it.
    func validate() throws
}

extension HD44780Interface {
    /// A whole byte in 4-bit mode: high nibble first (HD44780U datasheet,
    /// "Interfacing to the MPU", Figure 9).
    public func appendByte(_ value: UInt8, rs: Bool, backlight: Bool, to transaction: inout [UInt8]) {
        appendNibble(value >> 4, rs: rs, backlight: backlight, to: &transaction)
        appendNibble(value & 0x0F, rs: rs, backlight: backlight, to: &transaction)
    }
}

/// An HD44780 behind a PCF8574 I2C backpack: each port byte the expander
/// latches is one state of the LCD's pins (``PCF8574Backpack``), and a
/// transaction is one I2C write.
public struct PCF8574Interface: HD44780Interface {
    public let bus: any I2CBus
    public let backpack: PCF8574Backpack

    public init(bus: any I2CBus, backpack: PCF8574Backpack) {
        self.bus = bus
        self.backpack = backpack
    }

    public var description: String { "PCF8574 backpack at \(backpack.address)" }
    public var bytesPerNibble: Int { 2 }
    public var maxTransactionBytes: Int? { bus.maxWriteLength }

    public func appendNibble(_ nibble: UInt8, rs: Bool, backlight: Bool, to transaction: inout [UInt8]) {
        let (high, low) = backpack.strobe(nibble, rs: rs, backlight: backlight)
        transaction.append(high)
        transaction.append(low)
    }

    public func appendIdle(backlight: Bool, to transaction: inout [UInt8]) {
        transaction.append(backpack.idle(backlight: backlight))
    }

    /// Splitting a transaction anywhere is harmless: the PCF8574 latches
    /// byte by byte (NXP PCF8574 §8.2), and the LCD cares only about the
    /// order of the pin changes.
    public func send(_ transaction: [UInt8]) throws -> Int {
        let step = max(bus.maxWriteLength ?? transaction.count, 1)
        var transactions = 0
        var start = 0
        while start < transaction.count {
            let end = min(start + step, transaction.count)
            try bus.write(Array(transaction[start..<end]), to: backpack.address)
            transactions += 1
            start = end
        }
        return transactions
    }

    public func validate() throws {
        try backpack.pinMap.validate()
    }
}
