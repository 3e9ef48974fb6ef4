import Reactor
import Hardware
import Logging

/// A status LED on a ``DigitalOutput``, showing one of a few patterns.
///
/// The LED keeps no timer of its own: the owner calls
/// ``update(at:)`` at (or after) the instant the previous call returned, and
/// whenever it changes ``pattern``. Blinking is computed from the instant the
/// current pattern was first updated, so a late call shows the right level for
/// its instant instead of drifting.
///
/// An output that fails to switch is logged once (until it works again) and
/// retried on the next update; it never throws: an LED is not worth stopping
/// for.
///
/// Thread-safe (a lock guards the state), though one owner is the rule.
public final class StatusLED: @unchecked Sendable {
    /// What the LED shows.
    public enum Pattern: Sendable, Hashable, CaseIterable, CustomStringConvertible {
        /// Dark.
        case off
        /// Lit.
        case on
        /// 1 Hz, half lit: running, waiting for a central.
        case slowBlink
        /// 5 Hz, half lit: a device is not answering.
        case fastBlink
        /// Two 100 ms flashes every second: a central is connected.
        case heartbeat

        public var description: String {
            switch self {
            case .off: return "off"
            case .on: return "on"
            case .slowBlink: return "slow-blink"
            case .fastBlink: return "fast-blink"
            case .heartbeat: return "heartbeat"
            }
        }

        /// The pattern as alternating lit/dark segments from the start of a
        /// period, lit first; `nil` for steady patterns.
        var segments: [Duration]? {
            switch self {
            case .off, .on: return nil
            case .slowBlink: return [.milliseconds(500), .milliseconds(500)]
            case .fastBlink: return [.milliseconds(100), .milliseconds(100)]
            case .heartbeat: return [.milliseconds(100), .milliseconds(150), .milliseconds(100), .milliseconds(650)]
            }
        }
    }

    private let output: any DigitalOutput
    private let logger: Logger
    private let lock = Lock()
    private var current = Pattern.off
    /// When the current pattern's first period began; `nil` until the first
    /// update after a change.
    private var phaseStart: ContinuousClock.Instant?
    /// The level last written successfully; `nil` before any, or when the
    /// last write failed (the line's level is then unknown).
    private var written: Bool?
    private var lastLit = false
    private var failing = false

    /// How long a failed write waits before the next attempt, when the
    /// pattern itself would not call again.
    public static let retryInterval = Duration.seconds(1)

    public init(output: any DigitalOutput, logger: Logger) {
        self.output = output
        self.logger = logger
    }

    /// The pattern to show. Setting the pattern it already shows keeps the
    /// blink phase; another one starts at its lit segment on the next update.
    public var pattern: Pattern {
        get { lock.withLock { current } }
        set {
            lock.withLock {
                guard newValue != current else { return }
                current = newValue
                phaseStart = nil
            }
        }
    }

    /// Whether the LED was last switched on (what the line shows, as far as
    /// the driver knows).
    public var isLit: Bool { lock.withLock { lastLit } }

    /// Drives the output to the pattern's level at `now`.
    ///
    /// - Returns: when the level next changes, so the caller should call
    ///   again; for a steady pattern `nil`, unless the write failed, in which
    ///   case the instant to retry.
    @discardableResult
    public func update(at now: ContinuousClock.Instant) -> ContinuousClock.Instant? {
        lock.lock()
        let (level, next) = levelAndNextChange(at: now)
        let needsWrite = written != level
        lock.unlock()

        var failure: (any Error)?
        if needsWrite {
            do {
                try output.set(level)
            } catch {
                failure = error
            }
        }

        lock.lock()
        defer { lock.unlock() }
        guard needsWrite else { return next }
        if let failure {
            written = nil
            if !failing {
                failing = true
                logger.warning("status LED: \(failure); retrying")
            }
            let retry = now.advanced(by: Self.retryInterval)
            return next.map { min($0, retry) } ?? retry
        }
        if failing {
            failing = false
            logger.info("status LED works again")
        }
        written = level
        lastLit = level
        return next
    }

    /// The level at `now` and the instant it changes. Call with the lock held.
    private func levelAndNextChange(at now: ContinuousClock.Instant) -> (Bool, ContinuousClock.Instant?) {
        guard let segments = current.segments else { return (current == .on, nil) }
        let start: ContinuousClock.Instant
        if let phaseStart, phaseStart <= now {
            start = phaseStart
        } else {
            start = now
            phaseStart = now
        }
        let period = segments.reduce(Duration.zero, +)
        let elapsed = start.duration(to: now)
        // Whole periods are skipped by arithmetic, not by walking them: the
        // caller may have been away for a long time.
        let periods = Self.nanoseconds(elapsed) / max(Self.nanoseconds(period), 1)
        var segmentEnd = start.advanced(by: period * periods)
        for (index, length) in segments.enumerated() {
            segmentEnd = segmentEnd.advanced(by: length)
            if now < segmentEnd {
                return (index % 2 == 0, segmentEnd)
            }
        }
        // Sub-nanosecond remainder at the very end of a period: the next
        // one starts lit.
        return (true, segmentEnd.advanced(by: segments[0]))
    }

    private static func nanoseconds(_ duration: Duration) -> Int64 {
        let parts = duration.components
        return parts.seconds * 1_000_000_000 + parts.attoseconds / 1_000_000_000
    }
}
