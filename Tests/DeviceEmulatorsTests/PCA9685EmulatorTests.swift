import DeviceEmulators
import Hardware
import Testing

// The emulator is the oracle the driver is tested against, so it is checked
// here on its own, with raw register writes over the bus, against facts of
// the NXP PCA9685 data sheet (Rev. 4, 16 April 2015; "§" = its sections).

private let chipAddress = I2CAddress(0x40)!

/// A bus with one emulated PCA9685 and raw register access.
private struct Rig {
    let bus = EmulatedI2CBus()
    let chip: PCA9685Emulator

    init(oscillator: Hertz = Hertz(25_000_000)) {
        chip = PCA9685Emulator(oscillator: oscillator)
        bus.attach(chip, at: chipAddress)
    }

    /// One write transaction: control register, then data.
    func write(_ register: UInt8, _ data: UInt8...) throws {
        try bus.write([register] + data, to: chipAddress)
    }

    func read(_ register: UInt8, count: Int = 1) throws -> [UInt8] {
        try bus.writeRead([register], count: count, at: chipAddress)
    }

    /// Awake with Auto-Increment (MODE1 = AI).
    func wakeWithAutoIncrement() throws {
        try write(0x00, 0x20)
    }

    /// LEDn registers for ON/OFF counts with optional full bits.
    func setChannel(_ channel: Int, on: Int, off: Int, fullOn: Bool = false, fullOff: Bool = false) throws {
        try bus.write([
            UInt8(0x06 + 4 * channel),
            UInt8(on & 0xFF), UInt8(on >> 8) | (fullOn ? 0x10 : 0),
            UInt8(off & 0xFF), UInt8(off >> 8) | (fullOff ? 0x10 : 0)
        ], to: chipAddress)
    }
}

private func period(_ chip: PCA9685Emulator) -> Double {
    chip.outputFrequency.periodMicroseconds.value
}

@Suite("PCA9685Emulator")
struct PCA9685EmulatorTests {
    @Test("power-on state: asleep, every output full off, 0x1E prescale (§7.3, Table 4)")
    func powerOnState() throws {
        let rig = Rig()
        #expect(rig.chip.isSleeping)
        #expect(try rig.read(0x00) == [0x11])
        #expect(try rig.read(0x01) == [0x04])
        #expect(try rig.read(0x02) == [0xE2])
        #expect(try rig.read(0x05) == [0xE0])
        #expect(try rig.read(0xFE) == [0x1E])
        for channel in 0..<16 {
            let output = rig.chip.output(channel: channel)
            #expect(output.fullOff)
            #expect(output.pulseWidth == Microseconds(0))
            #expect(try rig.read(UInt8(0x09 + 4 * channel)) == [0x10])
        }
        // 25 MHz / (4096 × 31) ≈ 196.9 Hz: the "200 Hz" default.
        #expect(abs(rig.chip.outputFrequency.value - 25_000_000 / (4096 * 31)) < 1e-9)
    }

    @Test("PRE_SCALE is written only while SLEEP is set (§7.3.5)")
    func prescaleLockedWhileAwake() throws {
        let rig = Rig()
        try rig.write(0x00, 0x00)  // wake
        try rig.write(0xFE, 121)
        #expect(try rig.read(0xFE) == [0x1E])

        try rig.write(0x00, 0x10)  // sleep
        try rig.write(0xFE, 121)
        #expect(try rig.read(0xFE) == [121])
        // Equation 1: 25 MHz / (4096 × 122) ≈ 50.03 Hz.
        #expect(abs(rig.chip.outputFrequency.value - 50.0281) < 0.001)
    }

    @Test("PRE_SCALE has a hardware minimum of 3 (§7.3.5)")
    func prescaleMinimum() throws {
        let rig = Rig()
        try rig.write(0xFE, 0)
        #expect(try rig.read(0xFE) == [3])
        #expect(abs(rig.chip.outputFrequency.value - 1525.88) < 0.01)
    }

