import Reactor
import Hardware
import Logging

/// Driver for the NXP PCA9685 16-channel, 12-bit PWM controller (product data
/// sheet Rev. 4, 16 April 2015; "§" refers to its sections), written only
/// against ``I2CBus``.
///
/// Usage: ``start()`` once (every output off, frequency programmed), then
/// ``stage(_:channel:)`` / ``setEnabled(_:channel:)`` any number of times and
/// ``flush()`` to put the changes on the bus. Staging does no I/O; a flush
/// writes only the channels whose register image changed, as one
/// auto-increment write per contiguous run of channels. Nothing is read back
/// in steady state: the driver keeps its own image of the LED registers.
///
/// Channels are LED0…LED15 (0…15). A channel number outside that range is
/// ignored by ``stage(_:channel:)`` and ``setEnabled(_:channel:)`` and reads
/// as `nil` from ``pulseWidth(channel:)``; it is never a trap, because channel
/// numbers come from board files.
///
/// Not thread-safe: one thread owns the driver (the servo thread). It is
/// `Sendable` so that it can be handed to that thread.
public final class PCA9685: @unchecked Sendable {
    /// The number of LED outputs (LED0…LED15).
    public static let channelCount = 16

    /// The address with every address pin low (§7.1.1): 0x40.
    public static let defaultAddress = I2CAddress(0x40)!

    /// How the chip is set up by ``start()``.
    public struct Configuration: Sendable {
        /// The chip's 7-bit I2C address.
        public var address: I2CAddress
        /// The requested PWM frequency; the chip produces the nearest one its
        /// prescaler allows (``PCA9685/actualFrequency``).
        public var frequency: Hertz
        /// The clock the chip runs from: the internal oscillator is nominally
        /// 25 MHz (§7.3.5); boards measured at 23…27 MHz are common, so a
        /// calibrated value makes servo pulses exact.
        public var oscillator: Hertz
        /// Totem-pole outputs (MODE2 OUTDRV, §7.3.2); `false` is open-drain.
        public var totemPole: Bool
        /// Invert the output logic (MODE2 INVRT, §7.3.2), for an external
        /// inverting driver. The pins then carry the complement of every
        /// programmed value, including "off".
        public var invert: Bool

        public init(
            address: I2CAddress = PCA9685.defaultAddress,
            frequency: Hertz = Hertz(50),
            oscillator: Hertz = Hertz(25_000_000),
            totemPole: Bool = true,
            invert: Bool = false
        ) {
            self.address = address
            self.frequency = frequency
            self.oscillator = oscillator
            self.totemPole = totemPole
            self.invert = invert
        }
    }

    /// What one channel should output.
    public enum Output: Sendable, Equatable {
        /// A pulse of this width at the start of every period (servos, ESCs).
        /// Converted with the actual, prescaled frequency; 0 or less is
        /// full off, a whole period or more is full on.
        case pulse(Microseconds)
        /// A fraction of each period (0…1): 0 (or less) is full off, 1 (or
        /// more) is full on.
        case duty(Double)
    }

    /// ``flush()`` was called before ``start()`` succeeded: the chip's
    /// frequency and register state are unknown, so nothing was written.
    public struct NotStartedError: Error, Sendable, Hashable, CustomStringConvertible {
        public var address: I2CAddress
        public var description: String { "PCA9685 at \(address) is not initialised" }
    }

    private let bus: any I2CBus
    private let configuration: Configuration
    private let logger: Logger
    private let sleep: @Sendable (Duration) -> Void
    private let prescale: UInt8
    private let frequency: Hertz

    /// What the owner asked for, per channel.
    private var staged: [Output?]
    private var enabled: [Bool]
    /// The LED registers the staged values and enables translate to.
    private var desired: [LEDRegisters]
    /// What the chip holds, as far as the driver knows. `nil`: unknown (not
    /// started, or a write to it failed part-way), so it is always rewritten.
    private var chip: [LEDRegisters?]
    private var started = false
    /// The steady-state write, reused so a flush allocates nothing once warm:
    /// the byte buffer moves into the message for the transfer and back.
    private var scratch: [UInt8] = []
    private var messages: [I2CMessage] = [.write([])]

