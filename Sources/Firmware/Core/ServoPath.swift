import Devices
import Foundation
import Hardware
import Logging

/// The path from a SERVO_VAL / PWM_VAL / ANALOG_OUT_EN frame to the PCA9685,
/// and the failsafe engine: the one place every failure path ends up.
///
/// The event loop submits intents; a dedicated thread applies them. The
/// latest value per channel wins: while a write is on the bus, newer values
/// coalesce, and each flush writes every changed channel as one
/// auto-increment write per contiguous run (the driver's `flush()`).
///
/// Hot path: channel state lives in fixed arrays indexed by channel number
/// (no hashing, no allocation per frame or per flush once warm); the lock is
/// this path's own, never shared with the LCD or the event loop's I/O.
///
/// Thread-safety: every public method is safe from any thread; the driver is
/// touched only by the servo thread (and by `stop()` after it has ended).
public final class ServoPath: @unchecked Sendable {
    /// A channel's state as the protocol (and the failsafe) set it.
    public struct ChannelState: Sendable, Equatable {
        public var configuration: ChannelConfiguration
        public var enabled = false
        /// The last value command applied, for status.
        public var lastCommand: LastCommand?
        /// What the servo path asks the chip for (nil: no value yet).
        public var output: PCA9685.Output?
        /// An ESC channel after a failsafe: values are ignored until the
        /// central enables the channel again (no automatic resume).
        public var latched = false
    }

    public enum LastCommand: Sendable, Equatable {
        case servo(UInt16)
        case pwm(UInt16)
    }

    /// Why and since when the outputs are in their failsafe state.
    public struct Failsafe: Sendable, Equatable {
        public var reason: String
        public var since: ContinuousClock.Instant
        /// From engaging to the failsafe outputs written to the chip (nil
        /// until written: the bus may be the thing that failed).
        public var appliedAfter: Duration?
    }

    /// Counters for `blecontrol status` and the benchmarks.
    public struct Metrics: Sendable {
        public var updates = 0
        public var coalesced = 0
        public var flushes = 0
        public var busTransactions = 0
        public var failedFlushes = 0
        /// Updates whose receive → bus-write-complete latency exceeded one
        /// PWM period: they missed the period they could have made.
        public var deadlineMisses = 0
        public var failsafes = 0
        public var latency = LatencyHistogram()
    }

    /// Everything status shows, taken under the lock at one instant.
    public struct Snapshot: Sendable {
        public var channels: [ChannelState]
        public var online: Bool
        public var lastError: String?
        public var failsafe: Failsafe?
        public var metrics: Metrics
        /// The servo thread's scheduling: "SCHED_FIFO 50" or why not.
        public var scheduling: String
    }

    /// Timing knobs; the defaults suit a 50 Hz board.
    public struct Timing: Sendable {
        /// Wait before retrying a chip that did not answer.
        public var retryInterval: Duration = .seconds(1)
        /// A chip failing for this long puts the outputs in failsafe.
        public var faultFailsafeAfter: Duration = .seconds(1)
        /// One PWM period: updates slower than this missed their period.
        public var period: Duration = .milliseconds(20)
        /// At most this many flushes per PWM period on average, with bursts
        /// of as many (a token bucket); 0: no limit. The PCA9685 starts new
        /// counts only with its next period (datasheet §7.3.3: the outputs
        /// follow the counter, which compares against the registers every
        /// period), so more writes per period are mostly bus time nobody sees,
        /// while an isolated update still goes out at once.
        public var maxFlushesPerPeriod = 4
        /// How often the idle thread wakes to prove it is alive (watchdog).
        public var heartbeat: Duration = .milliseconds(250)
        public init() {}
    }

    /// Real-time scheduling for the servo thread.
    public struct Realtime: Sendable, Equatable {
        /// SCHED_FIFO priority 1…99; 0 leaves the default scheduler.
        public var priority: Int32
        public init(priority: Int32) { self.priority = priority }
    }

    private static let channelSlots = 256

    private let driver: PCA9685
    private let logger: Logger
    private let timing: Timing
    private let realtime: Realtime?
    /// Protocol channel → state; nil for channels the board does not have.
    private var channels: [ChannelState?]
    private var dirty: [Bool]
    private var receivedAt: [ContinuousClock.Instant?]
    /// ESC channels holding their neutral pulse until this instant.
    private var dwellUntil: [ContinuousClock.Instant?]
    private var configured: [Int]
    /// Reused by every flush (no allocation once warm).
    private var taken: [(channel: Int, receivedAt: ContinuousClock.Instant?)] = []
    private var metrics = Metrics()
    private var tracker = ApplyTracker()
    private var online = false
    private var lastError: String?
    private var failingSince: ContinuousClock.Instant?
    private var failsafe: Failsafe?
    private var flushTokens = 0.0
    private var tokensAt: ContinuousClock.Instant?
    /// Set while the servo thread is inside a bus transfer (stall watch).
    private var busySince: ContinuousClock.Instant?
    private var scheduling = "default scheduler"
    private let worker = ServiceThread(name: "blecontrol-servo")
    private var condition: NSCondition { worker.condition }
    /// Read with `condition` locked.
    private var stopping: Bool { worker.isStopping }