    @Test("the frequency follows the configured oscillator")
    func oscillatorFrequency() throws {
        let rig = Rig(oscillator: Hertz(27_000_000))
        try rig.write(0xFE, 121)
        #expect(abs(rig.chip.outputFrequency.value - 27_000_000 / (4096 * 122)) < 1e-9)
    }

    @Test("without Auto-Increment every data byte goes to the same register")
    func noAutoIncrement() throws {
        let rig = Rig()
        try rig.write(0x00, 0x00)
        try rig.write(0x06, 0x11, 0x22, 0x33)
        #expect(rig.chip.register(0x06) == 0x33)
        #expect(rig.chip.register(0x07) == 0x00)
        #expect(rig.chip.register(0x08) == 0x00)
    }

    @Test("Auto-Increment carries one write across channel registers")
    func autoIncrementAcrossChannels() throws {
        let rig = Rig()
        try rig.write(0xFE, 121)
        try rig.wakeWithAutoIncrement()
        // LED3 and LED4 in one message: ON = 0, OFF = 307 and 410 ticks.
        try rig.bus.write([0x12, 0x00, 0x00, 0x33, 0x01, 0x00, 0x00, 0x9A, 0x01], to: chipAddress)
        let three = rig.chip.output(channel: 3)
        let four = rig.chip.output(channel: 4)
        #expect(three.offTick == 307)
        #expect(four.offTick == 410)
        #expect(abs(three.pulseWidth.value - 307 * period(rig.chip) / 4096) < 1e-9)
        #expect(abs(four.duty - 410.0 / 4096) < 1e-12)
        #expect(rig.chip.output(channel: 5).fullOff)
        #expect(rig.chip.output(channel: 2).fullOff)
    }

    @Test("Auto-Increment rolls over from LED15_OFF_H and from PRE_SCALE to MODE1 (§7.3, Table 4 remark)")
    func autoIncrementRollOver() throws {
        let rig = Rig()
        try rig.wakeWithAutoIncrement()
        // The byte after LED15_OFF_H lands in MODE1: sleep with AI.
        try rig.bus.write([0x45, 0x00, 0x30, 0x04], to: chipAddress)
        #expect(rig.chip.isSleeping)
        #expect(try rig.read(0x00) == [0x30])
        #expect(try rig.read(0x01) == [0x04])
        // PRE_SCALE then MODE1, in one write (asleep, so PRE_SCALE takes it).
        try rig.bus.write([0xFE, 0x65, 0x20], to: chipAddress)
        #expect(try rig.read(0xFE) == [0x65])
        #expect(!rig.chip.isSleeping)
        // Reads increment the same way.
        #expect(try rig.read(0xFE, count: 3) == [0x65, 0x20, 0x04])
    }

    @Test("data sheet §7.3.3 example 1: ON 0x199, OFF 0x4CC is 819 ticks high")
    func datasheetExampleOne() throws {
        let rig = Rig()
        try rig.wakeWithAutoIncrement()
        try rig.setChannel(0, on: 0x199, off: 0x4CC)
        let output = rig.chip.output(channel: 0)
        #expect(output.onTick == 409)
        #expect(output.offTick == 1228)
        #expect(abs(output.duty - 819.0 / 4096) < 1e-12)
    }

    @Test("data sheet §7.3.3 example 2: ON > OFF wraps around the period (90 %)")
    func datasheetExampleTwo() throws {
        let rig = Rig()
        try rig.wakeWithAutoIncrement()
        try rig.setChannel(4, on: 0xE65, off: 0xCCB)
        #expect(abs(rig.chip.output(channel: 4).duty - 3686.0 / 4096) < 1e-12)
    }

