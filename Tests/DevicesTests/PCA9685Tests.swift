import DeviceEmulators
import Devices
import Foundation
import Hardware
import Logging
import Testing

// The driver is driven against the emulated chip and judged by what the
// emulator says the LED pins produce (and, where the bytes matter, by the
// bus transcript).

private let chipAddress = I2CAddress(0x40)!

/// Durations the driver asked to sleep for, with the number of bus
/// transactions that had happened at that moment.
private final class SleepLog: @unchecked Sendable {
    private let lock = NSLock()
    private var entries: [(duration: Duration, afterTransactions: Int)] = []

    func append(_ duration: Duration, afterTransactions: Int) {
        lock.withLock { entries.append((duration, afterTransactions)) }
    }

    var all: [(duration: Duration, afterTransactions: Int)] { lock.withLock { entries } }
}

private struct Rig {
    let bus: EmulatedI2CBus
    /// What the driver talks to: `bus`, behind a gate that can fail transactions.
    let gate: GateBus
    let chip: PCA9685Emulator
    let driver: PCA9685
    let sleeps = SleepLog()

    init(
        frequency: Hertz = Hertz(50),
        oscillator: Hertz = Hertz(25_000_000),
        totemPole: Bool = true,
        invert: Bool = false,
        maxWriteLength: Int? = nil,
        chip: PCA9685Emulator? = nil
    ) {
        let bus = EmulatedI2CBus(maxWriteLength: maxWriteLength)
        let chip = chip ?? PCA9685Emulator(oscillator: oscillator)
        bus.attach(chip, at: chipAddress)
        let sleeps = self.sleeps
        let gate = GateBus(bus)
        self.bus = bus
        self.gate = gate
        self.chip = chip
        driver = PCA9685(
            bus: gate,
            configuration: PCA9685.Configuration(
                address: chipAddress,
                frequency: frequency,
                oscillator: oscillator,
                totemPole: totemPole,
                invert: invert
            ),
            logger: Logger(label: "PCA9685Tests", factory: { _ in SwiftLogNoOpLogHandler() }),
            sleep: { duration in sleeps.append(duration, afterTransactions: bus.statistics.transactions) }
        )
    }

    /// One PWM step (one tick of the 12-bit counter) in µs at the chip's frequency.
    var step: Double { chip.outputFrequency.periodMicroseconds.value / 4096 }

    var period: Double { chip.outputFrequency.periodMicroseconds.value }
}

/// The written LED channels of a transcript entry: (first channel, channel count).
private func ledWrite(_ transaction: EmulatedI2CBus.Transaction) -> (first: Int, count: Int)? {
    guard transaction.messages.count == 1, case .write(let bytes) = transaction.messages[0],
          let register = bytes.first, (0x06...0x45).contains(register) else { return nil }
    return ((Int(register) - 6) / 4, (bytes.count - 1) / 4)
}

@Suite("PCA9685 driver")
struct PCA9685Tests {
    // MARK: Start-up

    @Test("after start: awake, every output off, about 50 Hz")
    func startDefaults() throws {
        let rig = Rig()
        try rig.driver.start()
        #expect(!rig.chip.isSleeping)
        #expect(rig.chip.outputs.allSatisfy { $0.fullOff && $0.duty == 0 && $0.pulseWidth == Microseconds(0) })
        #expect(abs(rig.chip.outputFrequency.value - 50) < 0.1)
        #expect(rig.driver.actualFrequency == rig.chip.outputFrequency)
        // Totem pole, outputs change on STOP, not inverted (§7.3.2).
        #expect(rig.chip.register(0x01) == 0x04)
        for channel in 0..<16 {
            #expect(rig.driver.pulseWidth(channel: channel) == Microseconds(0))
        }
    }