    /// Called on the servo thread at least every `timing.heartbeat` while
    /// the thread is healthy: the systemd watchdog ping comes from here, so a
    /// stalled servo thread is what the watchdog catches.
    public var onHeartbeat: (@Sendable () -> Void)?
    /// Called (on the thread that engaged it) when a failsafe engages.
    public var onFailsafe: (@Sendable (String) -> Void)?

    public init(driver: PCA9685, channels: [ChannelConfiguration], timing: Timing = Timing(), realtime: Realtime? = nil, logger: Logger) {
        self.driver = driver
        self.logger = logger
        self.timing = timing
        self.realtime = realtime
        var table = [ChannelState?](repeating: nil, count: Self.channelSlots)
        for configuration in channels where (0..<Self.channelSlots).contains(configuration.channel) {
            table[configuration.channel] = ChannelState(configuration: configuration)
        }
        self.channels = table
        configured = channels.map(\.channel).sorted()
        dirty = Array(repeating: false, count: Self.channelSlots)
        receivedAt = Array(repeating: nil, count: Self.channelSlots)
        dwellUntil = Array(repeating: nil, count: Self.channelSlots)
        taken.reserveCapacity(Self.channelSlots)
    }

    /// Convenience for callers that only set the retry interval.
    public convenience init(driver: PCA9685, channels: [ChannelConfiguration], retryInterval: Duration, logger: Logger) {
        var timing = Timing()
        timing.retryInterval = retryInterval
        timing.faultFailsafeAfter = retryInterval * 2
        self.init(driver: driver, channels: channels, timing: timing, logger: logger)
    }

    /// True when `channel` is configured on this board.
    public func isConfigured(_ channel: Int) -> Bool {
        condition.withLock { state(channel) != nil }
    }

    /// Starts the servo thread, which initialises the chip (every output off
    /// first) before it applies anything.
    public func start() {
        worker.start { [self] in
            applyRealtime()
            run()
        }
    }

    /// Stops the thread, then switches every output off without sleeping the
    /// chip (sleep cuts a pulse short and ESCs twitch).
    public func stop() {
        worker.stop()
        do {
            try driver.allOff()
        } catch {
            logger.error("outputs off at shutdown failed: \(error)")
        }
    }

    /// Applies a SERVO_VAL or PWM_VAL to `channel`; returns false when the
    /// channel is not configured.
    @discardableResult
    public func submit(_ command: LastCommand, channel: Int, receivedAt: ContinuousClock.Instant = .now) -> Bool {
        condition.withLock {
            guard var state = state(channel) else { return false }
            state.lastCommand = command
            // A latched ESC keeps its failsafe output until re-enabled.
            if !state.latched {
                switch command {
                case .servo(let value): state.output = state.configuration.output(forServoValue: value)
                case .pwm(let value): state.output = state.configuration.output(forPWMValue: value)
                }
            }
            channels[channel] = state
            markDirty(channel, receivedAt: receivedAt)
            return true
        }
    }

    /// ANALOG_OUT_EN: a stopped channel outputs nothing but keeps its value.
    /// Enabling also releases an ESC latched by a failsafe.
    @discardableResult
    public func setEnabled(_ enabled: Bool, channel: Int, receivedAt: ContinuousClock.Instant = .now) -> Bool {
        condition.withLock {
            guard var state = state(channel) else { return false }
            state.enabled = enabled
            if enabled {
                state.latched = false
                dwellUntil[channel] = nil
            }
            channels[channel] = state
            markDirty(channel, receivedAt: receivedAt)
            return true
        }
    }

    /// Puts every channel in its failsafe state (board file, per role):
    /// servo `hold` keeps its pulse, `pulse` goes to the preset, `off` stops;
    /// an ESC goes to its neutral pulse, stops after the dwell and stays
    /// stopped until enabled again; a PWM output goes to duty 0. Idempotent
    /// while a failsafe is active. Safe from any thread; applied by the servo
    /// thread as soon as the bus lets it.
    public func engageFailsafe(reason: String, at now: ContinuousClock.Instant = .now) {
        let engaged = condition.withLock { () -> Bool in
            guard failsafe == nil else { return false }
            failsafe = Failsafe(reason: reason, since: now)
            metrics.failsafes += 1
            var changed = false
            defer { if !changed { failsafe?.appliedAfter = .zero } }
            for channel in configured {
                guard var state = channels[channel] else { continue }
                let configuration = state.configuration
                switch (configuration.role, configuration.failsafe) {
                case (.servo, .hold):
                    continue
                case (.servo, .pulse(let width)):
                    state.output = .pulse(width)
                case (.esc, .pulse(let width)):
                    state.output = .pulse(width)
                    state.latched = true
                    dwellUntil[channel] = now + configuration.failsafeDwell
                case (.esc, _):
                    state.enabled = false
                    state.output = nil
                    state.latched = true
                case (.pwm, _):
                    state.output = .duty(0)
                case (.servo, .off):
                    state.enabled = false
                }
                channels[channel] = state
                markDirty(channel, receivedAt: nil)
                changed = true
            }
            return true
        }
        guard engaged else { return }
        logger.warning("failsafe: \(reason)")
        onFailsafe?(reason)
    }