    @Test("ON == OFF produces no pulse (§7.3.4, Fig 9 example 4)")
    func equalCountsAreOff() throws {
        let rig = Rig()
        try rig.wakeWithAutoIncrement()
        try rig.setChannel(1, on: 1023, off: 1023)
        #expect(rig.chip.output(channel: 1).duty == 0)
    }

    @Test("full ON ignores the counts; full OFF takes precedence over full ON (§7.3.3)")
    func fullOnAndFullOff() throws {
        let rig = Rig()
        try rig.wakeWithAutoIncrement()
        try rig.setChannel(0, on: 1022, off: 10, fullOn: true)
        var output = rig.chip.output(channel: 0)
        #expect(output.fullOn)
        #expect(output.duty == 1)
        #expect(abs(output.pulseWidth.value - period(rig.chip)) < 1e-9)

        try rig.setChannel(0, on: 0, off: 2048, fullOn: true, fullOff: true)
        output = rig.chip.output(channel: 0)
        #expect(output.fullOff)
        #expect(!output.fullOn)
        #expect(output.duty == 0)
        #expect(output.pulseWidth == Microseconds(0))
    }

    @Test("reserved bits of LEDn_x_H and MODE2 read as 0 (Tables 6, 7)")
    func reservedBits() throws {
        let rig = Rig()
        try rig.wakeWithAutoIncrement()
        try rig.bus.write([0x06, 0xFF, 0xFF, 0xFF, 0xEF], to: chipAddress)
        #expect(try rig.read(0x06, count: 4) == [0xFF, 0x1F, 0xFF, 0x0F])
        try rig.write(0x01, 0xFF)
        #expect(try rig.read(0x01) == [0x1F])
    }

    @Test("ALL_LED registers load every channel and read back as zero (§7.3.4)")
    func allLEDRegisters() throws {
        let rig = Rig()
        try rig.wakeWithAutoIncrement()
        try rig.bus.write([0xFA, 0x00, 0x00, 0x33, 0x01], to: chipAddress)
        for channel in 0..<16 {
            let output = rig.chip.output(channel: channel)
            #expect(output.onTick == 0 && output.offTick == 0x133 && !output.fullOff)
        }
        #expect(try rig.read(0xFA, count: 4) == [0, 0, 0, 0])

        // One byte to ALL_LED_OFF_H stops everything (Fig 24), whatever AI is.
        try rig.write(0x00, 0x00)
        try rig.write(0xFD, 0x10)
        #expect(rig.chip.outputs.allSatisfy { $0.fullOff && $0.duty == 0 })
        // The whole LEDn_OFF_H byte is loaded: the count's low byte survives,
        // its high nibble is now 0.
        #expect(rig.chip.output(channel: 7).offTick == 0x033)
        #expect(rig.chip.register(0x06 + 4 * 7 + 3) == 0x10)
    }

    @Test("no pulses while SLEEP is set; the registers are kept (Table 5)")
    func sleepStopsOutputs() throws {
        let rig = Rig()
        try rig.wakeWithAutoIncrement()
        try rig.setChannel(2, on: 0, off: 300)
        #expect(rig.chip.output(channel: 2).duty > 0)
        try rig.write(0x00, 0x30)
        #expect(rig.chip.isSleeping)
        #expect(rig.chip.output(channel: 2).duty == 0)
        #expect(rig.chip.output(channel: 2).offTick == 300)
        try rig.write(0x00, 0x20)
        #expect(abs(rig.chip.output(channel: 2).duty - 300.0 / 4096) < 1e-12)
    }