    /// - Parameters:
    ///   - bus: the bus (or bus client) the chip is on.
    ///   - sleep: how ``start()`` waits for the oscillator; tests pass a
    ///     recording no-op.
    public init(
        bus: any I2CBus,
        configuration: Configuration,
        logger: Logger,
        sleep: @escaping @Sendable (Duration) -> Void = threadSleep
    ) {
        self.bus = bus
        self.configuration = configuration
        self.logger = logger
        self.sleep = sleep
        let prescale = Self.prescale(for: configuration.frequency, oscillator: configuration.oscillator)
        self.prescale = prescale
        self.frequency = Self.frequency(prescale: prescale, oscillator: configuration.oscillator)
        staged = [Output?](repeating: nil, count: Self.channelCount)
        enabled = [Bool](repeating: true, count: Self.channelCount)
        desired = [LEDRegisters](repeating: .fullOff, count: Self.channelCount)
        chip = [LEDRegisters?](repeating: nil, count: Self.channelCount)
    }

    // MARK: - Frequency

    /// The PRE_SCALE value for `frequency`: round(oscillator / (4096 ×
    /// frequency)) − 1 (§7.3.5, Equation 1), clamped to 3…255 (the chip
    /// forces a minimum of 3; the register is 8 bits). A frequency that is
    /// not a positive number gives 255, the slowest rate.
    public static func prescale(for frequency: Hertz, oscillator: Hertz) -> UInt8 {
        let raw = (oscillator.value / (Double(ticksPerPeriod) * frequency.value)).rounded() - 1
        guard frequency.value > 0, !raw.isNaN else { return 255 }
        return UInt8(min(max(raw, 3), 255))
    }

    /// The PWM frequency the chip actually produces with the configured
    /// oscillator and the prescaler chosen for the requested frequency.
    public var actualFrequency: Hertz { frequency }

    private static func frequency(prescale: UInt8, oscillator: Hertz) -> Hertz {
        Hertz(oscillator.value / (Double(ticksPerPeriod) * (Double(prescale) + 1)))
    }

    // MARK: - Start-up

    /// Initialises the chip: every output off first, then frequency, output
    /// mode and wake-up. Afterwards every LED output is full off; values
    /// staged before (or during a failed start) go out with the next
    /// ``flush()``. Safe to call again, e.g. after the chip was power-cycled.
    ///
    /// Does one read (MODE1, for RESTART); everything else is writes.
    public func start() throws {
        started = false
        for index in chip.indices { chip[index] = nil }
        let mode1Awake = Mode1.autoIncrement

        // First of all, stop whatever a previous process left running (a
        // motor must not keep spinning through our set-up). One byte to
        // ALL_LED_OFF_H works whatever the chip's Auto-Increment setting; its
        // full-OFF bit overrides every channel's counts (§7.3.3, §7.3.4).
        try write(Register.allLEDOffHigh, [Self.fullBit])

        // Sleep with Auto-Increment: PRE_SCALE can only be written while
        // SLEEP is set (§7.3.5). Since every channel is off, this is an
        // orderly shutdown and RESTART clears (§7.3.1.1). ALLCALL is left
        // clear so the chip does not also answer 0x70, which other devices
        // (LED backpacks) use.
        try write(Register.mode1, [(mode1Awake.union(.sleep)).rawValue])
        try write(Register.prescale, [prescale])

        // Outputs change on STOP (OCH = 0, §7.3.2): a multi-channel write is
        // applied as a whole, never half-way.
        var mode2: Mode2 = []
        if configuration.totemPole { mode2.insert(.totemPole) }
        if configuration.invert { mode2.insert(.invert) }
        try write(Register.mode2, [mode2.rawValue])

        // Now that Auto-Increment is on, load a known image into every
        // channel (counts 0, full OFF) so that later flushes can diff
        // against it instead of reading the chip.
        var ignored = 0
        try writeInPieces(Register.allLEDOnLow, LEDRegisters.fullOff.bytes, transactions: &ignored)

        // Wake. The oscillator needs up to 500 µs before PWM timing is
        // valid and before RESTART may be written (§7.3.1.1, Table 5 note).
        try write(Register.mode1, [mode1Awake.rawValue])
        sleep(.microseconds(500))
        let mode1 = Mode1(rawValue: try bus.writeRead([Register.mode1.rawValue], count: 1, at: configuration.address).first ?? 0)
        if mode1.contains(.restart) {
            // Writing 1 clears RESTART and restarts the PWM channels (§7.3.1.1).
            try write(Register.mode1, [mode1Awake.union(.restart).rawValue])
        }

        for index in chip.indices { chip[index] = .fullOff }
        started = true
        logger.debug("PCA9685 at \(configuration.address) started", metadata: [
            "prescale": "\(prescale)",
            "frequency": "\(frequency.value)",
            "mode1": "\(mode1.rawValue)",
        ])
    }

