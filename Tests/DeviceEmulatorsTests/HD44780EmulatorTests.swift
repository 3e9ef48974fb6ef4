import DeviceEmulators
import Foundation
import Hardware
import Testing

/// Port bytes worked out by hand from bit masks, independent of
/// `PCF8574PinMap`'s helpers and of the driver.
private struct Wires {
    var rs: UInt8
    var rw: UInt8
    var e: UInt8
    var backlight: UInt8
    /// Masks of D4, D5, D6, D7.
    var data: [UInt8]

    /// P0 RS, P1 RW, P2 E, P3 backlight, P4…P7 D4…D7.
    static let common = Wires(rs: 0x01, rw: 0x02, e: 0x04, backlight: 0x08, data: [0x10, 0x20, 0x40, 0x80])

    func port(_ nibble: UInt8, rs: Bool = false, rw: Bool = false, e: Bool = false, backlight: Bool = true) -> UInt8 {
        var byte: UInt8 = 0
        if rs { byte |= self.rs }
        if rw { byte |= self.rw }
        if e { byte |= self.e }
        if backlight { byte |= self.backlight }
        for bit in 0..<4 where nibble & (1 << bit) != 0 {
            byte |= data[bit]
        }
        return byte
    }

    func strobe(_ nibble: UInt8, rs: Bool = false) -> [UInt8] {
        [port(nibble, rs: rs, e: true), port(nibble, rs: rs)]
    }

    func instruction(_ value: UInt8) -> [UInt8] {
        strobe(value >> 4) + strobe(value & 0x0F)
    }

    func text(_ characters: String) -> [UInt8] {
        characters.utf8.flatMap { strobe($0 >> 4, rs: true) + strobe($0 & 0x0F, rs: true) }
    }

    var idle: [UInt8] { [port(0)] }

    /// Figure 24 for 4 bits, then display on with 2 lines.
    var initialization: [UInt8] {
        idle + strobe(0x3) + strobe(0x3) + strobe(0x3) + strobe(0x2)
            + instruction(0x28) + instruction(0x08) + instruction(0x01) + instruction(0x06) + instruction(0x0C)
    }
}

/// A clock that moves only when told to.
private final class TestClock: @unchecked Sendable {
    private let lock = NSLock()
    private var instant = ContinuousClock.now
    var now: ContinuousClock.Instant { lock.withLock { instant } }
    func advance(_ duration: Duration) { lock.withLock { instant = instant.advanced(by: duration) } }
}

private let address = I2CAddress(0x27)!

private func rig(columns: Int = 16, rows: Int = 2, pinMap: PCF8574PinMap = .common, timing: HD44780Emulator.Timing? = nil) -> (EmulatedI2CBus, LCDBackpackEmulator) {
    let bus = EmulatedI2CBus()
    let display = LCDBackpackEmulator(columns: columns, rows: rows, pinMap: pinMap, timing: timing)
    bus.attach(display, at: address)
    return (bus, display)
}

private func kinds(_ display: LCDBackpackEmulator) -> [HD44780Emulator.Violation.Kind] {
    display.lcd.violations.map(\.kind)
}

private func blank(_ columns: Int) -> String { String(repeating: " ", count: columns) }

private func padded(_ text: String, _ columns: Int = 16) -> String {
    text + String(repeating: " ", count: columns - text.count)
}

@Suite("HD44780Emulator")
struct HD44780EmulatorTests {
    fileprivate let wires = Wires.common

    @Test("powers on uninitialised in 8-bit mode, display off, backlight on")
    func powerOnState() {
        let (_, display) = rig()
        #expect(!display.lcd.isInitialized)
        #expect(!display.lcd.isFourBitMode)
        #expect(!display.lcd.isDisplayOn)
        #expect(display.backlight)
        #expect(display.lcd.lines == [blank(16), blank(16)])
        #expect(display.lcd.violations.isEmpty)
    }