    /// A central is in control again (it sent a frame): the failsafe is
    /// over. Outputs stay where the failsafe put them until new values come.
    public func clearFailsafe() {
        let cleared = condition.withLock { () -> Failsafe? in
            defer { failsafe = nil }
            return failsafe
        }
        if let cleared { logger.notice("failsafe cleared (was: \(cleared.reason))") }
    }

    /// Calls `callback` (on the servo thread) once everything submitted so
    /// far has been written to the chip, with nil, or with the error that
    /// stopped it. This is what a write with response waits for.
    public func whenApplied(_ callback: @escaping @Sendable (String?) -> Void) {
        let queued = condition.withLock { tracker.wait(callback) }
        if !queued { callback(nil) }
    }

    /// Everything status shows.
    public func snapshot() -> Snapshot {
        condition.withLock {
            Snapshot(
                channels: configured.compactMap { channels[$0] }, online: online, lastError: lastError,
                failsafe: failsafe, metrics: metrics, scheduling: scheduling
            )
        }
    }

    /// How long the servo thread has been inside one bus transfer, if it is.
    public func busyFor(at now: ContinuousClock.Instant = .now) -> Duration? {
        condition.withLock { busySince.map { $0.duration(to: now) } }
    }

    /// Clears the latency histogram and counters (benchmarks).
    public func resetMetrics() {
        condition.withLock { metrics = Metrics() }
    }

    // MARK: Servo thread

    private func state(_ channel: Int) -> ChannelState? {
        (0..<Self.channelSlots).contains(channel) ? channels[channel] : nil
    }

    private func markDirty(_ channel: Int, receivedAt instant: ContinuousClock.Instant?) {
        if dirty[channel] { metrics.coalesced += 1 }
        dirty[channel] = true
        receivedAt[channel] = instant
        metrics.updates += 1
        tracker.submit()
        condition.signal()
    }

    /// SCHED_FIFO when the process may (root or CAP_SYS_NICE / an rtprio
    /// limit); otherwise the default scheduler, logged once.
    private func applyRealtime() {
        guard let realtime, realtime.priority > 0 else { return }
        var parameters = sched_param()
        parameters.sched_priority = realtime.priority
        let result = pthread_setschedparam(pthread_self(), SCHED_FIFO, &parameters)
        let text = result == 0
            ? "SCHED_FIFO \(realtime.priority)"
            : "default scheduler (SCHED_FIFO \(realtime.priority) refused: \(String(cString: strerror(result))))"
        condition.withLock { scheduling = text }
        if result == 0 {
            logger.info("servo thread runs \(text)")
        } else {
            logger.warning("servo thread: \(text); run as root or grant CAP_SYS_NICE / LimitRTPRIO for real-time scheduling")
        }
    }

    private func run() {
        while !condition.withLock({ stopping }) {
            onHeartbeat?()
            if !condition.withLock({ online }) {
                do {
                    try driver.start()
                    condition.withLock {
                        online = true
                        lastError = nil
                        failingSince = nil
                        // Whatever was asked for while the chip was away goes out now.
                        for channel in configured { dirty[channel] = true }
                    }
                    logger.info("PCA9685 initialised, every output off, \(driver.actualFrequency)")
                } catch {
                    reportFailure(error, initialising: true)
                    // Nobody waits on a chip that is not there: fail them now.
                    let failed = condition.withLock { tracker.fail(upTo: tracker.submitted) }
                    for callback in failed { callback("\(error)") }
                    waitBeforeRetry()
                    continue
                }
            }
            flushPending()
        }
    }

