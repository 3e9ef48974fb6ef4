import Reactor

/// A pin-level model of the Hitachi HD44780U LCD controller (datasheet
/// ADE-207-272(Z); figure and table numbers refer to it), written as a test
/// oracle: it shares no code with the driver in `Devices`.
///
/// Feed it the levels of RS, R/W, E and D4…D7 after every change
/// (``drive(rs:rw:e:data:)``); it latches on the falling edge of E, executes
/// the instruction set (Table 6) in 8-bit or 4-bit interface mode, keeps
/// DDRAM and renders what the glass shows as text (``lines``). Anything a
/// real controller would not accept, or would only accept by luck, is
/// recorded in ``violations``, and the model carries on as the chip would.
///
/// What "initialised" means: the chip came out of reset in 8-bit mode (the
/// internal reset circuit, "Initializing by Internal Reset Circuit"), but a
/// 4-bit driver must not rely on it: it must send the nibbles 0x3, 0x3, 0x3,
/// 0x2 as instructions (Figure 24), then a 4-bit function set. Until then
/// every other instruction and every data write is a violation. The same
/// sequence re-synchronises a running display whatever its state.
///
/// D0…D3 are not wired on a 4-bit backpack; in 8-bit mode the model reads
/// them as 0. Reads (R/W high) are not modelled: a strobe with R/W high is
/// recorded as a violation and otherwise ignored.
///
/// Timing is checked only when a ``Timing`` is given: the power-on wait
/// (15 ms at 4.5 V), the waits of Figure 24 (4.1 ms, 100 µs), and the
/// execution times of Table 6 (37 µs; 1.52 ms for clear display and return
/// home, fosc = 270 kHz) as "busy" periods in which no strobe may arrive.
///
/// Thread-safe: the bus thread drives the pins while status readers read.
public final class HD44780Emulator: @unchecked Sendable {
    /// Where the model's time comes from.
    public struct Timing: Sendable {
        /// The current instant (a real or a test clock).
        public var now: @Sendable () -> ContinuousClock.Instant
        /// Time added for every pin update on top of `now`: the bus time of a
        /// port byte, for a test clock that only advances when the driver
        /// sleeps. Zero with a real clock and a real (or slowed) bus.
        public var portWriteTime: Duration

        public init(now: @escaping @Sendable () -> ContinuousClock.Instant, portWriteTime: Duration = .zero) {
            self.now = now
            self.portWriteTime = portWriteTime
        }

        /// A PCF8574 byte on a 100 kHz bus: nine clocks (data and
        /// acknowledge) of 10 µs.
        public static let standardModeByteTime = Duration.microseconds(90)
    }

    /// Something the controller would not accept as sent.
    public struct Violation: Sendable, Hashable, CustomStringConvertible {
        public enum Kind: Sendable, Hashable, CaseIterable {
            /// A data write or an instruction other than a function set
            /// before initialisation by instruction completed.
            case beforeInitialization
            /// 4-bit mode selected without the 0x3, 0x3, 0x3, 0x2 nibbles.
            case incompleteSynchronization
            /// After the synchronisation nibbles, the first 4-bit
            /// instruction was not a function set.
            case expectedFunctionSet
            /// A function set changed lines or font after initialisation
            /// ("perform the function at the head of the program", Table 6).
            case functionSetChanged
            /// E was strobed with R/W high.
            case readCycle
            /// E fell in the same pin update that changed RS, R/W or data:
            /// no hold time (tAH, tH, Figure 25).
            case changedOnFallingEdge
            /// RS or R/W changed while E was high (tAS, tAH, Figure 25).
            case controlChangedWhileEnabled
            /// The two nibbles of one byte had different RS levels.
            case rsChangedBetweenNibbles
            /// A strobe before the previous instruction finished, or during
            /// the power-on time.
            case busy
            /// The waits between the synchronisation nibbles were too short.
            case initializationTiming
            /// A DDRAM address the current line mode does not have.
            case invalidAddress
        }

        public var kind: Kind
        public var message: String

        public init(kind: Kind, message: String) {
            self.kind = kind
            self.message = message
        }

        public var description: String { message }
    }

    /// The display's size.
    public let columns: Int
    public let rows: Int

