import Hardware

/// A PCF8574 I2C "backpack" that drives an HD44780 in 4-bit mode: the
/// pin-mapped adapter layer under ``HD44780``.
///
/// The PCF8574 has no registers: each byte of a write message is latched onto
/// the port pins at its acknowledge (NXP PCF8574 data sheet §8.2), so every
/// change of the LCD's RS, RW, E, backlight or D4…D7 inputs is one port byte.
/// This type turns "strobe this nibble" into those port bytes; it does no I/O.
public struct PCF8574Backpack: Sendable, Hashable {
    /// The expander's address (PCF8574: 0x20…0x27, PCF8574A: 0x38…0x3F).
    public var address: I2CAddress
    /// Which port bit drives which LCD input.
    public var pinMap: PCF8574PinMap

    public init(address: I2CAddress, pinMap: PCF8574PinMap = .common) {
        self.address = address
        self.pinMap = pinMap
    }

    /// The two port bytes that transfer one 4-bit nibble: E high with the
    /// nibble and RS on the data lines, then E low with nothing else changed.
    ///
    /// The HD44780 latches on the falling edge of E (HD44780U datasheet
    /// Figure 25, write operation), so the second byte must keep RS and the
    /// data steady (hold times tAH, tH). Each byte occupies the bus for about
    /// 90 µs at 100 kHz, far longer than the minimum E pulse width (PWEH,
    /// 230 ns) and data set-up time (tDSW, 80 ns). RW stays low: the driver
    /// never reads.
    public func strobe(_ nibble: UInt8, rs: Bool, backlight: Bool) -> (UInt8, UInt8) {
        let high = pinMap.portByte(rs: rs, rw: false, e: true, backlight: backlight, data: nibble & 0x0F)
        let low = pinMap.portByte(rs: rs, rw: false, e: false, backlight: backlight, data: nibble & 0x0F)
        return (high, low)
    }

    /// The four port bytes that transfer a whole byte in 4-bit mode: the high
    /// nibble first (HD44780U datasheet, "Interfacing to the MPU", Figure 9).
    public func appendByte(_ value: UInt8, rs: Bool, backlight: Bool, to bytes: inout [UInt8]) {
        let first = strobe(value >> 4, rs: rs, backlight: backlight)
        let second = strobe(value & 0x0F, rs: rs, backlight: backlight)
        bytes.append(first.0)
        bytes.append(first.1)
        bytes.append(second.0)
        bytes.append(second.1)
    }

    /// A port byte with E, RS and RW low and the data lines low: the idle
    /// state, which changes nothing on the LCD but the backlight.
    public func idle(backlight: Bool) -> UInt8 {
        pinMap.portByte(rs: false, rw: false, e: false, backlight: backlight, data: 0)
    }
}
