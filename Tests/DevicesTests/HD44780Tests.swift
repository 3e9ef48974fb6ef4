import DeviceEmulators
import Devices
import Foundation
import Hardware
import Logging
import Testing

/// A clock that moves only when the driver sleeps; the emulated LCD adds
/// 90 µs of bus time per port byte on top, so its timing checks see what a
/// 100 kHz bus would give.
private final class TestClock: @unchecked Sendable {
    private let lock = NSLock()
    private var instant = ContinuousClock.now
    private var slept = Duration.zero
    var now: ContinuousClock.Instant { lock.withLock { instant } }
    var totalSleep: Duration { lock.withLock { slept } }
    func sleep(_ duration: Duration) {
        lock.withLock {
            instant = instant.advanced(by: duration)
            slept += duration
        }
    }
}

/// Passes transfers through, except that it can deliver only the first few
/// bytes of the next write and then fail, as a glitch mid-message would.
private final class CuttingBus: I2CBus, @unchecked Sendable {
    let inner: EmulatedI2CBus
    private let lock = NSLock()
    private var cut: Int?

    init(_ inner: EmulatedI2CBus) { self.inner = inner }

    var maxWriteLength: Int? { inner.maxWriteLength }

    func cutNextWrite(after count: Int) { lock.withLock { cut = count } }

    func transfer(_ messages: [I2CMessage], at address: I2CAddress) throws -> [[UInt8]] {
        if let count = lock.withLock({ () -> Int? in defer { cut = nil }; return cut }) {
            if case .write(let bytes)? = messages.first {
                try inner.transfer([.write(Array(bytes.prefix(count)))], at: address)
            }
            throw I2CError(.busError, address: address, context: "cut after \(count) bytes")
        }
        return try inner.transfer(messages, at: address)
    }
}

private let address = I2CAddress(0x27)!

private struct Rig {
    let bus: EmulatedI2CBus
    let cutter: CuttingBus
    let display: LCDBackpackEmulator
    let driver: HD44780
    let clock: TestClock

    init(
        columns: Int = 16, rows: Int = 2, pinMap: PCF8574PinMap = .common,
        maxWriteLength: Int? = nil, charactersPerTransaction: Int = 8
    ) {
        let clock = TestClock()
        bus = EmulatedI2CBus(maxWriteLength: maxWriteLength)
        cutter = CuttingBus(bus)
        display = LCDBackpackEmulator(
            columns: columns, rows: rows, pinMap: pinMap,
            timing: HD44780Emulator.Timing(now: { clock.now }, portWriteTime: HD44780Emulator.Timing.standardModeByteTime)
        )
        bus.attach(display, at: address)
        driver = HD44780(
            bus: cutter,
            backpack: PCF8574Backpack(address: address, pinMap: pinMap),
            geometry: LCDGeometry(columns: columns, rows: rows),
            charactersPerTransaction: charactersPerTransaction,
            logger: Logger(label: "HD44780Tests", factory: { _ in SwiftLogNoOpLogHandler() }),
            sleep: { clock.sleep($0) }
        )
        self.clock = clock
    }

    /// What the emulated glass shows.
    var screen: [String] { display.lcd.lines }
    var violations: [String] { display.lcd.violations.map(\.message) }

    /// Write messages since the last call (recording must be on).
    func writes() -> [[UInt8]] {
        bus.takeTranscript().flatMap { transaction in
            transaction.messages.compactMap { message -> [UInt8]? in
                if case .write(let bytes) = message { return bytes }
                return nil
            }
        }
    }
}

private func padded(_ text: String, _ columns: Int = 16) -> String {
    text + String(repeating: " ", count: max(columns - text.count, 0))
}

