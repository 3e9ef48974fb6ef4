import Reactor
import Hardware

/// A register-accurate NXP PCA9685 16-channel, 12-bit PWM controller, as seen
/// from the I2C bus (NXP PCA9685 product data sheet, Rev. 4, 16 April 2015;
/// "§" below refers to its sections).
///
/// What is modelled: the register file with its power-on values (§7.3,
/// Table 4), the control-register pointer with Auto-Increment and its
/// roll-over rules, MODE1 SLEEP / RESTART / EXTCLK semantics, the PRE_SCALE
/// write lock while awake and its hardware minimum, the ALL_LED registers,
/// full-ON / full-OFF with full-OFF precedence, MODE2 INVRT and OCH (outputs
/// change on STOP or on ACK). From these the emulator derives what each LED
/// pin is doing: pulse width and duty cycle.
///
/// What is not modelled: the OE pin (assumed tied low, outputs enabled), the
/// LED All Call and sub-addresses as extra bus addresses (an
/// ``EmulatedI2CBus`` routes one address per device), software reset via the
/// General Call address, the oscillator start-up time, and the
/// end-of-LOW-cycle update timing of §7.3.4 (changes apply instantly).
///
/// This emulator deliberately shares no code with the `Devices` driver: it is
/// the independent oracle the driver's tests are checked against.
///
/// Thread-safe: the bus serialises transactions, and every accessor takes the
/// emulator's own lock so tests and status readers may look at any time.
public final class PCA9685Emulator: EmulatedI2CDevice, @unchecked Sendable {
    /// The number of LED outputs (LED0…LED15).
    public static let channelCount = 16

    /// A channel's output as the chip is producing it right now.
    public struct ChannelOutput: Sendable, Equatable {
        /// The 12-bit LEDn_ON count (0…4095), as latched for the output.
        public var onTick: Int
        /// The 12-bit LEDn_OFF count (0…4095), as latched for the output.
        public var offTick: Int
        /// The output is always on (LEDn_ON_H bit 4 set and not overridden
        /// by full OFF, §7.3.3).
        public var fullOn: Bool
        /// The output is always off (LEDn_OFF_H bit 4, which takes
        /// precedence over full ON, §7.3.3).
        public var fullOff: Bool
        /// How long the pin is high in each period. 0 while the chip sleeps
        /// or when the pin is constantly low; a whole period when it is
        /// constantly high (full ON, or full OFF with INVRT).
        public var pulseWidth: Microseconds
        /// The fraction of each period the pin is high (0…1). With MODE2
        /// INVRT set this is the complement of the programmed duty, because
        /// the pin itself is inverted (§7.3.2, Table 6). 0 while sleeping.
        public var duty: Double
    }

    // Register addresses (§7.3, Table 4). Private on purpose: the emulator
    // does not borrow the driver's definitions.
    private enum Address {
        static let mode1: UInt8 = 0x00
        static let mode2: UInt8 = 0x01
        static let subaddress1: UInt8 = 0x02
        static let allCallAddress: UInt8 = 0x05
        static let led0OnLow: UInt8 = 0x06
        static let led15OffHigh: UInt8 = 0x45
        static let allLEDOnLow: UInt8 = 0xFA
        static let allLEDOffHigh: UInt8 = 0xFD
        static let prescale: UInt8 = 0xFE
        static let testMode: UInt8 = 0xFF
    }

    // MODE1 bits (§7.3.1, Table 5).
    private enum Mode1 {
        static let restart: UInt8 = 0x80
        static let externalClock: UInt8 = 0x40
        static let autoIncrement: UInt8 = 0x20
        static let sleep: UInt8 = 0x10
    }

    // MODE2 bits (§7.3.2, Table 6).
    private enum Mode2 {
        static let invert: UInt8 = 0x10
        static let outputChangeOnAck: UInt8 = 0x08
    }

    /// Bit 4 of LEDn_ON_H is full ON, of LEDn_OFF_H full OFF (§7.3.3).
    private static let fullBit: UInt8 = 0x10
    /// The counter is 12 bits: 4096 ticks per period (§7.3.3).
    private static let ticksPerPeriod = 4096
    /// "The hardware forces a minimum value that can be loaded into the
    /// PRE_SCALE register at '3'" (§7.3.5).
    private static let minimumPrescale: UInt8 = 3
    private static let ledRegisterCount = channelCount * 4