    /// Waits for work (or a timed event), takes every dirty channel, and
    /// writes them in one flush.
    private func flushPending() {
        condition.lock()
        while true {
            if stopping {
                condition.unlock()
                return
            }
            let now = ContinuousClock.now
            let dwellDeadline = expireDwells(at: now)
            let hasWork = configured.contains { dirty[$0] }
            var wakeAt = now + timing.heartbeat
            if let dwellDeadline { wakeAt = min(wakeAt, dwellDeadline) }
            if hasWork {
                // Pace flushes: no more than useful per PWM period.
                guard let nextToken = takeFlushToken(at: now) else { break }
                wakeAt = min(wakeAt, nextToken)
            }
            _ = condition.wait(until: Date(timeIntervalSinceNow: now.duration(to: wakeAt).inSeconds))
            if !hasWork && ContinuousClock.now >= now + timing.heartbeat {
                // Idle but alive: let the watchdog know.
                condition.unlock()
                onHeartbeat?()
                condition.lock()
            }
        }
        taken.removeAll(keepingCapacity: true)
        for channel in configured where dirty[channel] {
            guard let state = channels[channel] else { continue }
            let output = state.configuration.output
            if let value = state.output { driver.stage(value, channel: output) }
            driver.setEnabled(state.enabled && state.output != nil, channel: output)
            taken.append((channel, receivedAt[channel]))
            dirty[channel] = false
        }
        let generation = tracker.submitted
        let start = ContinuousClock.now
        busySince = start
        condition.unlock()

        do {
            let transactions = try driver.flush()
            let now = ContinuousClock.now
            let (ready, recovered) = condition.withLock { () -> ([ApplyTracker.Callback], Bool) in
                busySince = nil
                metrics.flushes += 1
                metrics.busTransactions += transactions
                for item in taken {
                    guard let received = item.receivedAt else { continue }
                    let latency = received.duration(to: now)
                    metrics.latency.record(latency)
                    if latency > timing.period { metrics.deadlineMisses += 1 }
                }
                if let engaged = failsafe, engaged.appliedAfter == nil {
                    failsafe?.appliedAfter = engaged.since.duration(to: now)
                }
                let recovered = lastError != nil
                lastError = nil
                failingSince = nil
                return (tracker.complete(upTo: generation), recovered)
            }
            if recovered { logger.info("PCA9685 writes succeed again") }
            for callback in ready { callback(nil) }
        } catch {
            let (ready, escalate) = condition.withLock { () -> ([ApplyTracker.Callback], Bool) in
                busySince = nil
                metrics.failedFlushes += 1
                // Keep the values: the next flush retries what failed.
                for item in taken { dirty[item.channel] = true }
                let now = ContinuousClock.now
                if failingSince == nil { failingSince = start }
                let escalate = failsafe == nil && failingSince.map { $0.duration(to: now) >= timing.faultFailsafeAfter } == true
                // A fault that lasts may be a power cycle (the chip wakes up
                // asleep, all off): initialise it again once it answers.
                if escalate { online = false }
                return (tracker.fail(upTo: generation), escalate)
            }
            reportFailure(error, initialising: false)
            for callback in ready { callback("\(error)") }
            if escalate { engageFailsafe(reason: "PCA9685 not answering: \(error)") }
            waitBeforeRetry()
        }
    }

    /// Takes a flush token (returns nil: flush now) or says when the next
    /// one is due. With the lock held.
    private func takeFlushToken(at now: ContinuousClock.Instant) -> ContinuousClock.Instant? {
        let capacity = Double(timing.maxFlushesPerPeriod)
        guard capacity > 0 else { return nil }
        let perToken = timing.period / timing.maxFlushesPerPeriod
        if let tokensAt {
            flushTokens = min(capacity, flushTokens + tokensAt.duration(to: now).inSeconds / perToken.inSeconds)
        } else {
            flushTokens = capacity
        }
        tokensAt = now
        if flushTokens >= 1 {
            flushTokens -= 1
            return nil
        }
        return now + perToken * (1 - flushTokens)
    }

    /// Ends ESC dwells that are due (with the lock held); returns the next
    /// dwell deadline, if any.
    private func expireDwells(at now: ContinuousClock.Instant) -> ContinuousClock.Instant? {
        var next: ContinuousClock.Instant?
        for channel in configured {
            guard let until = dwellUntil[channel] else { continue }
            if until <= now {
                dwellUntil[channel] = nil
                channels[channel]?.enabled = false
                channels[channel]?.output = nil
                markDirty(channel, receivedAt: nil)
            } else {
                next = min(next ?? until, until)
            }
        }
        return next
    }

    private func reportFailure(_ error: any Error, initialising: Bool) {
        let message = "\(error)"
        let isNew = condition.withLock { () -> Bool in
            defer {
                lastError = message
                if initialising { online = false }
            }
            return lastError != message
        }
        // Once per distinct failure, not once per retry.
        if isNew { logger.error("PCA9685 \(initialising ? "initialisation" : "write") failed: \(message)") }
    }

    private func waitBeforeRetry() {
        condition.withLock {
            if !stopping { _ = condition.wait(until: Date(timeIntervalSinceNow: timing.retryInterval.inSeconds)) }
        }
    }
}
