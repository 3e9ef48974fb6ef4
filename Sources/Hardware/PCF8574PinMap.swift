/// How a PCF8574 I2C "backpack" wires its eight port pins P0…P7 to an
/// HD44780 character LCD in 4-bit mode.
///
/// The PCF8574 has no registers: a written byte sets the port pins directly
/// (TI PCF8574 datasheet §8.3.2), so every LCD pin change is one port byte.
/// Backpacks differ in wiring; the board file names the pins, and the driver
/// (`Devices`) and the emulator (`DeviceEmulators`) both read them from this
/// one type.
public struct PCF8574PinMap: Sendable, Hashable, CustomStringConvertible {
    /// Port bit (0…7) of the HD44780 register select input (0 = instruction, 1 = data).
    public var rs: Int
    /// Port bit of the read/write input (the driver only ever writes: held low).
    public var rw: Int
    /// Port bit of the enable (strobe) input.
    public var e: Int
    /// Port bit that switches the backlight transistor (high = lit on common boards).
    public var backlight: Int
    /// Port bits of the four data lines used in 4-bit mode.
    public var d4: Int
    public var d5: Int
    public var d6: Int
    public var d7: Int

    /// Stores the bit numbers as given; call ``validate()`` before use when
    /// they come from a file.
    public init(rs: Int, rw: Int, e: Int, backlight: Int, d4: Int, d5: Int, d6: Int, d7: Int) {
        self.rs = rs
        self.rw = rw
        self.e = e
        self.backlight = backlight
        self.d4 = d4
        self.d5 = d5
        self.d6 = d6
        self.d7 = d7
    }

    /// The wiring of the ubiquitous blue "LCM1602 IIC" backpack (and most
    /// clones): P0 = RS, P1 = RW, P2 = E, P3 = backlight, P4…P7 = D4…D7.
    public static let common = PCF8574PinMap(rs: 0, rw: 1, e: 2, backlight: 3, d4: 4, d5: 5, d6: 6, d7: 7)

    /// Why a pin map cannot be used.
    public struct ValidationError: Error, Sendable, Hashable, CustomStringConvertible {
        public var pinMap: PCF8574PinMap
        public var reason: String
        public var description: String { "PCF8574 pin map \(pinMap): \(reason)" }
    }

    /// Checks that every signal has its own port bit in 0…7.
    public func validate() throws {
        let named = namedBits
        for (name, bit) in named where !(0...7).contains(bit) {
            throw ValidationError(pinMap: self, reason: "\(name) = \(bit) is not a port bit 0…7")
        }
        var seen: [Int: String] = [:]
        for (name, bit) in named {
            if let other = seen[bit] {
                throw ValidationError(pinMap: self, reason: "\(other) and \(name) share port bit \(bit)")
            }
            seen[bit] = name
        }
    }

    /// The port byte that puts these levels on the pins. `data` holds D7…D4
    /// in its low nibble (bit 3 = D7); higher bits are ignored.
    public func portByte(rs: Bool, rw: Bool, e: Bool, backlight: Bool, data: UInt8) -> UInt8 {
        var byte: UInt8 = 0
        if rs { byte |= Self.mask(self.rs) }
        if rw { byte |= Self.mask(self.rw) }
        if e { byte |= Self.mask(self.e) }
        if backlight { byte |= Self.mask(self.backlight) }
        for (index, bit) in dataBits.enumerated() where data & (1 << index) != 0 {
            byte |= Self.mask(bit)
        }
        return byte
    }

    /// The pin levels a port byte produces: the inverse of
    /// ``portByte(rs:rw:e:backlight:data:)``.
    public func levels(of port: UInt8) -> (rs: Bool, rw: Bool, e: Bool, backlight: Bool, data: UInt8) {
        var data: UInt8 = 0
        for (index, bit) in dataBits.enumerated() where port & Self.mask(bit) != 0 {
            data |= 1 << index
        }
        return (
            port & Self.mask(rs) != 0,
            port & Self.mask(rw) != 0,
            port & Self.mask(e) != 0,
            port & Self.mask(backlight) != 0,
            data
        )
    }

    public var description: String {
        namedBits.map { "\($0.name)=P\($0.bit)" }.joined(separator: " ")
    }

    /// D4, D5, D6, D7: index i carries data bit i of a nibble.
    private var dataBits: [Int] { [d4, d5, d6, d7] }

    private var namedBits: [(name: String, bit: Int)] {
        [("RS", rs), ("RW", rw), ("E", e), ("backlight", backlight), ("D4", d4), ("D5", d5), ("D6", d6), ("D7", d7)]
    }

    /// One bit; a bit number outside 0…7 gives an empty mask instead of
    /// trapping (``validate()`` reports it).
    private static func mask(_ bit: Int) -> UInt8 {
        (0...7).contains(bit) ? UInt8(1) << UInt8(bit) : 0
    }
}