    @Test("start programs the prescale nearest the requested period (§7.3.5)", arguments: [
        (50.0, 25_000_000.0), (60.0, 25_000_000.0), (200.0, 25_000_000.0), (330.0, 25_000_000.0),
        (1000.0, 25_000_000.0), (50.0, 26_600_000.0), (50.0, 23_800_000.0), (400.0, 27_000_000.0)
    ])
    func startFrequencies(frequency: Double, oscillator: Double) throws {
        let rig = Rig(frequency: Hertz(frequency), oscillator: Hertz(oscillator))
        try rig.driver.start()
        let produced = rig.chip.outputFrequency.value
        #expect(rig.driver.actualFrequency == rig.chip.outputFrequency)
        // Equation 1 rounds the period, not the frequency: the produced
        // period is within half a prescale step (4096 oscillator cycles) of
        // the requested one.
        let cycles = { (rate: Double) in oscillator / (4096 * rate) }
        #expect(abs(cycles(produced) - cycles(frequency)) <= 0.5)
        #expect(abs(cycles(produced) - cycles(produced).rounded()) < 1e-9)
        #expect(rig.chip.outputs.allSatisfy { $0.fullOff })
    }

    @Test("prescale: round(osc / (4096 × f)) − 1, clamped to 3…255 (§7.3.5)")
    func prescaleFormula() {
        let nominal = Hertz(25_000_000)
        #expect(PCA9685.prescale(for: Hertz(50), oscillator: nominal) == 121)
        #expect(PCA9685.prescale(for: Hertz(60), oscillator: nominal) == 101)
        #expect(PCA9685.prescale(for: Hertz(200), oscillator: nominal) == 30)
        #expect(PCA9685.prescale(for: Hertz(1526), oscillator: nominal) == 3)
        #expect(PCA9685.prescale(for: Hertz(24), oscillator: nominal) == 253)
        #expect(PCA9685.prescale(for: Hertz(10_000), oscillator: nominal) == 3)
        #expect(PCA9685.prescale(for: Hertz(1), oscillator: nominal) == 255)
        #expect(PCA9685.prescale(for: Hertz(0), oscillator: nominal) == 255)
        #expect(PCA9685.prescale(for: Hertz(.nan), oscillator: nominal) == 255)
    }

    @Test("start waits at least 500 µs after waking, before anything else (§7.3.1.1)")
    func startWaitsForOscillator() throws {
        let rig = Rig()
        rig.bus.setRecording(true)
        try rig.driver.start()
        let transcript = rig.bus.takeTranscript()
        let sleeps = rig.sleeps.all
        #expect(sleeps.count == 1)
        guard let sleep = sleeps.first else { return }
        #expect(sleep.duration >= .microseconds(500))
        // The transaction just before the wait cleared SLEEP in MODE1.
        let before = transcript[sleep.afterTransactions - 1]
        #expect(before.messages == [.write([0x00, 0x20])])
        // Nothing after the wait writes PRE_SCALE or sleeps the chip again.
        for transaction in transcript[sleep.afterTransactions...] {
            for case .write(let bytes) in transaction.messages {
                #expect(bytes.first != 0xFE)
                #expect(!(bytes.first == 0x00 && bytes.count > 1 && bytes[1] & 0x10 != 0))
            }
        }
    }

