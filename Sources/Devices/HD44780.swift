import Reactor
import Hardware
import Logging

/// Driver for an HD44780-compatible character LCD in 4-bit mode (Hitachi
/// HD44780U datasheet, "ADE-207-272(Z)"; figure and table numbers refer to
/// it), written only against ``HD44780Interface``: a PCF8574 I2C backpack
/// (``PCF8574Interface``) or any other 4-bit wiring.
///
/// The driver keeps two images of the display: what the caller wants
/// (``setLine(_:codes:)``, ``clear()``: no I/O) and what it knows the LCD
/// shows. ``flush()`` and ``flushStep(maxTransactions:)`` write only the cells
/// that differ, a few characters per bus transaction, so another driver on
/// the same bus (the servo path) never waits behind a whole screen. Nothing
/// is read back: RW stays low, the busy flag is never polled, and every wait
/// is either a sleep or the bus time of the port bytes themselves.
///
/// Not thread-safe: one thread owns the driver (the LCD thread). It is
/// `Sendable` so that it can be handed to that thread.
public final class HD44780: @unchecked Sendable {
    /// Why the driver cannot do what was asked (bus failures are thrown as
    /// the bus's ``I2CError``).
    public enum Failure: Error, Sendable, Hashable, CustomStringConvertible {
        /// ``flush()`` before a successful ``initialize()``.
        case notInitialized
        /// The geometry or pin map cannot drive an HD44780.
        case invalidConfiguration(String)

        public var description: String {
            switch self {
            case .notInitialized: return "HD44780: not initialised"
            case .invalidConfiguration(let reason): return "HD44780: \(reason)"
            }
        }
    }

    public let geometry: LCDGeometry
    /// How the LCD's pins are driven.
    public let interface: any HD44780Interface
    /// The most characters one bus transaction carries.
    public let charactersPerTransaction: Int

    private let sleep: @Sendable (Duration) -> Void
    private let logger: Logger

    private enum State {
        /// The interface mode and the screen are unknown.
        case uninitialized
        case ready
        /// A transaction failed: it may have been cut between the two nibbles
        /// of a byte, so the 4-bit interface must be synchronised again.
        case needsResync
    }

    private var state = State.uninitialized
    /// The codes the caller wants, row-major.
    private var wanted: [UInt8]
    /// The codes the LCD is known to show, row-major; `nil` = unknown.
    private var shown: [UInt8?]
    /// Where the LCD's address counter points, when known.
    private var cursor: UInt8?
    private var wantedBacklight = true
    private var shownBacklight: Bool?
    /// Each cell's DDRAM address.
    private let cellAddresses: [UInt8]
    /// Cell indices in DDRAM address order, the order in which the address
    /// counter walks them: on a 20×4, row 0 runs on into row 2.
    private let writeOrder: [Int]

    // Instructions (Table 6).
    private static let clearDisplay: UInt8 = 0x01
    private static let entryModeIncrement: UInt8 = 0x06 // I/D = 1, S = 0
    private static let displayOff: UInt8 = 0x08
    private static let displayOn: UInt8 = 0x0C // D = 1, cursor and blink off
    private static let setDDRAMAddress: UInt8 = 0x80

    // Waits, each above the datasheet figure with margin for a slow
    // oscillator (Table 6 times are for fosc = 270 kHz and scale with it).
    /// Figure 24: more than 40 ms after VCC rises to 2.7 V (15 ms at 4.5 V).
    static let powerOnWait = Duration.milliseconds(50)
    /// Figure 24: more than 4.1 ms after the first function set.
    static let firstSyncWait = Duration.milliseconds(5)
    /// Figure 24: more than 100 µs after the second function set.
    static let secondSyncWait = Duration.microseconds(200)
    /// Table 6: clear display takes 1.52 ms.
    static let clearWait = Duration.milliseconds(3)

    /// - Parameters:
    ///   - interface: how the LCD's pins are driven.
    ///   - geometry: the module's size; checked by ``initialize()``.
    ///   - charactersPerTransaction: the most characters per bus transaction
    ///     (at least 1); bounds how long the bus is held.
    ///   - logger: for diagnostics.
    ///   - sleep: blocks the calling thread; replaced by tests.
    public init(
        interface: any HD44780Interface,
        geometry: LCDGeometry,
        charactersPerTransaction: Int = 8,
        logger: Logger,
        sleep: @escaping @Sendable (Duration) -> Void = threadSleep
    ) {
        self.interface = interface
        self.geometry = geometry
        self.charactersPerTransaction = max(charactersPerTransaction, 1)
        self.logger = logger
        self.sleep = sleep
        let cells = geometry.cellCount
        wanted = [UInt8](repeating: CharacterROM.space, count: cells)
        shown = [UInt8?](repeating: nil, count: cells)
        var addresses: [UInt8] = []
        addresses.reserveCapacity(cells)
        for row in 0..<max(geometry.rows, 0) {
            for column in 0..<max(geometry.columns, 0) {
                addresses.append(geometry.address(row: row, column: column) ?? 0)
            }
        }
        cellAddresses = addresses
        writeOrder = addresses.indices.sorted { addresses[$0] < addresses[$1] }
    }

