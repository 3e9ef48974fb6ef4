/// Keeps one source of log lines from flooding the log: at most `burst`
/// lines per `window` for each key (the daemon keys by the line's place in
/// the code, so a sender who can make one warning happen can make it
/// happen only `burst` times a window). The lines held back are counted,
/// and the next line let through for that key says how many there were.
/// Thread-safe: log handlers are called from every thread.
public final class LogLimiter: @unchecked Sendable {
    /// What to do with one line.
    public enum Verdict: Equatable, Sendable {
        /// Log it; `heldBack` lines of the same key were not logged before it.
        case log(heldBack: Int)
        /// Drop it (counted).
        case drop
    }

    public let burst: Int
    public let window: Duration
    private let lock = Lock()
    private var keys: [String: (windowStart: ContinuousClock.Instant, logged: Int, heldBack: Int)] = [:]
    /// Keys kept at most: a key is a place in the code, so this is never
    /// reached in practice; it bounds the table if a caller keys by input.
    public static let maximumKeys = 1024

    /// " (N more since the last such line)" for a line that follows N held
    /// back, "" for none.
    public static func more(_ heldBack: Int) -> String {
        heldBack == 0 ? "" : " (\(heldBack) more since the last such line)"
    }

    public init(burst: Int = 10, window: Duration = .seconds(60)) {
        self.burst = burst
        self.window = window
    }

    /// The verdict for a line of `key` at `now`.
    public func admit(_ key: String, at now: ContinuousClock.Instant = .now) -> Verdict {
        lock.withLock {
            var entry = keys[key] ?? (now, 0, 0)
            if now - entry.windowStart >= window {
                entry.windowStart = now
                entry.logged = 0
            }
            guard entry.logged < burst else {
                entry.heldBack += 1
                keys[key] = entry
                return .drop
            }
            let heldBack = entry.heldBack
            entry.logged += 1
            entry.heldBack = 0
            if keys[key] == nil, keys.count >= Self.maximumKeys { keys.removeAll(keepingCapacity: true) }
            keys[key] = entry
            return .log(heldBack: heldBack)
        }
    }
}