    @Test("start on a chip left running switches every output off first")
    func startStopsRunningOutputsFirst() throws {
        // A previous process left LED0…LED7 pulsing, awake, with
        // Auto-Increment off (so a multi-byte write would not reach OFF_H).
        let leftRunning = { () throws -> PCA9685Emulator in
            let chip = PCA9685Emulator()
            let bus = EmulatedI2CBus()
            bus.attach(chip, at: chipAddress)
            try bus.write([0x00, 0x20], to: chipAddress)
            var bytes: [UInt8] = [0x06]
            for _ in 0..<8 { bytes += [0x00, 0x00, 0x33, 0x01] }
            try bus.write(bytes, to: chipAddress)
            try bus.write([0x00, 0x00], to: chipAddress)
            return chip
        }
        let rig = Rig(chip: try leftRunning())
        #expect(rig.chip.outputs.filter { $0.duty > 0 }.count == 8)

        rig.bus.setRecording(true)
        try rig.driver.start()
        let transcript = rig.bus.takeTranscript()
        #expect(transcript.first?.messages == [.write([0xFD, 0x10])])
        let firstMode1 = transcript.firstIndex { $0.messages.first == .write([0x00, 0x30]) }
        #expect(firstMode1 == 1)
        #expect(rig.chip.outputs.allSatisfy { $0.fullOff })

        // The first transaction alone already stops everything.
        let replay = try leftRunning()
        let replayBus = EmulatedI2CBus()
        replayBus.attach(replay, at: chipAddress)
        try replayBus.transfer(transcript[0].messages, at: chipAddress)
        #expect(replay.outputs.allSatisfy { $0.duty == 0 })
    }

    @Test("start clears RESTART left by a chip put to sleep while running (§7.3.1.1)")
    func startClearsRestart() throws {
        let chip = PCA9685Emulator()
        let setup = EmulatedI2CBus()
        setup.attach(chip, at: chipAddress)
        try setup.write([0x00, 0x20], to: chipAddress)
        try setup.write([0x06, 0x00, 0x00, 0x33, 0x01], to: chipAddress)
        try setup.write([0x00, 0x30], to: chipAddress)
        #expect(chip.register(0x00) & 0x80 != 0)

        let rig = Rig(chip: chip)
        try rig.driver.start()
        #expect(rig.chip.register(0x00) & 0x80 == 0)
        #expect(!rig.chip.isSleeping)
        #expect(rig.chip.outputs.allSatisfy { $0.fullOff })
    }

    @Test("a chip that does not answer makes start throw; a later start succeeds")
    func startWithoutChip() throws {
        let rig = Rig()
        rig.bus.detach(at: chipAddress)
        #expect(throws: I2CError.self) { try rig.driver.start() }
        #expect(throws: PCA9685.NotStartedError.self) { try rig.driver.flush() }
        #expect(rig.driver.pulseWidth(channel: 0) == nil)

        rig.bus.attach(rig.chip, at: chipAddress)
        rig.driver.stage(.pulse(Microseconds(1500)), channel: 0)
        try rig.driver.start()
        #expect(rig.chip.output(channel: 0).fullOff)
        try rig.driver.flush()
        #expect(abs(rig.chip.output(channel: 0).pulseWidth.value - 1500) <= rig.step)
    }

    @Test("options: open drain and inverted outputs (MODE2, §7.3.2)")
    func outputModes() throws {
        let rig = Rig(totemPole: false, invert: true)
        try rig.driver.start()
        #expect(rig.chip.register(0x01) == 0x10)
        rig.driver.stage(.duty(0.25), channel: 3)
        try rig.driver.flush()
        #expect(rig.chip.output(channel: 3).duty == 0.75)
    }

    // MARK: Values

    @Test("a 1500 µs pulse is within one PWM step", arguments: [25_000_000.0, 23_500_000.0, 27_000_000.0])
    func servoPulse(oscillator: Double) throws {
        let rig = Rig(oscillator: Hertz(oscillator))
        try rig.driver.start()
        rig.driver.stage(.pulse(Microseconds(1500)), channel: 5)
        try rig.driver.flush()
        let output = rig.chip.output(channel: 5)
        #expect(abs(output.pulseWidth.value - 1500) <= rig.step)
        #expect(output.onTick == 0)
        #expect(rig.driver.pulseWidth(channel: 5).map { abs($0.value - output.pulseWidth.value) < 1e-6 } == true)
        for channel in 0..<16 where channel != 5 {
            #expect(rig.chip.output(channel: channel).fullOff)
        }
    }