    @Test("Figure 24 initialisation then text: shown, no violations")
    func initializationByInstruction() throws {
        let (bus, display) = rig()
        try bus.write(wires.initialization, to: address)
        #expect(display.lcd.isInitialized)
        #expect(display.lcd.isFourBitMode)
        #expect(display.lcd.isTwoLineMode)
        #expect(display.lcd.isDisplayOn)
        #expect(!display.lcd.isCursorOn)
        #expect(display.lcd.entryMode == (increment: true, shift: false))
        try bus.write(wires.text("Hello"), to: address)
        #expect(display.lcd.lines == [padded("Hello"), blank(16)])
        #expect(display.lcd.dataWriteCount == 5)
        #expect(display.lcd.violations.isEmpty)
    }

    @Test("nibbles latch on the falling edge of E, not the rising one")
    func latchesOnFallingEdge() throws {
        let (bus, display) = rig()
        try bus.write(wires.initialization, to: address)
        let strobes = display.lcd.strobeCount
        try bus.write([wires.port(0x4, rs: true, e: true)], to: address)
        #expect(display.lcd.strobeCount == strobes)
        try bus.write([wires.port(0x4, rs: true)], to: address)
        #expect(display.lcd.strobeCount == strobes + 1)
        #expect(display.lcd.dataWriteCount == 0)
        try bus.write(wires.strobe(0x1, rs: true), to: address)
        #expect(display.lcd.lines[0] == padded("A"))
    }

    @Test("data before initialisation is a violation")
    func dataBeforeInitialization() throws {
        let (bus, display) = rig()
        try bus.write(wires.idle + wires.text("A"), to: address)
        #expect(!display.lcd.isInitialized)
        #expect(kinds(display).contains(.beforeInitialization))
    }

    @Test("instructions before initialisation are violations")
    func instructionBeforeInitialization() throws {
        let (bus, display) = rig()
        try bus.write(wires.idle + wires.instruction(0x0C), to: address)
        #expect(kinds(display).contains(.beforeInitialization))
    }

    @Test("selecting 4 bits without the 0x3 0x3 0x3 sequence is a violation")
    func incompleteSynchronization() throws {
        let (bus, display) = rig()
        try bus.write(wires.idle + wires.strobe(0x2) + wires.instruction(0x28), to: address)
        #expect(display.lcd.isFourBitMode)
        #expect(!display.lcd.isInitialized)
        #expect(kinds(display).contains(.incompleteSynchronization))
    }

    @Test("after synchronisation the first instruction must be a function set")
    func expectsFunctionSet() throws {
        let (bus, display) = rig()
        try bus.write(wires.idle + wires.strobe(0x3) + wires.strobe(0x3) + wires.strobe(0x3) + wires.strobe(0x2) + wires.instruction(0x0C), to: address)
        #expect(kinds(display) == [.expectedFunctionSet])
        #expect(!display.lcd.isInitialized)
    }

    @Test("a strobe with RW high is a violation and writes nothing")
    func readCycle() throws {
        let (bus, display) = rig()
        try bus.write(wires.initialization, to: address)
        try bus.write([wires.port(0x4, rs: true, rw: true), wires.port(0x4, rs: true, rw: true, e: true), wires.port(0x4, rs: true, rw: true)], to: address)
        #expect(kinds(display) == [.readCycle])
        #expect(display.lcd.dataWriteCount == 0)
    }

    @Test("changing data in the same byte that drops E is a hold-time violation")
    func changesOnFallingEdge() throws {
        let (bus, display) = rig()
        try bus.write(wires.initialization, to: address)
        try bus.write([wires.port(0x4, rs: true, e: true), wires.port(0x5, rs: true)], to: address)
        #expect(kinds(display) == [.changedOnFallingEdge])
    }

    @Test("RS changing while E is high is a violation")
    func controlChangedWhileEnabled() throws {
        let (bus, display) = rig()
        try bus.write(wires.initialization, to: address)
        try bus.write([wires.port(0x4, e: true), wires.port(0x4, rs: true, e: true), wires.port(0x4, rs: true)], to: address)
        #expect(kinds(display) == [.controlChangedWhileEnabled])
    }