@Suite("HD44780 driver on an emulated backpack")
struct HD44780Tests {
    @Test("initialize brings the LCD up in 4-bit, 2-line mode, display on, backlight on, within the datasheet's waits")
    func initialize() throws {
        let rig = Rig()
        try rig.driver.initialize()
        #expect(rig.display.lcd.isInitialized)
        #expect(rig.display.lcd.isFourBitMode)
        #expect(rig.display.lcd.isTwoLineMode)
        #expect(rig.display.lcd.isDisplayOn)
        #expect(!rig.display.lcd.isCursorOn)
        #expect(rig.display.backlight)
        #expect(rig.screen == [padded(""), padded("")])
        #expect(rig.violations == [])
        #expect(rig.driver.isInitialized)
        #expect(rig.clock.totalSleep >= .milliseconds(50))
    }

    @Test("setLine shows the text padded with spaces; lines reports it")
    func setLineShowsText() throws {
        let rig = Rig()
        try rig.driver.initialize()
        rig.driver.setLine(0, text: "Hello")
        rig.driver.setLine(1, text: "world")
        #expect(rig.driver.lines == [padded("Hello"), padded("world")])
        #expect(rig.driver.hasPendingChanges)
        try rig.driver.flush()
        #expect(!rig.driver.hasPendingChanges)
        #expect(rig.screen == [padded("Hello"), padded("world")])
        rig.driver.setLine(0, text: "Hi")
        try rig.driver.flush()
        #expect(rig.screen == [padded("Hi"), padded("world")])
        #expect(rig.violations == [])
    }

    @Test("long text is cut at the width and writes nothing beyond the row")
    func longTextIsCut() throws {
        let rig = Rig()
        try rig.driver.initialize()
        rig.driver.setLine(0, text: "0123456789ABCDEFGHIJKLMNOP")
        try rig.driver.flush()
        #expect(rig.screen == [padded("0123456789ABCDEF"), padded("")])
        #expect(rig.driver.lines[0] == "0123456789ABCDEF")
        #expect(rig.display.lcd.ddram(at: 0x10) == 0x20)
        #expect(rig.display.lcd.dataWriteCount == 16)
    }

    @Test("only cells that differ are rewritten")
    func onlyChangedCells() throws {
        let rig = Rig()
        try rig.driver.initialize()
        rig.driver.setLine(0, text: "Hello World")
        try rig.driver.flush()
        let writesBefore = rig.display.lcd.dataWriteCount
        rig.bus.setRecording(true)

        rig.driver.setLine(0, text: "Hello World")
        #expect(!rig.driver.hasPendingChanges)
        try rig.driver.flush()
        #expect(rig.writes().isEmpty)

        rig.driver.setLine(0, text: "Hello Wxrld")
        try rig.driver.flush()
        // One transaction: set DDRAM address 0x07, then one character; four
        // port bytes each.
        #expect(rig.writes().map(\.count) == [8])
        #expect(rig.display.lcd.dataWriteCount == writesBefore + 1)
        #expect(rig.screen[0] == padded("Hello Wxrld"))

        // Appending right after the last write needs no address instruction.
        rig.driver.setLine(0, text: "Hello Wxrld!")
        try rig.driver.flush()
        #expect(rig.writes().map(\.count) == [8])
        #expect(rig.screen[0] == padded("Hello Wxrld!"))
        #expect(rig.violations == [])
    }

    @Test("flushStep writes at most the transactions asked for, each a few characters")
    func flushStepLimits() throws {
        let rig = Rig(charactersPerTransaction: 4)
        try rig.driver.initialize()
        rig.bus.setRecording(true)
        rig.driver.setLine(0, text: "ABCDEFGHIJKLMNOP")
        rig.driver.setLine(1, text: "abcdefghijklmnop")

        let first = try rig.driver.flushStep(maxTransactions: 1)
        #expect(first.transactions == 1)
        #expect(!first.done)
        #expect(rig.screen == [padded("ABCD"), padded("")])

        var total = first.transactions
        var steps = 1
        while true {
            let step = try rig.driver.flushStep(maxTransactions: 1)
            #expect(step.transactions <= 1)
            total += step.transactions
            steps += 1
            if step.done { break }
            #expect(steps < 100)
        }
        #expect(rig.screen == [padded("ABCDEFGHIJKLMNOP"), padded("abcdefghijklmnop")])
        // 32 characters at 4 per transaction.
        #expect(total == 8)
        let writes = rig.writes()
        #expect(writes.count == 8)
        // At most 4 characters plus one address instruction, 4 port bytes each.
        #expect(writes.allSatisfy { $0.count <= 20 })
        #expect(rig.violations == [])

        rig.driver.setLine(0, text: "")
        let all = try rig.driver.flushStep(maxTransactions: 10)
        #expect(all.done)
        #expect(all.transactions == 4)
    }