    @Test("RESTART: set by sleeping with PWM running, cleared by writing 1 while awake (§7.3.1.1)")
    func restartSetAndCleared() throws {
        let rig = Rig()
        try rig.wakeWithAutoIncrement()
        try rig.setChannel(0, on: 0, off: 300)
        try rig.write(0x00, 0x30)
        #expect(try rig.read(0x00)[0] & 0x80 != 0)
        // Writing 1 while asleep does not clear it; waking does not either.
        try rig.write(0x00, 0xB0)
        #expect(try rig.read(0x00)[0] & 0x80 != 0)
        try rig.write(0x00, 0x20)
        #expect(try rig.read(0x00) == [0xA0])
        // Writing 0 has no effect; writing 1 clears it.
        try rig.write(0x00, 0x20)
        #expect(try rig.read(0x00) == [0xA0])
        try rig.write(0x00, 0xA0)
        #expect(try rig.read(0x00) == [0x20])
        #expect(abs(rig.chip.output(channel: 0).duty - 300.0 / 4096) < 1e-12)
    }

    @Test("RESTART stays clear after an orderly shutdown (§7.3.1.1)")
    func restartAfterOrderlyShutdown() throws {
        let rig = Rig()
        try rig.wakeWithAutoIncrement()
        try rig.setChannel(0, on: 0, off: 300)
        try rig.write(0xFD, 0x10)
        try rig.write(0x00, 0x30)
        #expect(try rig.read(0x00) == [0x30])
    }

    @Test("RESTART is cleared by a PWM register write and STOP when OCH = 0 (§7.3.1.1)")
    func restartClearedByPWMWrite() throws {
        let rig = Rig()
        try rig.wakeWithAutoIncrement()
        try rig.setChannel(0, on: 0, off: 300)
        try rig.write(0x00, 0x30)
        try rig.write(0x00, 0x20)
        #expect(try rig.read(0x00)[0] & 0x80 != 0)
        try rig.setChannel(5, on: 0, off: 100)
        #expect(try rig.read(0x00) == [0x20])
    }

    @Test("OCH = 0: outputs change on STOP; OCH = 1: on each byte's ACK (§7.3.2, Table 6)")
    func outputChangeTiming() throws {
        let rig = Rig()
        try rig.wakeWithAutoIncrement()
        let chip = rig.chip
        // Drive the device interface directly to look between ACK and STOP.
        chip.start()
        chip.receive([0x06, 0x00, 0x00, 0x00, 0x02])
        #expect(chip.output(channel: 0).fullOff)
        chip.stop()
        #expect(chip.output(channel: 0).offTick == 0x200)
        #expect(!chip.output(channel: 0).fullOff)

        try rig.write(0x01, 0x0C)  // OCH = 1, totem pole
        chip.start()
        chip.receive([0x0A, 0x00, 0x00, 0x00, 0x03])
        #expect(chip.output(channel: 1).offTick == 0x300)
        chip.stop()
        #expect(chip.output(channel: 1).offTick == 0x300)
    }

    @Test("INVRT: the pin carries the complement (§7.3.2, Table 6)")
    func invertedOutputs() throws {
        let rig = Rig()
        try rig.wakeWithAutoIncrement()
        try rig.write(0x01, 0x14)
        try rig.setChannel(0, on: 0, off: 1024)
        #expect(abs(rig.chip.output(channel: 0).duty - 0.75) < 1e-12)
        // Full OFF inverted holds the pin high.
        #expect(rig.chip.output(channel: 1).duty == 1)
    }

    @Test("EXTCLK is set only from sleep and is sticky (Table 5)")
    func externalClockSticky() throws {
        let rig = Rig()
        try rig.write(0x00, 0x00)
        try rig.write(0x00, 0x40)  // awake: ignored
        #expect(try rig.read(0x00)[0] & 0x40 == 0)
        try rig.write(0x00, 0x10)
        try rig.write(0x00, 0x50)  // asleep, with SLEEP: taken
        try rig.write(0x00, 0x00)
        #expect(try rig.read(0x00)[0] & 0x40 != 0)
    }

    @Test("a channel number outside 0…15 reads as an idle pin")
    func outOfRangeChannel() {
        let chip = PCA9685Emulator()
        #expect(chip.output(channel: 16).fullOff)
        #expect(chip.output(channel: -1).duty == 0)
        #expect(chip.outputs.count == 16)
    }
}
