import Devices
import Hardware
import Logging
import Reactor

/// Owns the HD44780: applies LCD_TEXT / LCD_CLEAR and the board's own
/// messages (``LCDScreen``) on a low-priority thread, one bus chunk at a
/// time so a servo flush never waits behind a whole line.
///
/// Everything that reaches the display goes through here: the centrals'
/// text and the system messages (failsafe, pairing passkey) are one path,
/// so they can never race each other onto the glass.
///
/// When the backpack stops acknowledging, the display goes offline (logged
/// once), is probed about once a second, and on return is initialised by
/// instruction again and redrawn from the screen state.
public final class LCDService: @unchecked Sendable {
    // `screen`, `screenChanged`, `tracker`, `online`, `lastError`,
    // `shownLines` and `busTransactions` are guarded by `worker.condition`;
    // the driver is the LCD thread's.

    /// The board's own messages.
    public typealias Message = SystemMessage

    private let driver: HD44780
    private let geometry: LCDGeometry
    private let logger: Logger
    private let probeInterval: Duration
    private var screen: LCDScreen
    private var screenChanged = false
    private var tracker = ApplyTracker()
    /// The submissions the driver's image holds: those up to it are on the
    /// glass once the driver has flushed (newer text replaced the rest).
    private var copiedGeneration: UInt64 = 0
    private var online = false
    private var lastError: String?
    private let worker = ServiceThread(name: "blecontrol-lcd", stackSize: LCDService.stackSize)
    /// The LCD thread's stack. Measured (issue #29, as ``EventLoop/stackSize``
    /// says how) while centrals rewrote the display: 24 KiB resident in a
    /// release build, 36 KiB in a debug one, thread-local storage included.
    /// 128 KiB: aarch64's minimum (PTHREAD_STACK_MIN), over three times that.
    public static let stackSize = 128 * 1024
    private var condition: Condition { worker.condition }
    /// What the driver's image holds, as text (the driver is the LCD thread's).
    private var shownLines: [String]
    private var busTransactions = 0

    public init(driver: HD44780, geometry: LCDGeometry, probeInterval: Duration = .seconds(1), logger: Logger) {
        self.driver = driver
        self.geometry = geometry
        self.logger = logger
        self.probeInterval = probeInterval
        screen = LCDScreen(rows: geometry.rows)
        shownLines = Array(repeating: "", count: geometry.rows)
    }

    /// Number of lines the display has.
    public var rows: Int { geometry.rows }
    public var columns: Int { geometry.columns }

    public func start() {
        worker.start { [self] in run() }
    }

    public func stop() {
        worker.stop()
    }

    /// LCD_TEXT: replace one line with `codes` (character-ROM codes).
    public func setLine(_ row: Int, codes: [UInt8]) {
        update { $0.setLine(row, codes: codes) }
    }

    /// LCD_TEXT with UTF-8 text.
    public func setLine(_ row: Int, text: [UInt8]) {
        setLine(row, codes: CharacterROM.encode(utf8: text))
    }

    /// LCD_CLEAR.
    public func clear() {
        update { $0.clear() }
    }

    /// Puts up one of the board's own messages over the centrals' text
    /// (`lines[row]` nil: that row shows through), or takes it down (nil).
    public func show(_ message: Message, _ lines: [String?]?) {
        update { $0.show(message, lines) }
    }

    private func update(_ change: (inout LCDScreen) -> Void) {
        condition.withLock {
            change(&screen)
            screenChanged = true
            tracker.submit()
            condition.signal()
        }
    }

    /// See ``ServoPath/whenApplied(_:)``.
    public func whenApplied(_ callback: @escaping @Sendable (String?) -> Void) {
        let queued = condition.withLock { tracker.wait(callback) }
        if !queued { callback(nil) }
    }

    /// What the display shows (as the driver's image holds it), the message
    /// covering it, whether it is online, its last error and its bus writes.
    public func snapshot() -> (lines: [String], message: Message?, online: Bool, lastError: String?, busTransactions: Int) {
        condition.withLock { (shownLines, screen.topMessage, online, lastError, busTransactions) }
    }

    // MARK: LCD thread

    private func run() {
        while !condition.withLock({ worker.isStopping }) {
            if !online {
                do {
                    try driver.initialize()
                    condition.withLock {
                        online = true
                        if lastError != nil { logger.info("LCD answers again; redrawing") }
                        lastError = nil
                        // Redraw the whole screen state on the fresh display.
                        screenChanged = true
                    }
                    logger.info("LCD initialised (\(geometry.columns)×\(geometry.rows))")
                } catch {
                    fail(error)
                    continue
                }
            }
            step()
        }
    }

    /// Hands a changed screen to the driver and writes one chunk.
    private func step() {
        condition.lock()
        while !worker.isStopping && !screenChanged && !driver.hasPendingChanges { condition.wait() }
        if worker.isStopping {
            condition.unlock()
            return
        }
        if screenChanged {
            for (row, codes) in screen.shown.enumerated() { driver.setLine(row, codes: codes) }
            screenChanged = false
            shownLines = driver.lines
            copiedGeneration = tracker.submitted
        }
        let generation = copiedGeneration
        condition.unlock()

        do {
            let (transactions, done) = try driver.flushStep(maxTransactions: 1)
            let ready = condition.withLock { () -> [ApplyTracker.Callback] in
                busTransactions += transactions
                // What the image held is on the glass: its writers are
                // answered even if newer text is waiting (not "when idle":
                // a display rewritten every millisecond never is).
                return done ? tracker.complete(upTo: generation) : []
            }
            for callback in ready { callback(nil) }
        } catch {
            fail(error)
        }
    }

    private func fail(_ error: any Error) {
        let message = "\(error)"
        let (isNew, failed) = condition.withLock { () -> (Bool, [ApplyTracker.Callback]) in
            let isNew = lastError != message
            lastError = message
            online = false
            return (isNew, tracker.fail(upTo: tracker.submitted))
        }
        if isNew { logger.error("LCD offline: \(message); probing every \(probeInterval)") }
        for callback in failed { callback(message) }
        condition.withLock {
            if !worker.isStopping { condition.wait(until: .now + probeInterval) }
        }
    }
}