    private let lock = Lock()
    private let oscillator: Hertz
    /// The register file as the bus reads it back; write-only and reserved
    /// addresses stay 0.
    private var file = [UInt8](repeating: 0, count: 256)
    /// LED0_ON_L…LED15_OFF_H as the output stage currently uses them. They
    /// follow `file` at STOP (OCH = 0) or at each byte's ACK (OCH = 1).
    private var latched = [UInt8](repeating: 0, count: PCA9685Emulator.ledRegisterCount)
    /// The control register: where the next data byte goes or comes from.
    private var pointer: UInt8 = 0
    /// Whether an LED register was written since the last STOP.
    private var ledWrittenSinceStop = false
    /// Per channel, which of its four registers this write message touched
    /// (for clearing RESTART with OCH = 1, §7.3.1.1).
    private var channelBytesWritten = [UInt8](repeating: 0, count: PCA9685Emulator.channelCount)
    private var writeCount = 0
    /// Per channel, the outputs it has produced, oldest first (changes
    /// only; the last ``historyLimit``).
    private var produced: [[ChannelOutput]] = Array(repeating: [], count: PCA9685Emulator.channelCount)
    /// How many changes ``history(channel:)`` keeps per channel.
    public static let historyLimit = 64

    /// A chip in its power-on reset state (§7.5).
    /// - Parameter oscillator: the clock the chip runs from; the internal
    ///   oscillator is nominally 25 MHz (§7.3.5) but real boards measure
    ///   anywhere from about 23 to 27 MHz.
    public init(oscillator: Hertz = Hertz(25_000_000)) {
        self.oscillator = oscillator
        // Power-on values, Table 4 to Table 8: MODE1 0x11 (SLEEP, ALLCALL),
        // MODE2 0x04 (totem pole), SUBADR1…3 0xE2/0xE4/0xE8, ALLCALLADR 0xE0,
        // every LEDn full OFF, PRE_SCALE 0x1E (200 Hz at 25 MHz).
        file[Int(Address.mode1)] = 0x11
        file[Int(Address.mode2)] = 0x04
        file[Int(Address.subaddress1)] = 0xE2
        file[Int(Address.subaddress1) + 1] = 0xE4
        file[Int(Address.subaddress1) + 2] = 0xE8
        file[Int(Address.allCallAddress)] = 0xE0
        for channel in 0..<Self.channelCount {
            file[Int(Address.led0OnLow) + 4 * channel + 3] = Self.fullBit
        }
        file[Int(Address.prescale)] = 0x1E
        latchAllLEDRegisters()
    }

    // MARK: - Observing the chip

    /// The output of LED `channel` (0…15) as the chip produces it now. A
    /// channel outside 0…15 reads as a pin that produces nothing.
    public func output(channel: Int) -> ChannelOutput {
        lock.withLock { computeOutput(channel: channel) }
    }

    /// What LED `channel` has produced since the chip was made, one entry
    /// per change, oldest first (at most ``historyLimit``): a test can check
    /// the order of outputs (an ESC's neutral pulse, then nothing) without
    /// racing the time each one lasted.
    public func history(channel: Int) -> [ChannelOutput] {
        lock.withLock { produced.indices.contains(channel) ? produced[channel] : [] }
    }

    /// All 16 outputs, LED0 first.
    public var outputs: [ChannelOutput] {
        lock.withLock { (0..<Self.channelCount).map { computeOutput(channel: $0) } }
    }

    /// The PWM frequency: oscillator / (4096 × (PRE_SCALE + 1)) (§7.3.5,
    /// Equation 1 solved for the update rate).
    public var outputFrequency: Hertz {
        lock.withLock { currentFrequency() }
    }

    /// MODE1 SLEEP: the oscillator is off and no output produces pulses.
    public var isSleeping: Bool {
        lock.withLock { isAsleep }
    }

    /// The register at `address` as an I2C read would return it (ALL_LED,
    /// reserved and TestMode registers read 0), without moving the pointer.
    public func register(_ address: UInt8) -> UInt8 {
        lock.withLock { file[Int(address)] }
    }