    private let timing: Timing?
    private let lock = Lock()
    private var state: ChipState
    /// Pin levels after the last update; `nil` right after power-on.
    private var pins: Pins?
    /// E has been high since power-on (the expander's reset state), not
    /// raised by a driver; its fall is no strobe of anyone's making.
    private var enableFromPowerOn = false
    private var pinUpdates = 0
    private var recorded: [Violation] = []
    private var totalViolations = 0

    /// At most this many violations are kept (the count goes on).
    public static let violationLimit = 256

    private struct Pins: Equatable {
        var rs: Bool
        var rw: Bool
        var e: Bool
        var data: UInt8
    }

    /// Everything the controller holds; replaced wholesale at power-on.
    private struct ChipState {
        var eightBitInterface = true
        /// The first nibble of a 4-bit transfer, waiting for the second.
        var highNibble: (value: UInt8, rs: Bool)?
        var twoLines = false
        var largeFont = false
        var displayOn = false
        var cursorOn = false
        var blinkOn = false
        var increment = true
        var shiftOnWrite = false
        var addressCounter: UInt8 = 0
        var addressesCGRAM = false
        /// How far the display window is shifted left, in characters.
        var displayShift = 0
        /// Indexed by 7-bit DDRAM address; only valid addresses are used.
        var ddram = [UInt8](repeating: 0x20, count: 128)
        var cgram = [UInt8](repeating: 0, count: 64)
        var initialized = false
        var awaitingFunctionSet = false
        /// The last instruction nibbles (RS = 0) with their instants.
        var syncWindow: [(nibble: UInt8, at: ContinuousClock.Instant?)] = []
        var busyUntil: ContinuousClock.Instant?
        var busyReason = ""
        var strobes = 0
        var dataWrites = 0
        var instructions = 0
    }

    /// - Parameters:
    ///   - columns, rows: the glass (16×2, 20×4, …).
    ///   - timing: enables the timing checks; `nil` checks only order.
    public init(columns: Int, rows: Int, timing: Timing? = nil) {
        self.columns = max(columns, 0)
        self.rows = max(rows, 0)
        self.timing = timing
        state = ChipState()
        powerOnLocked()
    }

    /// Power cycle: the state the internal reset circuit leaves (8-bit
    /// interface, one line, display off, DDRAM blank, increment), pins
    /// unknown, violations and counters cleared.
    public func reset() {
        lock.withLock {
            recorded.removeAll()
            totalViolations = 0
            powerOnLocked()
        }
    }

    private func powerOnLocked() {
        state = ChipState()
        pins = nil
        enableFromPowerOn = false
        if let now = currentInstant() {
            state.busyUntil = now.advanced(by: .milliseconds(15))
            state.busyReason = "power-on (Figure 24: wait more than 15 ms after VCC rises to 4.5 V)"
        }
    }

    // MARK: Pins

    /// The levels on RS, R/W, E and D4…D7 after a change. `data` holds D7…D4
    /// in its low nibble (bit 3 = D7). The first update after power-on only
    /// sets the levels.
    public func drive(rs: Bool, rw: Bool, e: Bool, data: UInt8) {
        lock.withLock {
            pinUpdates += 1
            let new = Pins(rs: rs, rw: rw, e: e, data: data & 0x0F)
            guard let old = pins else {
                pins = new
                enableFromPowerOn = e
                return
            }
            pins = new
            switch (old.e, new.e) {
            case (true, true):
                if old.rs != new.rs || old.rw != new.rw {
                    record(.controlChangedWhileEnabled, "RS or R/W changed while E was high")
                }
            case (true, false):
                if enableFromPowerOn {
                    // The expander powers up with every pin high; the driver's
                    // first byte necessarily drops E. In 8-bit mode (as after
                    // power-on) a read cycle has no effect.
                    enableFromPowerOn = false
                    return
                }
                if old.rs != new.rs || old.rw != new.rw || old.data != new.data {
                    record(.changedOnFallingEdge, "E fell in the same update that changed RS, R/W or D4–D7 (no hold time, Figure 25)")
                }
                strobe(rs: old.rs, rw: old.rw, nibble: old.data)
            case (false, true):
                enableFromPowerOn = false
            case (false, false):
                break
            }
        }
    }