    /// The common wiring: a PCF8574 backpack on `bus`.
    public convenience init(
        bus: any I2CBus,
        backpack: PCF8574Backpack,
        geometry: LCDGeometry,
        charactersPerTransaction: Int = 8,
        logger: Logger,
        sleep: @escaping @Sendable (Duration) -> Void = threadSleep
    ) {
        self.init(interface: PCF8574Interface(bus: bus, backpack: backpack), geometry: geometry,
                  charactersPerTransaction: charactersPerTransaction, logger: logger, sleep: sleep)
    }


    // MARK: Setup

    /// Whether ``initialize()`` has succeeded (a later bus error does not
    /// undo it: the next flush re-synchronises by itself).
    public var isInitialized: Bool { state != .uninitialized }

    /// Initialises the LCD by instruction for 4-bit operation (Figure 24),
    /// switches the backlight on, clears the display and turns it on. The
    /// wanted image is kept: the next flush draws it.
    ///
    /// Works whatever state the LCD is in (power-on, 4-bit, or half way
    /// through a byte), which is the point of initialisation by instruction.
    /// Takes about 60 ms, almost all of it sleeping with the bus free.
    public func initialize() throws {
        do {
            try geometry.validate()
            try interface.validate()
        } catch {
            throw Failure.invalidConfiguration("\(error)")
        }
        state = .uninitialized
        shown = [UInt8?](repeating: nil, count: shown.count)
        cursor = nil
        wantedBacklight = true
        shownBacklight = nil

        // At power-on the expander drives every pin high (NXP PCF8574 §8.1),
        // E and RW included. Drop them first, which also finds out whether
        // the backpack answers, then give the LCD its power-on time.
        var idle: [UInt8] = []
        interface.appendIdle(backlight: true, to: &idle)
        try transmit(idle)
        sleep(Self.powerOnWait)
        // Figure 24 goes on with display off and clear before entry mode.
        try synchronize(then: [Self.displayOff, Self.clearDisplay])
        sleep(Self.clearWait)
        var bytes: [UInt8] = []
        appendInstruction(Self.entryModeIncrement, to: &bytes)
        appendInstruction(Self.displayOn, to: &bytes)
        try transmit(bytes)

        // Clear display: DDRAM all spaces, address counter 0 (Table 6).
        shown = [UInt8?](repeating: CharacterROM.space, count: shown.count)
        cursor = 0
        shownBacklight = true
        state = .ready
        logger.debug("HD44780 \(geometry) on \(interface) initialised")
    }

    /// The three function sets with 8-bit data, then 4-bit, then the real
    /// 4-bit function set (Figure 24) and `instructions`, as three
    /// transactions.
    ///
    /// From 4-bit mode the first two 0x3 nibbles form the byte 0x33, itself
    /// a function set to 8 bits; from half way through a byte the first 0x3
    /// completes it, and 0x3 0x3 then switch to 8 bits. Either way the 0x2
    /// arrives in 8-bit mode and selects 4 bits: the sequence realigns the
    /// nibbles from any state without touching DDRAM.
    @discardableResult
    private func synchronize(then instructions: [UInt8]) throws -> Int {
        var transactions = 0
        transactions += try transmit(strobeBytes(0x3, rs: false))
        sleep(Self.firstSyncWait)
        transactions += try transmit(strobeBytes(0x3, rs: false))
        sleep(Self.secondSyncWait)
        // From here the busy flag could be read (Figure 24): each later
        // instruction only needs its 37 µs, which the port bytes take.
        var bytes = strobeBytes(0x3, rs: false)
        bytes += strobeBytes(0x2, rs: false)
        appendInstruction(functionSet, to: &bytes)
        for instruction in instructions {
            appendInstruction(instruction, to: &bytes)
        }
        transactions += try transmit(bytes)
        return transactions
    }

    /// Function set: 4-bit interface, one or two lines, 5×8 dots.
    private var functionSet: UInt8 {
        0x20 | (geometry.usesTwoLineMode ? 0x08 : 0x00)
    }