    /// Data bytes written into registers since the chip was made (pointer
    /// bytes are not counted; bytes the chip ignores, such as PRE_SCALE
    /// while awake, are).
    public var registerWriteCount: Int {
        lock.withLock { writeCount }
    }

    // MARK: - EmulatedI2CDevice

    public func receive(_ bytes: [UInt8]) {
        lock.withLock {
            // The first byte of every write is the control register (§7.2);
            // the rest are data from there on.
            guard let first = bytes.first else { return }
            pointer = first
            for index in channelBytesWritten.indices { channelBytesWritten[index] = 0 }
            for byte in bytes.dropFirst() {
                writeCount += 1
                write(byte, at: pointer)
                advancePointer()
            }
            recordOutputs()
        }
    }

    public func transmit(count: Int) -> [UInt8] {
        lock.withLock {
            var reply: [UInt8] = []
            reply.reserveCapacity(count)
            for _ in 0..<max(count, 0) {
                reply.append(file[Int(pointer)])
                advancePointer()
            }
            return reply
        }
    }

    public func stop() {
        lock.withLock {
            guard ledWrittenSinceStop else { return }
            ledWrittenSinceStop = false
            // With OCH = 0 the outputs change on STOP (§7.3.2, Table 6), and
            // "write to any PWM register then issue an I2C-bus STOP" clears
            // RESTART (§7.3.1.1).
            if file[Int(Address.mode2)] & Mode2.outputChangeOnAck == 0 {
                latchAllLEDRegisters()
                file[Int(Address.mode1)] &= ~Mode1.restart
            }
            recordOutputs()
        }
    }

    /// Appends each channel's output to its history when it changed.
    private func recordOutputs() {
        for channel in produced.indices {
            let now = computeOutput(channel: channel)
            guard produced[channel].last != now else { continue }
            if produced[channel].count == Self.historyLimit { produced[channel].removeFirst() }
            produced[channel].append(now)
        }
    }

    // MARK: - Register semantics (lock held)

    private var isAsleep: Bool { file[Int(Address.mode1)] & Mode1.sleep != 0 }

    private func currentFrequency() -> Hertz {
        Hertz(oscillator.value / Double(Self.ticksPerPeriod * (Int(file[Int(Address.prescale)]) + 1)))
    }

    /// Auto-Increment (MODE1 AI): "Auto Increment past register 69 will point
    /// to MODE1 register (register 0). Auto Increment also works from
    /// register 250 to register 254, then rolls over to register 0" (§7.3,
    /// remark under Table 4). Without AI the pointer stays put.
    private func advancePointer() {
        guard file[Int(Address.mode1)] & Mode1.autoIncrement != 0 else { return }
        switch pointer {
        case Address.led15OffHigh, Address.prescale, Address.testMode: pointer = 0
        default: pointer += 1
        }
    }

    private func write(_ value: UInt8, at address: UInt8) {
        switch address {
        case Address.mode1:
            writeMode1(value)
        case Address.mode2:
            // Bits 7…5 are reserved, read-only 0 (Table 6).
            file[Int(address)] = value & 0x1F
        case Address.subaddress1...Address.allCallAddress:
            // Bit 0 of the address registers is read-only 0 (§7.3.6, §7.3.7).
            file[Int(address)] = value & 0xFE
        case Address.led0OnLow...Address.led15OffHigh:
            writeLED(value, at: address)
        case Address.allLEDOnLow...Address.allLEDOffHigh:
            // ALL_LED_xx loads the same byte into every LEDn_xx (§7.3.4); the
            // ALL_LED registers themselves read back as zero (Table 4).
            let offset = address - Address.allLEDOnLow
            for channel in 0..<UInt8(Self.channelCount) {
                writeLED(value, at: Address.led0OnLow + 4 * channel + offset)
            }
        case Address.prescale:
            // "Writes to PRE_SCALE register are blocked when SLEEP bit is
            // logic 0" (Table 4 note [1], §7.3.5); minimum 3 (§7.3.5).
            if isAsleep { file[Int(address)] = max(value, Self.minimumPrescale) }
        default:
            // Reserved registers (a real chip does not acknowledge them) and
            // TestMode ("writes may cause unpredictable results"): ignored.
            break
        }
    }