    @Test("20×4: every row shows; a full redraw walks DDRAM without address instructions")
    func twentyByFour() throws {
        let rig = Rig(columns: 20, rows: 4)
        try rig.driver.initialize()
        let instructions = rig.display.lcd.instructionCount
        // No spaces: every cell differs from the blank screen.
        let text = ["ABCDEFGHIJKLMNOPQRST", "abcdefghijklmnopqrst", "01234567890123456789", "!#$%&()*+,-./:;<=>?@"]
        for (row, line) in text.enumerated() {
            rig.driver.setLine(row, text: line)
        }
        try rig.driver.flush()
        #expect(rig.screen == text.map { padded($0, 20) })
        // Row 0 runs on into row 2 (0x14) and 0x27 into row 1 (0x40), row 1
        // into row 3 (0x54).
        #expect(rig.display.lcd.instructionCount == instructions)
        rig.driver.setLine(3, text: "changed")
        try rig.driver.flush()
        #expect(rig.screen[3] == padded("changed", 20))
        #expect(rig.screen[0] == padded(text[0], 20))
        #expect(rig.violations == [])
    }

    @Test("a backpack wired differently works through its pin map", arguments: [
        PCF8574PinMap(rs: 4, rw: 5, e: 6, backlight: 7, d4: 0, d5: 1, d6: 2, d7: 3),
        PCF8574PinMap(rs: 1, rw: 2, e: 0, backlight: 7, d4: 3, d5: 4, d6: 5, d7: 6),
    ])
    func otherPinMap(pinMap: PCF8574PinMap) throws {
        let rig = Rig(pinMap: pinMap)
        try rig.driver.initialize()
        rig.driver.setLine(0, text: "Pins!")
        rig.driver.setLine(1, text: "~ok~")
        try rig.driver.flush()
        #expect(rig.screen == [padded("Pins!"), padded("→ok→")], "~ is A00's → (0x7E), as on the original board")
        #expect(rig.display.backlight)
        #expect(rig.violations == [])
    }

    @Test("characters the ROM lacks show as a visible block")
    func fallbackVisible() throws {
        let rig = Rig()
        try rig.driver.initialize()
        rig.driver.setLine(0, text: "a€b 20°C ä")
        try rig.driver.flush()
        #expect(rig.display.lcd.codes(row: 0).prefix(10) == [0x61, 0xFF, 0x62, 0x20, 0x32, 0x30, 0xDF, 0x43, 0x20, 0xE1])
        #expect(rig.screen[0] == padded("a█b 20°C ä"))
        #expect(rig.driver.lines == rig.screen)
    }

    @Test("bytes of a frame that are not UTF-8 reach the glass as their ROM codes")
    func invalidUTF8() throws {
        let rig = Rig()
        try rig.driver.initialize()
        rig.driver.setLine(0, codes: CharacterROM.encode(utf8: [0x48, 0xFF, 0x32, 0xDF, 0x43, 0xA5]))
        try rig.driver.flush()
        #expect(rig.screen[0] == padded("H█2°C･"))
        #expect(rig.violations == [])
    }

    @Test("the driver's decoded lines match the emulated glass for every code")
    func decodingAgrees() throws {
        let rig = Rig()
        try rig.driver.initialize()
        for first in stride(from: 0, to: 256, by: 32) {
            rig.driver.setLine(0, codes: (first..<first + 16).map { UInt8($0) })
            rig.driver.setLine(1, codes: (first + 16..<first + 32).map { UInt8($0) })
            try rig.driver.flush()
            #expect(rig.driver.lines == rig.screen)
        }
        #expect(rig.violations == [])
    }