    // MARK: The wanted image (no I/O)

    /// Replaces row `row` with `text`, encoded for the character ROM
    /// (``CharacterROM``). See ``setLine(_:codes:)``.
    public func setLine(_ row: Int, text: String) {
        setLine(row, codes: CharacterROM.encode(text))
    }

    /// Replaces row `row` with character codes: shown from column 0, cut at
    /// the width, the rest of the row blanked. A row outside the display is
    /// ignored (rows come from frames; the caller reports the error).
    public func setLine(_ row: Int, codes: [UInt8]) {
        guard (0..<geometry.rows).contains(row) else {
            logger.debug("HD44780: ignoring line \(row) of a \(geometry) display")
            return
        }
        let start = row * geometry.columns
        for column in 0..<geometry.columns {
            wanted[start + column] = column < codes.count ? codes[column] : CharacterROM.space
        }
    }

    /// Blanks the whole wanted image. The flush uses the clear-display
    /// instruction when that is cheaper than writing spaces (more than one
    /// transaction's worth of non-blank cells); the cursor is never shown, so
    /// where the address counter ends up does not matter.
    public func clear() {
        wanted = [UInt8](repeating: CharacterROM.space, count: wanted.count)
    }

    /// The wanted image as text, one string of `columns` characters per row.
    public var lines: [String] {
        (0..<max(geometry.rows, 0)).map { row in
            let start = row * geometry.columns
            return CharacterROM.decode(Array(wanted[start..<start + geometry.columns]))
        }
    }

    /// The backlight as wanted; written by the next flush.
    public var backlight: Bool {
        get { wantedBacklight }
        set { wantedBacklight = newValue }
    }

    /// Whether a flush has anything to write.
    public var hasPendingChanges: Bool {
        if state != .ready || shownBacklight != wantedBacklight { return true }
        for index in wanted.indices where shown[index] != wanted[index] {
            return true
        }
        return false
    }

    // MARK: Flushing

    /// Writes everything pending.
    public func flush() throws {
        while try !flushStep(maxTransactions: .max).done {}
    }

    /// Writes at most `maxTransactions` bus transactions' worth of pending
    /// changes (at least one), so a caller can let others use the bus in
    /// between.
    ///
    /// After a failed transaction the next step first re-synchronises the
    /// 4-bit interface (three transactions, about 5 ms, not split across
    /// steps because of the waits between them), so a step can exceed
    /// `maxTransactions` by that much.
    ///
    /// On a bus error the cells of the failed transaction count as unknown
    /// (they are rewritten later) and the error is rethrown. The rest of
    /// the screen is assumed intact; when the display may have lost power
    /// (it stopped answering), call ``initialize()`` instead, which redraws
    /// everything.
    ///
    /// - Returns: the transactions made, and whether nothing is left pending.
    public func flushStep(maxTransactions: Int) throws -> (transactions: Int, done: Bool) {
        guard state != .uninitialized else { throw Failure.notInitialized }
        let limit = max(maxTransactions, 1)
        var transactions = 0
        if state == .needsResync {
            cursor = nil
            shownBacklight = nil
            // A cut byte may have been completed by a sync nibble into any
            // instruction: restore the display and entry modes too.
            transactions += try synchronize(then: [Self.displayOn, Self.entryModeIncrement])
            state = .ready
            shownBacklight = wantedBacklight
            if transactions >= limit { return (transactions, !hasPendingChanges) }
        }
        if transactions < limit, shouldClearByInstruction {
            transactions += try clearByInstruction()
        }
        while transactions < limit, let chunk = nextChunk() {
            transactions += try write(chunk)
        }
        if transactions < limit, shownBacklight != wantedBacklight {
            // Nothing else to write: a lone port byte switches the backlight.
            var idle: [UInt8] = []
            interface.appendIdle(backlight: wantedBacklight, to: &idle)
            transactions += try transmit(idle)
            shownBacklight = wantedBacklight
        }
        return (transactions, !hasPendingChanges)
    }

    /// One transaction's worth of cells and the port bytes that write them.
    private struct Chunk {
        var bytes: [UInt8] = []
        var cells: [(index: Int, code: UInt8)] = []
        var cursorAfter: UInt8?
    }