    @Test("pulse widths across a servo's range, at several frequencies", arguments: [50.0, 60.0, 100.0, 333.0])
    func pulseRange(frequency: Double) throws {
        let rig = Rig(frequency: Hertz(frequency))
        try rig.driver.start()
        let widths = [500.0, 1000, 1234, 1500, 2000, 2500]
        for (channel, width) in widths.enumerated() {
            rig.driver.stage(.pulse(Microseconds(width)), channel: channel)
        }
        try rig.driver.flush()
        for (channel, width) in widths.enumerated() {
            #expect(abs(rig.chip.output(channel: channel).pulseWidth.value - width) <= rig.step / 2 + 1e-9)
        }
    }

    @Test("duty outputs: 0 is full off, 1 is full on, between within one step")
    func dutyOutputs() throws {
        let rig = Rig(frequency: Hertz(1000))
        try rig.driver.start()
        let duties = [0.0, 1.0, 0.25, 0.5, 1.0 / 3, 0.001, 0.999, -0.5, 2.0]
        for (channel, duty) in duties.enumerated() {
            rig.driver.stage(.duty(duty), channel: channel)
        }
        try rig.driver.flush()
        #expect(rig.chip.output(channel: 0).fullOff)
        #expect(rig.chip.output(channel: 1).fullOn)
        #expect(rig.chip.output(channel: 1).duty == 1)
        #expect(abs(rig.chip.output(channel: 1).pulseWidth.value - rig.period) < 1e-9)
        #expect(rig.chip.output(channel: 2).duty == 0.25)
        #expect(rig.chip.output(channel: 3).duty == 0.5)
        for channel in 4...6 {
            #expect(abs(rig.chip.output(channel: channel).duty - duties[channel]) <= 0.5 / 4096)
        }
        #expect(rig.chip.output(channel: 7).fullOff)
        #expect(rig.chip.output(channel: 8).fullOn)
    }

    @Test("pulses of 0, a whole period or more, and NaN")
    func pulseLimits() throws {
        let rig = Rig()
        try rig.driver.start()
        rig.driver.stage(.pulse(Microseconds(0)), channel: 0)
        rig.driver.stage(.pulse(Microseconds(rig.period)), channel: 1)
        rig.driver.stage(.pulse(Microseconds(30_000)), channel: 2)
        rig.driver.stage(.pulse(Microseconds(.nan)), channel: 3)
        rig.driver.stage(.pulse(Microseconds(-100)), channel: 4)
        rig.driver.stage(.pulse(Microseconds(1)), channel: 5)
        try rig.driver.flush()
        #expect(rig.chip.output(channel: 0).fullOff)
        #expect(rig.chip.output(channel: 1).fullOn)
        #expect(rig.chip.output(channel: 2).fullOn)
        #expect(rig.chip.output(channel: 3).fullOff)
        #expect(rig.chip.output(channel: 4).fullOff)
        // Less than half a step rounds to nothing rather than ON == OFF.
        #expect(rig.chip.output(channel: 5).fullOff)
    }

    @Test("disable: no pulse; enable again: the value is back")
    func disableKeepsValue() throws {
        let rig = Rig()
        try rig.driver.start()
        rig.driver.stage(.pulse(Microseconds(1500)), channel: 2)
        try rig.driver.flush()
        rig.driver.setEnabled(false, channel: 2)
        #expect(try rig.driver.flush() == 1)
        #expect(rig.chip.output(channel: 2).fullOff)
        #expect(rig.chip.output(channel: 2).pulseWidth == Microseconds(0))
        #expect(rig.driver.pulseWidth(channel: 2) == Microseconds(0))

        // A value staged while disabled is kept too.
        rig.driver.stage(.pulse(Microseconds(1800)), channel: 2)
        #expect(try rig.driver.flush() == 0)
        #expect(rig.chip.output(channel: 2).fullOff)

        rig.driver.setEnabled(true, channel: 2)
        #expect(try rig.driver.flush() == 1)
        #expect(abs(rig.chip.output(channel: 2).pulseWidth.value - 1800) <= rig.step)
    }