    // MARK: - Outputs

    /// Records what `channel` should output; no bus I/O until ``flush()``.
    /// Ignored for a channel outside 0…15.
    public func stage(_ output: Output, channel: Int) {
        guard Self.isChannel(channel) else { return }
        staged[channel] = output
        desired[channel] = image(channel)
    }

    /// A disabled channel is full off but keeps its staged value, which comes
    /// back when it is enabled again. Channels start enabled. Ignored for a
    /// channel outside 0…15; no bus I/O until ``flush()``.
    public func setEnabled(_ enabled: Bool, channel: Int) {
        guard Self.isChannel(channel) else { return }
        self.enabled[channel] = enabled
        desired[channel] = image(channel)
    }

    /// Writes every channel whose register image changed since the last
    /// successful write: one auto-increment write per contiguous run of
    /// changed channels, split on channel boundaries when the bus's
    /// ``I2CBus/maxWriteLength`` requires.
    ///
    /// On failure the failed channels (and any not yet attempted) stay
    /// pending, so the next flush retries them.
    ///
    /// - Returns: the number of bus transactions made (0 when nothing changed).
    /// - Throws: ``NotStartedError`` before ``start()`` succeeded, or the
    ///   bus's ``I2CError``.
    @discardableResult
    public func flush() throws -> Int {
        guard started else { throw NotStartedError(address: configuration.address) }
        var transactions = 0
        var first = 0
        while first < Self.channelCount {
            guard chip[first] != desired[first] else {
                first += 1
                continue
            }
            var end = first + 1
            while end < Self.channelCount && chip[end] != desired[end] { end += 1 }
            try writeRun(first..<end, transactions: &transactions)
            first = end
        }
        return transactions
    }

    /// Forgets what the chip holds, as if a write had failed: the next
    /// ``flush()`` writes every channel's image again. Rewriting the same
    /// registers changes no output; the servo path's warm-up uses it to run
    /// the write path once before it serves.
    public func forgetChipState() {
        guard started else { return }
        for index in chip.indices { chip[index] = nil }
    }

    /// Switches every output off at once (ALL_LED_OFF_H full OFF, §7.3.4),
    /// without sleeping the chip (sleep would cut a pulse short). Staged
    /// values and enables are kept: a later ``flush()`` writes them again.
    /// Works even before ``start()``.
    public func allOff() throws {
        try write(Register.allLEDOffHigh, [Self.fullBit])
        // The chip now holds each channel's counts with its full-OFF bit set.
        for index in chip.indices {
            chip[index]?.offHigh |= Self.fullBit
        }
    }

    /// The pulse width `channel` was last programmed with (what the chip is
    /// producing, as far as the driver knows): 0 for full off, a whole
    /// period for full on. `nil` before ``start()``, after a failed write to
    /// the channel, or for a channel outside 0…15. Ignores MODE2 INVRT.
    public func pulseWidth(channel: Int) -> Microseconds? {
        guard Self.isChannel(channel), let registers = chip[channel] else { return nil }
        return Microseconds(Double(registers.highTicks) * frequency.periodMicroseconds.value / Double(Self.ticksPerPeriod))
    }

    // MARK: - Private

    private static func isChannel(_ channel: Int) -> Bool {
        (0..<channelCount).contains(channel)
    }