    private func strobe(rs: Bool, rw: Bool, nibble: UInt8) {
        let now = currentInstant()
        state.strobes += 1
        if rw {
            record(.readCycle, "E strobed with R/W high (a read; the backpack must only write)")
            return
        }
        if let now, let until = state.busyUntil, now < until {
            let early = microseconds(now.duration(to: until))
            record(.busy, "strobe \(early) µs too early, still busy with \(state.busyReason)")
        }
        if rs {
            state.syncWindow.removeAll()
        } else {
            state.syncWindow.append((nibble, now))
            if state.syncWindow.count > 4 { state.syncWindow.removeFirst() }
            if state.syncWindow.map(\.nibble) == [0x3, 0x3, 0x3, 0x2] {
                synchronized()
            }
        }
        if state.eightBitInterface {
            execute(nibble << 4, rs: rs, at: now)
        } else if let high = state.highNibble {
            state.highNibble = nil
            if high.rs != rs {
                record(.rsChangedBetweenNibbles, "RS was \(high.rs ? 1 : 0) for the high nibble and \(rs ? 1 : 0) for the low nibble")
            }
            execute(high.value << 4 | nibble, rs: rs, at: now)
        } else {
            state.highNibble = (nibble, rs)
        }
    }

    /// The nibbles 0x3, 0x3, 0x3, 0x2 arrived as instructions: whatever the
    /// state was, the last one lands in 8-bit mode and selects 4 bits.
    private func synchronized() {
        let window = state.syncWindow
        state.syncWindow.removeAll()
        state.initialized = false
        state.awaitingFunctionSet = true
        if let t0 = window[0].at, let t1 = window[1].at, let t2 = window[2].at {
            if t0.duration(to: t1) < .microseconds(4100) {
                record(.initializationTiming, "second 0x3 only \(microseconds(t0.duration(to: t1))) µs after the first (Figure 24: more than 4.1 ms)")
            }
            if t1.duration(to: t2) < .microseconds(100) {
                record(.initializationTiming, "third 0x3 only \(microseconds(t1.duration(to: t2))) µs after the second (Figure 24: more than 100 µs)")
            }
        }
    }

    // MARK: Instructions (Table 6)

    private func execute(_ byte: UInt8, rs: Bool, at now: ContinuousClock.Instant?) {
        if rs {
            writeData(byte)
            setBusy(now, .microseconds(37), "a data write")
            return
        }
        state.instructions += 1
        if byte & 0xE0 == 0x20 {
            functionSet(byte)
            setBusy(now, .microseconds(37), "function set")
            return
        }
        if state.awaitingFunctionSet {
            record(.expectedFunctionSet, "instruction \(hex(byte)) where the function set after synchronisation belongs")
        } else if !state.initialized {
            record(.beforeInitialization, "instruction \(hex(byte)) before initialisation by instruction")
        }
        switch byte {
        case 0x01:
            for address in 0..<128 { state.ddram[address] = 0x20 }
            state.addressCounter = 0
            state.addressesCGRAM = false
            state.increment = true
            state.displayShift = 0
            setBusy(now, .microseconds(1520), "clear display")
            return
        case 0x02...0x03:
            state.addressCounter = 0
            state.addressesCGRAM = false
            state.displayShift = 0
            setBusy(now, .microseconds(1520), "return home")
            return
        case 0x04...0x07:
            state.increment = byte & 0x02 != 0
            state.shiftOnWrite = byte & 0x01 != 0
        case 0x08...0x0F:
            state.displayOn = byte & 0x04 != 0
            state.cursorOn = byte & 0x02 != 0
            state.blinkOn = byte & 0x01 != 0
        case 0x10...0x1F:
            let right = byte & 0x04 != 0
            if byte & 0x08 != 0 {
                shiftDisplay(right ? -1 : 1)
            } else {
                moveAddressCounter(forward: right)
            }
        case 0x40...0x7F:
            state.addressesCGRAM = true
            state.addressCounter = byte & 0x3F
        default:
            let address = byte & 0x7F
            if !isValid(address) {
                record(.invalidAddress, "DDRAM address \(hex(address)) does not exist in \(state.twoLines ? "2-line" : "1-line") mode")
            }
            state.addressesCGRAM = false
            state.addressCounter = address
        }
        setBusy(now, .microseconds(37), "instruction \(hex(byte))")
    }