    @Test("a channel outside 0…15 is ignored")
    func outOfRangeChannels() throws {
        let rig = Rig()
        try rig.driver.start()
        rig.driver.stage(.pulse(Microseconds(1500)), channel: 16)
        rig.driver.stage(.duty(0.5), channel: -1)
        rig.driver.setEnabled(false, channel: 99)
        #expect(try rig.driver.flush() == 0)
        #expect(rig.driver.pulseWidth(channel: 16) == nil)
        #expect(rig.driver.pulseWidth(channel: -1) == nil)
        #expect(rig.chip.outputs.allSatisfy { $0.fullOff })
    }

    // MARK: Bus traffic

    @Test("8 channels changed at once go out as exactly one bus write")
    func eightChannelsOneWrite() throws {
        let rig = Rig()
        try rig.driver.start()
        rig.bus.setRecording(true)
        for channel in 4..<12 {
            rig.driver.stage(.pulse(Microseconds(1000 + 100 * Double(channel))), channel: channel)
        }
        #expect(rig.bus.takeTranscript().isEmpty)
        #expect(try rig.driver.flush() == 1)
        let transcript = rig.bus.takeTranscript()
        #expect(transcript.count == 1)
        #expect(transcript.first.flatMap(ledWrite).map { [$0.first, $0.count] } == [4, 8])
        for channel in 4..<12 {
            #expect(abs(rig.chip.output(channel: channel).pulseWidth.value - (1000 + 100 * Double(channel))) <= rig.step)
        }
    }

    @Test("non-contiguous changes: one write per contiguous run")
    func oneWritePerRun() throws {
        let rig = Rig()
        try rig.driver.start()
        rig.bus.setRecording(true)
        for channel in [0, 1, 5, 9, 10, 11, 15] {
            rig.driver.stage(.duty(0.1), channel: channel)
        }
        #expect(try rig.driver.flush() == 4)
        let runs = rig.bus.takeTranscript().compactMap(ledWrite).map { [$0.first, $0.count] }
        #expect(runs == [[0, 2], [5, 1], [9, 3], [15, 1]])
        #expect(rig.chip.outputs.filter { !$0.fullOff }.count == 7)
    }

    @Test("only changed channels are written; an unchanged flush is silent")
    func onlyChangesAreWritten() throws {
        let rig = Rig()
        try rig.driver.start()
        for channel in 0..<16 { rig.driver.stage(.pulse(Microseconds(1500)), channel: channel) }
        #expect(try rig.driver.flush() == 1)
        rig.bus.setRecording(true)
        #expect(try rig.driver.flush() == 0)
        // The same value again, and a value that rounds to the same count.
        rig.driver.stage(.pulse(Microseconds(1500)), channel: 3)
        rig.driver.stage(.pulse(Microseconds(1500.5)), channel: 4)
        #expect(try rig.driver.flush() == 0)
        rig.driver.stage(.pulse(Microseconds(1600)), channel: 7)
        #expect(try rig.driver.flush() == 1)
        #expect(rig.bus.takeTranscript().compactMap(ledWrite).map { [$0.first, $0.count] } == [[7, 1]])
    }

    @Test("runs are split to fit the bus's maxWriteLength", arguments: [
        (33, [[0, 8], [8, 8]]),
        (17, [[0, 4], [4, 4], [8, 4], [12, 4]]),
        (12, [[0, 2], [2, 2], [4, 2], [6, 2], [8, 2], [10, 2], [12, 2], [14, 2]])
    ])
    func maxWriteLengthSplitting(limit: Int, expected: [[Int]]) throws {
        let rig = Rig(maxWriteLength: limit)
        try rig.driver.start()
        rig.bus.setRecording(true)
        for channel in 0..<16 { rig.driver.stage(.pulse(Microseconds(600 + 100 * Double(channel))), channel: channel) }
        #expect(try rig.driver.flush() == expected.count)
        let transcript = rig.bus.takeTranscript()
        #expect(transcript.allSatisfy { $0.error == nil })
        #expect(transcript.compactMap(ledWrite).map { [$0.first, $0.count] } == expected)
        for channel in 0..<16 {
            #expect(abs(rig.chip.output(channel: channel).pulseWidth.value - (600 + 100 * Double(channel))) <= rig.step)
        }
    }

