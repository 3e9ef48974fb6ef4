import Devices
import Foundation
import Hardware
import Logging

/// Owns the HD44780: applies LCD_TEXT / LCD_CLEAR on a low-priority thread,
/// one bus chunk at a time so a servo flush never waits behind a whole line.
///
/// When the backpack stops acknowledging, the display goes offline (logged
/// once), is probed about once a second, and on return is initialised by
/// instruction again and redrawn from the framebuffer.
public final class LCDService: @unchecked Sendable {
    private enum Edit {
        case line(Int, [UInt8])
        case clear
    }

    private let driver: HD44780
    private let geometry: LCDGeometry
    private let logger: Logger
    private let probeInterval: Duration
    private var edits: [Edit] = []
    private var tracker = ApplyTracker()
    private var online = false
    private var lastError: String?
    private let worker = ServiceThread(name: "blecontrol-lcd")
    private var condition: NSCondition { worker.condition }
    /// Read with `condition` locked.
    private var stopping: Bool { worker.isStopping }
    /// What the framebuffer holds, as text (the driver's copy is the LCD thread's).
    private var shownLines: [String]
    private var busTransactions = 0

    public init(driver: HD44780, geometry: LCDGeometry, probeInterval: Duration = .seconds(1), logger: Logger) {
        self.driver = driver
        self.geometry = geometry
        self.logger = logger
        self.probeInterval = probeInterval
        self.shownLines = Array(repeating: "", count: geometry.rows)
    }

    /// Number of lines the display has.
    public var rows: Int { geometry.rows }

    public func start() {
        worker.start { [self] in run() }
    }

    public func stop() {
        worker.stop()
    }

    /// LCD_TEXT: replace one line with `text` (UTF-8 bytes as sent).
    public func setLine(_ row: Int, text: [UInt8]) {
        condition.withLock {
            // A newer text for the same line makes an unapplied older one moot.
            edits.removeAll { if case .line(row, _) = $0 { return true } else { return false } }
            edits.append(.line(row, text))
            tracker.submit()
            condition.signal()
        }
    }

    /// LCD_CLEAR.
    public func clear() {
        condition.withLock {
            edits.removeAll()
            edits.append(.clear)
            tracker.submit()
            condition.signal()
        }
    }

    /// See ``ServoPath/whenApplied(_:)``.
    public func whenApplied(_ callback: @escaping @Sendable (String?) -> Void) {
        let queued = condition.withLock { tracker.wait(callback) }
        if !queued { callback(nil) }
    }

    /// The framebuffer text, whether the display is online, and its last error.
    public func snapshot() -> (lines: [String], online: Bool, lastError: String?, busTransactions: Int) {
        condition.withLock { (shownLines, online, lastError, busTransactions) }
    }

    // MARK: LCD thread

    private func run() {
        while !condition.withLock({ stopping }) {
            if !online {
                do {
                    try driver.initialize()
                    condition.withLock {
                        online = true
                        if lastError != nil { logger.info("LCD answers again; redrawing") }
                        lastError = nil
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

    /// Applies queued edits to the framebuffer and writes one chunk.
    private func step() {
        condition.lock()
        while !stopping && edits.isEmpty && !driver.hasPendingChanges { condition.wait() }
        if stopping {
            condition.unlock()
            return
        }
        for edit in edits {
            switch edit {
            case .line(let row, let text): driver.setLine(row, codes: CharacterROM.encode(utf8: text))
            case .clear: driver.clear()
            }
        }
        edits.removeAll()
        shownLines = driver.lines
        let generation = tracker.submitted
        condition.unlock()

        do {
            let (transactions, done) = try driver.flushStep(maxTransactions: 1)
            let ready = condition.withLock { () -> [ApplyTracker.Callback] in
                busTransactions += transactions
                return done && edits.isEmpty ? tracker.complete(upTo: generation) : []
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
            if !stopping { _ = condition.wait(until: Date(timeIntervalSinceNow: probeInterval.inSeconds)) }
        }
    }
}