    /// The registers for a channel's staged value and enable. Every output
    /// starts at tick 0 (LEDn_ON = 0), so a pulse is high from the start of
    /// the period to LEDn_OFF (§7.3.3).
    private func image(_ channel: Int) -> LEDRegisters {
        guard enabled[channel], let output = staged[channel] else { return .fullOff }
        let ticks: Double
        switch output {
        case .pulse(let width):
            ticks = width.value * frequency.value * Double(Self.ticksPerPeriod) / 1_000_000
        case .duty(let duty):
            ticks = duty * Double(Self.ticksPerPeriod)
        }
        // `!(ticks > 0)` also catches NaN.
        guard ticks > 0 else { return .fullOff }
        let rounded = ticks >= Double(Self.ticksPerPeriod) ? Self.ticksPerPeriod : Int(ticks.rounded())
        // A count of 0 would be ON == OFF, which must never be programmed
        // (§7.3.4): use full OFF. 4096 ticks is the whole period: full ON,
        // because counts alone cannot hold the pin high for a whole period.
        if rounded <= 0 { return .fullOff }
        if rounded >= Self.ticksPerPeriod { return .fullOn }
        return .pulse(ticks: rounded)
    }

    /// Writes channels `run` (all changed), as few messages as the bus allows.
    private func writeRun(_ run: Range<Int>, transactions: inout Int) throws {
        let registersPerChannel = 4
        // One pointer byte, then data (§7.2).
        let dataLimit = bus.maxWriteLength.map { $0 - 1 }
        if let dataLimit, dataLimit < registersPerChannel {
            // An adapter this limited cannot carry one channel per message:
            // write each channel in pieces. The chip applies each piece at its
            // STOP, so for one PWM period a channel may show a mix of old and
            // new counts; no real adapter is this short (SMBus carries 33).
            guard dataLimit >= 1 else {
                throw I2CError(.notSupported, address: configuration.address,
                               context: "writes of \(dataLimit + 1) bytes cannot carry a register address and data")
            }
            for channel in run {
                try writeChannelInPieces(channel, transactions: &transactions)
            }
            return
        }
        let channelsPerMessage = dataLimit.map { $0 / registersPerChannel } ?? run.count
        var start = run.lowerBound
        while start < run.upperBound {
            let end = min(start + channelsPerMessage, run.upperBound)
            var bytes = scratch
            scratch = []
            bytes.removeAll(keepingCapacity: true)
            bytes.reserveCapacity(1 + registersPerChannel * Self.channelCount)
            bytes.append(Register.ledOnLow(start)!.rawValue)
            for channel in start..<end { desired[channel].append(to: &bytes) }
            messages[0] = .write(bytes)
            bytes = []
            defer {
                // Take the buffer back; it is unique again once the message drops it.
                if case .write(let buffer) = messages[0] { scratch = buffer }
                messages[0] = .write([])
            }
            do {
                _ = try bus.transfer(messages, at: configuration.address)
            } catch {
                // The chip may have taken part of the message: unknown.
                for channel in start..<end { chip[channel] = nil }
                throw error
            }
            transactions += 1
            for channel in start..<end { chip[channel] = desired[channel] }
            start = end
        }
    }

    private func writeChannelInPieces(_ channel: Int, transactions: inout Int) throws {
        chip[channel] = nil
        try writeInPieces(Register.ledOnLow(channel)!, desired[channel].bytes, transactions: &transactions)
        chip[channel] = desired[channel]
    }

    /// Writes consecutive registers from `first` on (Auto-Increment), in as
    /// many messages as the bus's write limit needs.
    private func writeInPieces(_ first: Register, _ data: [UInt8], transactions: inout Int) throws {
        let dataLimit = max((bus.maxWriteLength ?? (data.count + 1)) - 1, 1)
        var offset = 0
        while offset < data.count {
            let end = min(offset + dataLimit, data.count)
            try bus.write([first.rawValue + UInt8(offset)] + data[offset..<end], to: configuration.address)
            transactions += 1
            offset = end
        }
    }

    private func write(_ register: Register, _ data: [UInt8]) throws {
        try bus.write([register.rawValue] + data, to: configuration.address)
    }
}