    @Test("a NACK during flush throws; the next flush repairs the screen")
    func nackDuringFlush() throws {
        let rig = Rig()
        try rig.driver.initialize()
        rig.driver.setLine(0, text: "first")
        try rig.driver.flush()
        rig.driver.setLine(0, text: "second")
        rig.driver.setLine(1, text: "line")
        rig.bus.injectFault(.noAcknowledge, at: address, count: 1)
        #expect(throws: I2CError.self) { try rig.driver.flush() }
        #expect(rig.driver.hasPendingChanges)
        try rig.driver.flush()
        #expect(rig.screen == [padded("second"), padded("line")])
        #expect(!rig.driver.hasPendingChanges)
        #expect(rig.violations == [])
    }

    @Test("a write cut between two nibbles is repaired by the next flush")
    func cutWrite() throws {
        let rig = Rig()
        try rig.driver.initialize()
        rig.driver.setLine(0, text: "abcdefgh")
        rig.driver.setLine(1, text: "ABCDEFGH")
        try rig.driver.flush()
        rig.driver.setLine(0, text: "stuvwxyz")
        // The set-address instruction and the high nibble of "s".
        rig.cutter.cutNextWrite(after: 6)
        #expect(throws: I2CError.self) { try rig.driver.flush() }
        try rig.driver.flush()
        #expect(rig.screen == [padded("stuvwxyz"), padded("ABCDEFGH")])
        // The only complaint is the half byte the glitch left behind, which
        // the re-synchronisation completed.
        #expect(rig.display.lcd.violations.map(\.kind).allSatisfy { $0 == .rsChangedBetweenNibbles })
        rig.display.lcd.clearViolations()
        rig.driver.setLine(1, text: "later")
        try rig.driver.flush()
        #expect(rig.screen == [padded("stuvwxyz"), padded("later")])
        #expect(rig.violations == [])
    }

    @Test("writes never exceed the adapter's maxWriteLength", arguments: [3, 8, 10, 33])
    func maxWriteLength(limit: Int) throws {
        let rig = Rig(maxWriteLength: limit)
        rig.bus.setRecording(true)
        try rig.driver.initialize()
        rig.driver.setLine(0, text: "Limited writes")
        rig.driver.setLine(1, text: "to \(limit) bytes")
        try rig.driver.flush()
        let writes = rig.writes()
        #expect(!writes.isEmpty)
        #expect(writes.allSatisfy { $0.count <= limit })
        #expect(rig.screen == [padded("Limited writes"), padded("to \(limit) bytes")])
        #expect(rig.violations == [])
    }

    @Test("the backlight follows the driver, with one port byte when nothing else changes")
    func backlight() throws {
        let rig = Rig()
        try rig.driver.initialize()
        rig.driver.setLine(0, text: "dark")
        try rig.driver.flush()
        rig.bus.setRecording(true)
        rig.driver.backlight = false
        #expect(rig.driver.hasPendingChanges)
        let step = try rig.driver.flushStep(maxTransactions: 4)
        #expect(step.transactions == 1)
        #expect(step.done)
        #expect(!rig.display.backlight)
        #expect(rig.writes() == [[0x00]])
        // Characters written later keep it off.
        rig.driver.setLine(1, text: "still dark")
        try rig.driver.flush()
        #expect(!rig.display.backlight)
        #expect(rig.screen == [padded("dark"), padded("still dark")])
        rig.driver.backlight = true
        try rig.driver.flush()
        #expect(rig.display.backlight)
        #expect(rig.violations == [])
    }

    @Test("clear blanks the screen: a full screen with the clear instruction, a little text with spaces")
    func clear() throws {
        let rig = Rig()
        try rig.driver.initialize()
        rig.driver.setLine(0, text: "full line of txt")
        rig.driver.setLine(1, text: "and another one!")
        try rig.driver.flush()
        rig.bus.setRecording(true)
        rig.driver.clear()
        #expect(rig.driver.lines == [padded(""), padded("")])
        try rig.driver.flush()
        #expect(rig.screen == [padded(""), padded("")])
        #expect(rig.writes().map(\.count) == [4])

        rig.driver.setLine(0, text: "Hi")
        try rig.driver.flush()
        _ = rig.writes()
        rig.driver.clear()
        try rig.driver.flush()
        #expect(rig.screen == [padded(""), padded("")])
        // Address 0x00, then two spaces.
        #expect(rig.writes().map(\.count) == [12])
        #expect(rig.violations == [])
    }