    private func functionSet(_ byte: UInt8) {
        let eightBits = byte & 0x10 != 0
        let twoLines = byte & 0x08 != 0
        let largeFont = byte & 0x04 != 0
        if state.eightBitInterface {
            if !eightBits {
                if !state.awaitingFunctionSet {
                    record(.incompleteSynchronization, "4-bit interface selected without the 0x3, 0x3, 0x3, 0x2 sequence (Figure 24)")
                }
                state.eightBitInterface = false
                state.highNibble = nil
            }
        } else if eightBits {
            // Leaving 4-bit mode: the first half of a re-synchronisation.
            state.eightBitInterface = true
            state.initialized = false
            state.awaitingFunctionSet = false
        } else if state.awaitingFunctionSet {
            state.awaitingFunctionSet = false
            state.initialized = true
        } else if state.initialized {
            if twoLines != state.twoLines || largeFont != state.largeFont {
                record(.functionSetChanged, "function set \(hex(byte)) changes the line or font mode after initialisation")
            }
        } else {
            record(.beforeInitialization, "function set \(hex(byte)) in 4-bit mode before synchronisation")
        }
        state.twoLines = twoLines
        state.largeFont = largeFont
    }

    private func writeData(_ byte: UInt8) {
        state.dataWrites += 1
        if !state.initialized {
            record(.beforeInitialization, "data \(hex(byte)) written before initialisation by instruction")
        }
        if state.addressesCGRAM {
            state.cgram[Int(state.addressCounter & 0x3F)] = byte & 0x1F
            state.addressCounter = (state.increment ? state.addressCounter &+ 1 : state.addressCounter &- 1) & 0x3F
            return
        }
        let address = state.addressCounter
        if isValid(address) {
            state.ddram[Int(address)] = byte
        } else {
            record(.invalidAddress, "data \(hex(byte)) written at DDRAM address \(hex(address)), which does not exist")
        }
        moveAddressCounter(forward: state.increment)
        if state.shiftOnWrite {
            shiftDisplay(state.increment ? 1 : -1)
        }
    }

    /// Address counter steps (datasheet "Address Counter (AC)", Figures 3–5):
    /// one line wraps 0x4F ↔ 0x00; two lines run 0x27 → 0x40 and
    /// 0x67 → 0x00, and back.
    private func moveAddressCounter(forward: Bool) {
        if state.addressesCGRAM {
            state.addressCounter = (forward ? state.addressCounter &+ 1 : state.addressCounter &- 1) & 0x3F
            return
        }
        let address = state.addressCounter
        if state.twoLines {
            switch (forward, address) {
            case (true, 0x27): state.addressCounter = 0x40
            case (true, 0x67): state.addressCounter = 0x00
            case (false, 0x40): state.addressCounter = 0x27
            case (false, 0x00): state.addressCounter = 0x67
            default: state.addressCounter = forward ? address &+ 1 : address &- 1
            }
        } else {
            switch (forward, address) {
            case (true, 0x4F): state.addressCounter = 0x00
            case (false, 0x00): state.addressCounter = 0x4F
            default: state.addressCounter = forward ? address &+ 1 : address &- 1
            }
        }
        state.addressCounter &= 0x7F
    }

    private func shiftDisplay(_ characters: Int) {
        let lineLength = state.twoLines ? 40 : 80
        state.displayShift = ((state.displayShift + characters) % lineLength + lineLength) % lineLength
    }

    private func isValid(_ address: UInt8) -> Bool {
        state.twoLines ? (address <= 0x27 || (0x40...0x67).contains(address)) : address <= 0x4F
    }

    private func setBusy(_ now: ContinuousClock.Instant?, _ duration: Duration, _ reason: String) {
        guard let now else { return }
        state.busyUntil = now.advanced(by: duration)
        state.busyReason = reason
    }

    // MARK: What the glass shows

    /// The visible text, one string of exactly `columns` characters per row.
    /// A display switched off shows blanks.
    public var lines: [String] {
        lock.withLock {
            (0..<rows).map { row in
                var text = ""
                for code in visibleCodes(row: row) {
                    text.append(Self.glyph(code))
                }
                return text
            }
        }
    }

    /// The character codes visible in `row` (spaces when the display is off).
    public func codes(row: Int) -> [UInt8] {
        lock.withLock { visibleCodes(row: row) }
    }

    private func visibleCodes(row: Int) -> [UInt8] {
        guard (0..<rows).contains(row) else { return [] }
        guard state.displayOn else { return [UInt8](repeating: 0x20, count: columns) }
        // Rows 2 and 3 of a 4-row module continue DDRAM lines 1 and 2.
        let start = (row / 2) * columns
        if state.twoLines {
            let lineBase = row % 2 == 0 ? 0x00 : 0x40
            return (0..<columns).map { column in
                state.ddram[lineBase + (start + column + state.displayShift) % 40]
            }
        }
        // One-line mode drives only the first line's commons.
        guard row % 2 == 0 else { return [UInt8](repeating: 0x20, count: columns) }
        return (0..<columns).map { column in
            state.ddram[(start + column + state.displayShift) % 80]
        }
    }