    @Test("an adapter too short for one channel gets the registers in pieces")
    func tinyWriteLimit() throws {
        let rig = Rig(maxWriteLength: 3)
        try rig.driver.start()
        rig.bus.setRecording(true)
        rig.driver.stage(.pulse(Microseconds(1500)), channel: 6)
        rig.driver.stage(.duty(0.5), channel: 7)
        #expect(try rig.driver.flush() == 4)
        #expect(rig.bus.takeTranscript().allSatisfy { $0.error == nil })
        #expect(abs(rig.chip.output(channel: 6).pulseWidth.value - 1500) <= rig.step)
        #expect(rig.chip.output(channel: 7).duty == 0.5)
    }

    @Test("a NACK during flush throws; the next flush retries and succeeds")
    func nackDuringFlushRetries() throws {
        let rig = Rig()
        try rig.driver.start()
        for channel in 0..<4 { rig.driver.stage(.pulse(Microseconds(1500)), channel: channel) }
        rig.bus.injectFault(.noAcknowledge, at: chipAddress, count: 1)
        do {
            try rig.driver.flush()
            Issue.record("flush succeeded through a NACK")
        } catch let error as I2CError {
            #expect(error.kind == .noAcknowledge)
        }
        #expect(rig.chip.outputs.allSatisfy { $0.fullOff })
        #expect(rig.driver.pulseWidth(channel: 0) == nil)

        #expect(try rig.driver.flush() == 1)
        for channel in 0..<4 {
            #expect(abs(rig.chip.output(channel: channel).pulseWidth.value - 1500) <= rig.step)
        }
        #expect(try rig.driver.flush() == 0)
    }

    @Test("a timeout in the second of two runs keeps the first and retries the second")
    func failureInLaterRun() throws {
        let rig = Rig(maxWriteLength: 33)
        try rig.driver.start()
        for channel in 0..<16 { rig.driver.stage(.duty(0.5), channel: channel) }
        // The first message (channels 0…7) goes through, then the chip times out.
        rig.gate.fail(after: 1)
        #expect(throws: I2CError.self) { try rig.driver.flush() }
        rig.gate.clear()
        #expect((0..<8).allSatisfy { rig.chip.output(channel: $0).duty == 0.5 })
        #expect((8..<16).allSatisfy { rig.chip.output(channel: $0).fullOff })

        rig.bus.setRecording(true)
        #expect(try rig.driver.flush() == 1)
        #expect(rig.bus.takeTranscript().compactMap(ledWrite).map { [$0.first, $0.count] } == [[8, 8]])
        #expect(rig.chip.outputs.allSatisfy { $0.duty == 0.5 })
    }

    @Test("after a failed write the channel is rewritten even if staged back to its old value")
    func failedWriteIsNotTrusted() throws {
        let rig = Rig()
        try rig.driver.start()
        rig.driver.stage(.pulse(Microseconds(1500)), channel: 0)
        try rig.driver.flush()
        rig.driver.stage(.pulse(Microseconds(1000)), channel: 0)
        rig.bus.injectFault(.timeout, at: chipAddress, count: 1)
        #expect(throws: I2CError.self) { try rig.driver.flush() }
        rig.driver.stage(.pulse(Microseconds(1500)), channel: 0)
        #expect(try rig.driver.flush() == 1)
        #expect(abs(rig.chip.output(channel: 0).pulseWidth.value - 1500) <= rig.step)
    }