    @Test("flush before initialize is an error, not a write")
    func flushBeforeInitialize() throws {
        let rig = Rig()
        rig.bus.setRecording(true)
        rig.driver.setLine(0, text: "early")
        #expect(throws: HD44780.Failure.notInitialized) { try rig.driver.flush() }
        #expect(rig.writes().isEmpty)
    }

    @Test("after a power cycle, initialize and flush redraw everything")
    func powerCycle() throws {
        let rig = Rig()
        try rig.driver.initialize()
        rig.driver.setLine(0, text: "survives")
        try rig.driver.flush()
        rig.display.powerCycle()
        #expect(rig.screen == [padded(""), padded("")])
        rig.clock.sleep(.milliseconds(100))
        try rig.driver.initialize()
        try rig.driver.flush()
        #expect(rig.screen == [padded("survives"), padded("")])
        #expect(rig.violations == [])
    }

    @Test("a backpack that does not answer fails initialize; it works once it answers")
    func absentBackpack() throws {
        let rig = Rig()
        rig.bus.injectFault(.noAcknowledge, at: address)
        #expect(throws: I2CError.self) { try rig.driver.initialize() }
        #expect(!rig.driver.isInitialized)
        rig.bus.clearFault(at: address)
        rig.driver.setLine(1, text: "back")
        try rig.driver.initialize()
        try rig.driver.flush()
        #expect(rig.screen == [padded(""), padded("back")])
        #expect(rig.violations == [])
    }

    @Test("lines outside the display are ignored")
    func rowOutOfRange() throws {
        let rig = Rig()
        rig.driver.setLine(2, text: "nope")
        rig.driver.setLine(-1, text: "nope")
        #expect(rig.driver.lines == [padded(""), padded("")])
    }

    @Test("a geometry the controller cannot address is refused before any I/O")
    func invalidGeometry() throws {
        let rig = Rig(columns: 40, rows: 4)
        rig.bus.setRecording(true)
        #expect(throws: HD44780.Failure.self) { try rig.driver.initialize() }
        #expect(rig.writes().isEmpty)
    }

    @Test("row DDRAM offsets for the usual modules")
    func geometry() throws {
        #expect(LCDGeometry(columns: 16, rows: 2).rowOffsets == [0x00, 0x40])
        #expect(LCDGeometry(columns: 20, rows: 4).rowOffsets == [0x00, 0x40, 0x14, 0x54])
        #expect(LCDGeometry(columns: 16, rows: 4).rowOffsets == [0x00, 0x40, 0x10, 0x50])
        #expect(LCDGeometry(columns: 40, rows: 1).rowOffsets == [0x00])
        #expect(LCDGeometry(columns: 20, rows: 4).address(row: 2, column: 3) == 0x17)
        #expect(LCDGeometry(columns: 20, rows: 4).address(row: 4, column: 0) == nil)
        for geometry in [LCDGeometry(columns: 8, rows: 1), .lcd1602, .lcd2004, LCDGeometry(columns: 40, rows: 2)] {
            #expect(geometry.isSupported)
        }
        #expect(!LCDGeometry(columns: 24, rows: 4).isSupported)
        #expect(!LCDGeometry(columns: 0, rows: 2).isSupported)
    }

    @Test("a one-row module uses one-line mode")
    func oneRow() throws {
        let rig = Rig(columns: 40, rows: 1)
        try rig.driver.initialize()
        #expect(!rig.display.lcd.isTwoLineMode)
        rig.driver.setLine(0, text: "forty columns wide, one row, no problem!")
        try rig.driver.flush()
        #expect(rig.screen == ["forty columns wide, one row, no problem!"])
        #expect(rig.violations == [])
    }
}