    /// The next pending cells in address order: at most
    /// `charactersPerTransaction` characters plus the set-DDRAM-address
    /// instructions they need, at most `charactersPerTransaction + 1` bytes
    /// sent to the LCD (each four port bytes), and within the adapter's
    /// longest write.
    ///
    /// No waits between the bytes: each data write or instruction needs
    /// 37 µs (Table 6, fosc = 270 kHz), and two strobes are always at least
    /// two port bytes apart. A port byte is nine clocks on the bus, 90 µs at
    /// the usual 100 kHz, so the next strobe comes 180 µs later (45 µs even
    /// at 400 kHz).
    private func nextChunk() -> Chunk? {
        var unitLimit = charactersPerTransaction + 1
        if let maxWrite = interface.maxTransactionBytes {
            unitLimit = min(unitLimit, max(maxWrite / (2 * interface.bytesPerNibble), 1))
        }
        var chunk = Chunk()
        var units = 0
        var position = cursor
        for index in writeOrder {
            let code = wanted[index]
            guard shown[index] != code else { continue }
            let address = cellAddresses[index]
            let needsAddress = position != address
            let cost = needsAddress ? 2 : 1
            if chunk.cells.count == charactersPerTransaction { break }
            if units + cost > unitLimit {
                if units == 0 {
                    // The adapter carries one byte per write: move the
                    // address counter on its own.
                    appendInstruction(Self.setDDRAMAddress | address, to: &chunk.bytes)
                    chunk.cursorAfter = address
                    return chunk
                }
                break
            }
            if needsAddress {
                appendInstruction(Self.setDDRAMAddress | address, to: &chunk.bytes)
            }
            interface.appendByte(code, rs: true, backlight: wantedBacklight, to: &chunk.bytes)
            chunk.cells.append((index, code))
            units += cost
            position = nextAddress(after: address)
        }
        guard !chunk.bytes.isEmpty else { return nil }
        chunk.cursorAfter = position
        return chunk
    }

    private func write(_ chunk: Chunk) throws -> Int {
        do {
            let transactions = try transmit(chunk.bytes)
            for cell in chunk.cells {
                shown[cell.index] = cell.code
            }
            cursor = chunk.cursorAfter
            shownBacklight = wantedBacklight
            return transactions
        } catch {
            for cell in chunk.cells {
                shown[cell.index] = nil
            }
            throw error
        }
    }

    /// After a data write the address counter moves on (entry mode I/D = 1);
    /// in two-line mode it runs from 0x27 to 0x40 and from 0x67 to 0x00, in
    /// one-line mode from 0x4F to 0x00 (datasheet "Address Counter (AC)" and
    /// Figures 3–5).
    private func nextAddress(after address: UInt8) -> UInt8 {
        if geometry.usesTwoLineMode {
            switch address {
            case 0x27: return 0x40
            case 0x67: return 0x00
            default: return address &+ 1
            }
        }
        return address == 0x4F ? 0x00 : address &+ 1
    }

    /// True when the whole wanted image is blank and blanking cell by cell
    /// would take more than one transaction.
    private var shouldClearByInstruction: Bool {
        guard wanted.allSatisfy({ $0 == CharacterROM.space }) else { return false }
        let blanks = shown.reduce(0) { $0 + ($1 == CharacterROM.space ? 0 : 1) }
        return blanks > charactersPerTransaction
    }

    private func clearByInstruction() throws -> Int {
        var bytes: [UInt8] = []
        appendInstruction(Self.clearDisplay, to: &bytes)
        do {
            let transactions = try transmit(bytes)
            sleep(Self.clearWait)
            // Clear display also sets I/D = 1 (Table 6): entry mode is unchanged.
            shown = [UInt8?](repeating: CharacterROM.space, count: shown.count)
            cursor = 0
            shownBacklight = wantedBacklight
            return transactions
        } catch {
            shown = [UInt8?](repeating: nil, count: shown.count)
            throw error
        }
    }

    // MARK: Bus

    private func strobeBytes(_ nibble: UInt8, rs: Bool) -> [UInt8] {
        var bytes: [UInt8] = []
        interface.appendNibble(nibble, rs: rs, backlight: wantedBacklight, to: &bytes)
        return bytes
    }

    private func appendInstruction(_ instruction: UInt8, to bytes: inout [UInt8]) {
        interface.appendByte(instruction, rs: false, backlight: wantedBacklight, to: &bytes)
    }

    /// Writes `bytes` through the interface (one transaction, or several
    /// when the transport limits their length). Any failure leaves the LCD
    /// in an unknown interface state.
    @discardableResult
    private func transmit(_ bytes: [UInt8]) throws -> Int {
        let transactions: Int
        do {
            transactions = try interface.send(bytes)
        } catch {
            if state == .ready { state = .needsResync }
            cursor = nil
            shownBacklight = nil
            throw error
        }
        return transactions
    }
}
