/// One log line per `interval` for an event that a peer can repeat at will
/// (a refused connection, a dropped reply), with the count of those not
/// logged since: the journal shows that it happens and how often, and a
/// flood of them costs no more than a line now and then.
struct LogThrottle {
    let interval: Duration
    private var lastLogged: ContinuousClock.Instant?
    private var unlogged = 0

    init(interval: Duration = .seconds(10)) {
        self.interval = interval
    }

    /// Counts one event at `now`. Returns what to append to its log line
    /// ("" or " (N more since the last such line)") when it is to be
    /// logged, nil when not.
    mutating func admit(at now: ContinuousClock.Instant) -> String? {
        if let lastLogged, now < lastLogged + interval {
            unlogged += 1
            return nil
        }
        defer {
            lastLogged = now
            unlogged = 0
        }
        return unlogged == 0 ? "" : " (\(unlogged) more since the last such line)"
    }
}