    @Test("no reads in steady state")
    func noReadsInSteadyState() throws {
        let rig = Rig()
        try rig.driver.start()
        rig.bus.setRecording(true)
        for round in 0..<20 {
            for channel in 0..<16 {
                rig.driver.stage(.pulse(Microseconds(1000 + Double((round * 37 + channel * 53) % 1000))), channel: channel)
            }
            rig.driver.setEnabled(round % 3 != 0, channel: round % 16)
            try rig.driver.flush()
        }
        try rig.driver.allOff()
        try rig.driver.flush()
        let transcript = rig.bus.takeTranscript()
        #expect(!transcript.isEmpty)
        for transaction in transcript {
            #expect(transaction.messages.count == 1)
            #expect(transaction.messages.allSatisfy { if case .write = $0 { return true } else { return false } })
        }
    }

    @Test("allOff stops every output at once and keeps the staged values")
    func allOffKeepsValues() throws {
        let rig = Rig()
        try rig.driver.start()
        for channel in 0..<16 { rig.driver.stage(.duty(0.3), channel: channel) }
        try rig.driver.flush()
        rig.bus.setRecording(true)
        try rig.driver.allOff()
        #expect(rig.bus.takeTranscript().map(\.messages) == [[.write([0xFD, 0x10])]])
        #expect(!rig.chip.isSleeping)
        #expect(rig.chip.outputs.allSatisfy { $0.fullOff })
        #expect(rig.driver.pulseWidth(channel: 9) == Microseconds(0))

        #expect(try rig.driver.flush() == 1)
        #expect(rig.chip.outputs.allSatisfy { abs($0.duty - 0.3) <= 0.5 / 4096 })
    }

    @Test("flush before start throws and writes nothing")
    func flushBeforeStart() throws {
        let rig = Rig()
        rig.bus.setRecording(true)
        rig.driver.stage(.duty(0.5), channel: 0)
        #expect(throws: PCA9685.NotStartedError.self) { try rig.driver.flush() }
        #expect(rig.bus.takeTranscript().isEmpty)
    }

    @Test("start again after the chip was power-cycled; the next flush restores the values")
    func restartAfterPowerCycle() throws {
        let rig = Rig()
        try rig.driver.start()
        rig.driver.stage(.pulse(Microseconds(1200)), channel: 1)
        rig.driver.stage(.pulse(Microseconds(1700)), channel: 14)
        try rig.driver.flush()

        let fresh = PCA9685Emulator()
        rig.bus.attach(fresh, at: chipAddress)
        try rig.driver.start()
        #expect(fresh.outputs.allSatisfy { $0.fullOff })
        #expect(try rig.driver.flush() == 2)
        #expect(abs(fresh.output(channel: 1).pulseWidth.value - 1200) <= rig.step)
        #expect(abs(fresh.output(channel: 14).pulseWidth.value - 1700) <= rig.step)
    }
}

/// Forwards to the emulated bus, and can be told to let a number of
/// transactions through and time out on the ones after (the emulated bus's
/// own faults start with the next transaction).
private final class GateBus: I2CBus, @unchecked Sendable {
    private let inner: EmulatedI2CBus
    private let lock = NSLock()
    private var successesLeft: Int?

    init(_ inner: EmulatedI2CBus) { self.inner = inner }

    var maxWriteLength: Int? { inner.maxWriteLength }

    /// Lets `count` more transactions through, then fails every one.
    func fail(after count: Int) { lock.withLock { successesLeft = count } }

    func clear() { lock.withLock { successesLeft = nil } }

    @discardableResult
    func transfer(_ messages: [I2CMessage], at address: I2CAddress) throws -> [[UInt8]] {
        let pass = lock.withLock { () -> Bool in
            guard let left = successesLeft else { return true }
            successesLeft = max(left - 1, 0)
            return left > 0
        }
        guard pass else { throw I2CError(.timeout, address: address, context: "gate closed") }
        return try inner.transfer(messages, at: address)
    }
}