    @Test("16×2: rows at 0x00 and 0x40; the address counter runs from 0x27 to 0x40")
    func addressing16x2() throws {
        let (bus, display) = rig()
        try bus.write(wires.initialization, to: address)
        try bus.write(wires.instruction(0x80 | 0x40) + wires.text("second"), to: address)
        try bus.write(wires.instruction(0x80 | 0x0A) + wires.text("first!"), to: address)
        #expect(display.lcd.lines == ["          first!", padded("second")])
        try bus.write(wires.instruction(0x80 | 0x27) + wires.text("xY"), to: address)
        #expect(display.lcd.lines[1] == padded("Yecond"))
        #expect(display.lcd.addressCounter == (address: 0x41, cgram: false))
        #expect(display.lcd.violations.isEmpty)
    }

    @Test("20×4: rows at 0x00, 0x40, 0x14, 0x54; row 0 runs on into row 2")
    func addressing20x4() throws {
        let (bus, display) = rig(columns: 20, rows: 4)
        try bus.write(wires.initialization, to: address)
        try bus.write(wires.text("abcdefghijklmnopqrstUV"), to: address)
        try bus.write(wires.instruction(0x80 | 0x40) + wires.text("row one"), to: address)
        try bus.write(wires.instruction(0x80 | 0x54) + wires.text("row three"), to: address)
        #expect(display.lcd.lines == [
            "abcdefghijklmnopqrst",
            padded("row one", 20),
            padded("UV", 20),
            padded("row three", 20),
        ])
        #expect(display.lcd.violations.isEmpty)
    }

    @Test("a DDRAM address that 2-line mode lacks is a violation")
    func invalidAddress() throws {
        let (bus, display) = rig()
        try bus.write(wires.initialization + wires.instruction(0x80 | 0x30), to: address)
        #expect(kinds(display) == [.invalidAddress])
    }

    @Test("clear display blanks DDRAM and homes the address counter")
    func clearDisplay() throws {
        let (bus, display) = rig()
        try bus.write(wires.initialization + wires.text("junk") + wires.instruction(0x80 | 0x45) + wires.text("more"), to: address)
        try bus.write(wires.instruction(0x01), to: address)
        #expect(display.lcd.lines == [blank(16), blank(16)])
        #expect(display.lcd.addressCounter == (address: 0, cgram: false))
        try bus.write(wires.text("ok"), to: address)
        #expect(display.lcd.lines[0] == padded("ok"))
    }

    @Test("display off shows nothing; DDRAM is kept")
    func displayOff() throws {
        let (bus, display) = rig()
        try bus.write(wires.initialization + wires.text("kept"), to: address)
        try bus.write(wires.instruction(0x08), to: address)
        #expect(display.lcd.lines == [blank(16), blank(16)])
        try bus.write(wires.instruction(0x0C), to: address)
        #expect(display.lcd.lines[0] == padded("kept"))
    }

    @Test("a pin map other than the common one", arguments: [
        PCF8574PinMap(rs: 4, rw: 5, e: 6, backlight: 7, d4: 0, d5: 1, d6: 2, d7: 3),
        PCF8574PinMap(rs: 6, rw: 5, e: 4, backlight: 7, d4: 0, d5: 1, d6: 2, d7: 3),
    ])
    func otherPinMap(pinMap: PCF8574PinMap) throws {
        let wires = Wires(
            rs: 1 << UInt8(pinMap.rs), rw: 1 << UInt8(pinMap.rw), e: 1 << UInt8(pinMap.e), backlight: 1 << UInt8(pinMap.backlight),
            data: [1 << UInt8(pinMap.d4), 1 << UInt8(pinMap.d5), 1 << UInt8(pinMap.d6), 1 << UInt8(pinMap.d7)]
        )
        let (bus, display) = rig(pinMap: pinMap)
        try bus.write(wires.initialization + wires.text("Mapped"), to: address)
        #expect(display.lcd.lines == [padded("Mapped"), blank(16)])
        #expect(display.lcd.violations.isEmpty)
        #expect(display.backlight)
        try bus.write([wires.port(0, backlight: false)], to: address)
        #expect(!display.backlight)
    }

    @Test("the sync sequence re-aligns a display left between two nibbles")
    func resynchronization() throws {
        let (bus, display) = rig()
        try bus.write(wires.initialization + wires.text("before"), to: address)
        // Half a character: the display now waits for a low nibble.
        try bus.write(wires.strobe(0x4, rs: true), to: address)
        try bus.write(wires.strobe(0x3) + wires.strobe(0x3) + wires.strobe(0x3) + wires.strobe(0x2) + wires.instruction(0x28), to: address)
        #expect(display.lcd.isInitialized)
        try bus.write(wires.instruction(0x80 | 0x40) + wires.text("after"), to: address)
        #expect(display.lcd.lines[1] == padded("after"))
        #expect(display.lcd.lines[0].hasPrefix("before"))
        // The first 0x3 completed the stray half byte, as an instruction.
        #expect(kinds(display) == [.rsChangedBetweenNibbles])
    }

    @Test("timing: the waits of Figure 24 and the busy times are checked")
    func timingChecks() throws {
        let clock = TestClock()
        let timing = HD44780Emulator.Timing(now: { clock.now }, portWriteTime: HD44780Emulator.Timing.standardModeByteTime)
        do {
            let (bus, display) = rig(timing: timing)
            // No waits at all: too early after power-on, and 90 µs instead of 4.1 ms.
            try bus.write(wires.initialization, to: address)
            #expect(kinds(display).contains(.busy))
            #expect(kinds(display).contains(.initializationTiming))
        }
        do {
            let (bus, display) = rig(timing: timing)
            try bus.write(wires.idle, to: address)
            clock.advance(.milliseconds(50))
            try bus.write(wires.strobe(0x3), to: address)
            clock.advance(.milliseconds(5))
            try bus.write(wires.strobe(0x3), to: address)
            clock.advance(.microseconds(200))
            try bus.write(wires.strobe(0x3) + wires.strobe(0x2) + wires.instruction(0x28) + wires.instruction(0x08) + wires.instruction(0x01), to: address)
            clock.advance(.milliseconds(2))
            try bus.write(wires.instruction(0x06) + wires.instruction(0x0C) + wires.text("on time"), to: address)
            #expect(display.lcd.violations.isEmpty)
            #expect(display.lcd.lines[0] == padded("on time"))
            // Clear display takes 1.52 ms: a character right behind it is too early.
            try bus.write(wires.instruction(0x01) + wires.text("x"), to: address)
            #expect(!kinds(display).isEmpty)
            #expect(kinds(display).allSatisfy { $0 == .busy })
        }
    }

    @Test("reset is a power cycle: blank, uninitialised, violations gone")
    func reset() throws {
        let (bus, display) = rig()
        try bus.write(wires.idle + wires.text("A"), to: address)
        #expect(!display.lcd.violations.isEmpty)
        display.powerCycle()
        #expect(display.lcd.violations.isEmpty)
        #expect(!display.lcd.isInitialized)
        try bus.write(wires.initialization + wires.text("again"), to: address)
        #expect(display.lcd.lines[0] == padded("again"))
        #expect(display.lcd.violations.isEmpty)
    }

    @Test("lines have exactly `columns` characters for every code")
    func everyCodeIsOneCharacter() throws {
        let (bus, display) = rig(columns: 16, rows: 2)
        try bus.write(wires.initialization, to: address)
        for first in stride(from: 0, to: 256, by: 16) {
            var bytes = wires.instruction(0x80)
            for code in first..<first + 16 {
                let value = UInt8(code)
                bytes += wires.strobe(value >> 4, rs: true) + wires.strobe(value & 0x0F, rs: true)
            }
            try bus.write(bytes, to: address)
            #expect(display.lcd.lines[0].count == 16)
            #expect(display.lcd.codes(row: 0) == (first..<first + 16).map { UInt8($0) })
        }
        #expect(display.lcd.violations.isEmpty)
    }
}