    /// The A00 ROM glyph of a code as text (Table 4), one `Character` each.
    static func glyph(_ code: UInt8) -> Character {
        switch code {
        case 0x00...0x0F:
            return "\u{FFFD}" // CGRAM: a user-defined pattern
        case 0x5C:
            return "¥"
        case 0x20...0x7D:
            return Character(Unicode.Scalar(code))
        case 0x7E:
            return "→"
        case 0x7F:
            return "←"
        case 0xA1...0xDD:
            return Character(Unicode.Scalar(0xFF61 + UInt32(code) - 0xA1)!)
        case 0xDE:
            return "゛"
        case 0xDF:
            return "°"
        case 0xE0...0xFF:
            return upperGlyphs[Int(code) - 0xE0]
        default:
            return " " // 0x10…0x1F, 0x80…0xA0: blank in A00
        }
    }

    private static let upperGlyphs: [Character] = [
        "α", "ä", "β", "ε", "μ", "σ", "ρ", "g", "√", "⁻", "j", "ˣ", "¢", "£", "ñ", "ö",
        "p", "q", "θ", "∞", "Ω", "ü", "Σ", "π", "x\u{0304}", "y", "千", "万", "円", "÷", " ", "█",
    ]

    // MARK: State for tests and status

    /// Whether initialisation by instruction has completed (and no later
    /// function set left 4-bit mode).
    public var isInitialized: Bool { lock.withLock { state.initialized } }
    public var isDisplayOn: Bool { lock.withLock { state.displayOn } }
    public var isCursorOn: Bool { lock.withLock { state.cursorOn } }
    public var isBlinkOn: Bool { lock.withLock { state.blinkOn } }
    /// Function set N: two display lines.
    public var isTwoLineMode: Bool { lock.withLock { state.twoLines } }
    /// Function set DL = 0 is in effect.
    public var isFourBitMode: Bool { lock.withLock { !state.eightBitInterface } }
    /// Entry mode I/D and S.
    public var entryMode: (increment: Bool, shift: Bool) { lock.withLock { (state.increment, state.shiftOnWrite) } }
    /// The address counter and whether it points into CGRAM.
    public var addressCounter: (address: UInt8, cgram: Bool) { lock.withLock { (state.addressCounter, state.addressesCGRAM) } }
    /// DDRAM contents at a 7-bit address.
    public func ddram(at address: UInt8) -> UInt8 { lock.withLock { state.ddram[Int(address & 0x7F)] } }
    /// Falling edges of E since power-on.
    public var strobeCount: Int { lock.withLock { state.strobes } }
    /// Bytes written to DDRAM or CGRAM since power-on.
    public var dataWriteCount: Int { lock.withLock { state.dataWrites } }
    /// Instructions executed since power-on.
    public var instructionCount: Int { lock.withLock { state.instructions } }
    /// Pin updates since creation.
    public var pinUpdateCount: Int { lock.withLock { pinUpdates } }

    /// Recorded violations, oldest first (at most ``violationLimit``).
    public var violations: [Violation] { lock.withLock { recorded } }
    /// Violations since power-on, including those not kept.
    public var violationCount: Int { lock.withLock { totalViolations } }

    /// Forgets the recorded violations.
    public func clearViolations() {
        lock.withLock {
            recorded.removeAll()
            totalViolations = 0
        }
    }

    // MARK: Helpers

    private func record(_ kind: Violation.Kind, _ message: String) {
        totalViolations += 1
        if recorded.count < Self.violationLimit {
            recorded.append(Violation(kind: kind, message: message))
        }
    }

    private func currentInstant() -> ContinuousClock.Instant? {
        guard let timing else { return nil }
        return timing.now().advanced(by: timing.portWriteTime * pinUpdates)
    }

    private func microseconds(_ duration: Duration) -> Int {
        let parts = duration.components
        return Int(parts.seconds) * 1_000_000 + Int(parts.attoseconds / 1_000_000_000_000)
    }

    private func hex(_ byte: UInt8) -> String {
        let digits = String(byte, radix: 16)
        return "0x" + (digits.count < 2 ? "0" + digits : digits)
    }
}