    private func writeMode1(_ value: UInt8) {
        let old = file[Int(Address.mode1)]
        let wasAsleep = old & Mode1.sleep != 0
        let willSleep = value & Mode1.sleep != 0
        var restart = old & Mode1.restart
        if !wasAsleep && willSleep {
            // Going to sleep with PWM channels running sets RESTART at the end
            // of the PWM cycle; after an orderly shutdown (every channel full
            // OFF) it is cleared instead (§7.3.1.1).
            restart = anyChannelRunning() ? Mode1.restart : 0
        } else if value & Mode1.restart != 0 && !willSleep {
            // Writing 1 to RESTART while awake restarts the PWM channels and
            // clears the bit; writing 0 has no effect (§7.3.1.1, Table 5).
            restart = 0
        }
        // EXTCLK is sticky: it can be set only by writing it together with
        // SLEEP while already asleep, and cleared only by a power cycle or
        // software reset (Table 5).
        let externalClock = (old & Mode1.externalClock != 0)
            || (value & Mode1.externalClock != 0 && wasAsleep && willSleep)
        file[Int(Address.mode1)] = restart
            | (externalClock ? Mode1.externalClock : 0)
            | (value & ~(Mode1.restart | Mode1.externalClock))
    }

    private func writeLED(_ value: UInt8, at address: UInt8) {
        let index = Int(address - Address.led0OnLow)
        let channel = index / 4
        let byte = index % 4
        // In LEDn_ON_H and LEDn_OFF_H bits 7…5 are reserved, read-only 0
        // (§7.3.3, Table 7).
        let masked = byte % 2 == 1 ? value & 0x1F : value
        file[Int(address)] = masked
        ledWrittenSinceStop = true
        if file[Int(Address.mode2)] & Mode2.outputChangeOnAck != 0 {
            // OCH = 1: outputs change on ACK (Table 6); writing all four
            // registers of a channel clears RESTART (§7.3.1.1).
            latched[index] = masked
            channelBytesWritten[channel] |= 1 << byte
            if channelBytesWritten[channel] == 0x0F {
                file[Int(Address.mode1)] &= ~Mode1.restart
            }
        }
    }

    private func latchAllLEDRegisters() {
        let start = Int(Address.led0OnLow)
        for index in latched.indices { latched[index] = file[start + index] }
    }

    private func anyChannelRunning() -> Bool {
        (0..<Self.channelCount).contains { latched[4 * $0 + 3] & Self.fullBit == 0 }
    }

    private func computeOutput(channel: Int) -> ChannelOutput {
        guard (0..<Self.channelCount).contains(channel) else {
            return ChannelOutput(onTick: 0, offTick: 0, fullOn: false, fullOff: true, pulseWidth: Microseconds(0), duty: 0)
        }
        let base = 4 * channel
        let onTick = Int(latched[base]) | Int(latched[base + 1] & 0x0F) << 8
        let offTick = Int(latched[base + 2]) | Int(latched[base + 3] & 0x0F) << 8
        // Full OFF takes precedence over full ON (§7.3.3).
        let fullOff = latched[base + 3] & Self.fullBit != 0
        let fullOn = !fullOff && latched[base + 1] & Self.fullBit != 0

        // The pin goes high when the counter reaches ON and low when it
        // reaches OFF (§7.3.3). With ON > OFF the pulse spans
        // the period boundary, so the arithmetic is modulo 4096. ON == OFF
        // ("should never be programmed", §7.3.4) is taken as no pulse.
        let highTicks: Int
        if fullOff {
            highTicks = 0
        } else if fullOn {
            highTicks = Self.ticksPerPeriod
        } else {
            highTicks = (offTick - onTick + Self.ticksPerPeriod) % Self.ticksPerPeriod
        }

        var duty = Double(highTicks) / Double(Self.ticksPerPeriod)
        if file[Int(Address.mode2)] & Mode2.invert != 0 { duty = 1 - duty }
        // While SLEEP = 1 the oscillator is off (Table 5): no pulses at all.
        if isAsleep { duty = 0 }
        let period = currentFrequency().periodMicroseconds.value
        return ChannelOutput(
            onTick: onTick,
            offTick: offTick,
            fullOn: fullOn,
            fullOff: fullOff,
            pulseWidth: Microseconds(duty * period),
            duty: duty
        )
    }
}
