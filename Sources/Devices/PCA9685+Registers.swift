import Hardware

// Register map and bitfields of the NXP PCA9685 (product data sheet Rev. 4,
// 16 April 2015; "§" refers to its sections).

extension PCA9685 {
    /// A register address (§7.3, Table 4).
    public struct Register: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }

        /// Mode register 1 (§7.3.1); power-on 0x11.
        public static let mode1 = Register(rawValue: 0x00)
        /// Mode register 2 (§7.3.2); power-on 0x04.
        public static let mode2 = Register(rawValue: 0x01)
        /// I2C-bus sub-addresses 1…3 (§7.3.6).
        public static let subaddress1 = Register(rawValue: 0x02)
        public static let subaddress2 = Register(rawValue: 0x03)
        public static let subaddress3 = Register(rawValue: 0x04)
        /// LED All Call I2C-bus address (§7.3.7).
        public static let allCallAddress = Register(rawValue: 0x05)
        /// Load every LEDn register of the same kind at once (§7.3.4). Write
        /// only: they read back as zero.
        public static let allLEDOnLow = Register(rawValue: 0xFA)
        public static let allLEDOnHigh = Register(rawValue: 0xFB)
        public static let allLEDOffLow = Register(rawValue: 0xFC)
        public static let allLEDOffHigh = Register(rawValue: 0xFD)
        /// PWM frequency prescaler (§7.3.5); writable only while MODE1 SLEEP is set.
        public static let prescale = Register(rawValue: 0xFE)

        /// LEDn_ON_L = 0x06 + 4n; ON_H, OFF_L and OFF_H follow (§7.3.3, Table 7).
        /// Returns `nil` for a channel outside 0…15.
        public static func ledOnLow(_ channel: Int) -> Register? { led(channel, 0) }
        public static func ledOnHigh(_ channel: Int) -> Register? { led(channel, 1) }
        public static func ledOffLow(_ channel: Int) -> Register? { led(channel, 2) }
        public static func ledOffHigh(_ channel: Int) -> Register? { led(channel, 3) }

        private static func led(_ channel: Int, _ byte: Int) -> Register? {
            guard (0..<PCA9685.channelCount).contains(channel) else { return nil }
            return Register(rawValue: UInt8(0x06 + 4 * channel + byte))
        }

        public var description: String {
            let hex = String(rawValue, radix: 16)
            return "0x" + (hex.count < 2 ? "0" + hex : hex)
        }
    }

    /// MODE1 bits (§7.3.1, Table 5).
    public struct Mode1: OptionSet, Hashable, Sendable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }

        /// Reads 1 when PWM was running as the chip went to sleep; writing 1
        /// (awake, at least 500 µs after clearing SLEEP) restarts the PWM
        /// channels and clears it (§7.3.1.1).
        public static let restart = Mode1(rawValue: 0x80)
        /// Use the EXTCLK pin; sticky until power cycle or software reset.
        public static let externalClock = Mode1(rawValue: 0x40)
        /// The control register auto-increments after each data byte.
        public static let autoIncrement = Mode1(rawValue: 0x20)
        /// Low-power mode, oscillator off.
        public static let sleep = Mode1(rawValue: 0x10)
        /// Respond to the I2C-bus sub-addresses 1…3.
        public static let subaddress1 = Mode1(rawValue: 0x08)
        public static let subaddress2 = Mode1(rawValue: 0x04)
        public static let subaddress3 = Mode1(rawValue: 0x02)
        /// Respond to the LED All Call address (0x70 at power-on).
        public static let allCall = Mode1(rawValue: 0x01)
    }

    /// MODE2 bits (§7.3.2, Table 6).
    public struct Mode2: OptionSet, Hashable, Sendable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }

        /// Output logic state inverted.
        public static let invert = Mode2(rawValue: 0x10)
        /// Outputs change on ACK instead of on STOP.
        public static let outputChangeOnAck = Mode2(rawValue: 0x08)
        /// Totem-pole outputs (OUTDRV = 1); without it, open-drain.
        public static let totemPole = Mode2(rawValue: 0x04)
        /// OUTNE: with OE high, LEDn = 1 (totem pole) or high-impedance (open drain).
        public static let outputNotEnabledHigh = Mode2(rawValue: 0x01)
        /// OUTNE: with OE high, LEDn = high-impedance.
        public static let outputNotEnabledHighImpedance = Mode2(rawValue: 0x02)
    }

    /// Bit 4 of LEDn_ON_H is full ON, of LEDn_OFF_H full OFF; full OFF takes
    /// precedence (§7.3.3).
    static let fullBit: UInt8 = 0x10

    /// The 12-bit counter: 4096 ticks per PWM period (§7.3.3).
    static let ticksPerPeriod = 4096

    /// The four registers of one LED output, in bus order: ON_L, ON_H,
    /// OFF_L, OFF_H (§7.3.3). A value type without heap storage, so the
    /// servo path can compare and copy it freely.
    struct LEDRegisters: Equatable, Sendable {
        var onLow: UInt8
        var onHigh: UInt8
        var offLow: UInt8
        var offHigh: UInt8

        /// Full OFF, ON and OFF counts 0: what start() loads into every channel.
        static let fullOff = LEDRegisters(onLow: 0, onHigh: 0, offLow: 0, offHigh: PCA9685.fullBit)
        static let fullOn = LEDRegisters(onLow: 0, onHigh: PCA9685.fullBit, offLow: 0, offHigh: 0)

        /// High from tick 0 to `ticks` (1…4095).
        static func pulse(ticks: Int) -> LEDRegisters {
            LEDRegisters(onLow: 0, onHigh: 0, offLow: UInt8(ticks & 0xFF), offHigh: UInt8((ticks >> 8) & 0x0F))
        }

        var bytes: [UInt8] { [onLow, onHigh, offLow, offHigh] }

        /// Appends the four register bytes without building an array.
        func append(to buffer: inout [UInt8]) {
            buffer.append(onLow)
            buffer.append(onHigh)
            buffer.append(offLow)
            buffer.append(offHigh)
        }

        /// Ticks of each period the output is high, as programmed (0…4096).
        /// Full OFF wins over full ON; ON > OFF wraps around the period end.
        var highTicks: Int {
            if offHigh & PCA9685.fullBit != 0 { return 0 }
            if onHigh & PCA9685.fullBit != 0 { return PCA9685.ticksPerPeriod }
            let on = Int(onLow) | Int(onHigh & 0x0F) << 8
            let off = Int(offLow) | Int(offHigh & 0x0F) << 8
            return (off - on + PCA9685.ticksPerPeriod) % PCA9685.ticksPerPeriod
        }
    }
}
