#if canImport(Glibc)
import Glibc
#endif
import Board
import Devices
import Hardware
import Logging
import Reactor

/// The path from a SERVO_VAL / PWM_VAL / ANALOG_OUT_EN frame to the PCA9685
/// chips, and the failsafe engine: the one place every failure path ends up.
///
/// The event loop submits intents; a dedicated thread applies them. The
/// latest value per channel wins: while a write is on the bus, newer values
/// coalesce, and each flush writes every changed channel as one
/// auto-increment write per contiguous run (the driver's `flush()`), per chip.
/// The decisions live in ``ServoEngine``; this type is its thread and lock.
///
/// Thread-safety: every public method is safe from any thread; the drivers
/// are touched only by the servo thread (and by `stop()` after it ended).
/// The lock is priority-inheriting: the event loop holds it briefly while
/// submitting, and the servo thread may run SCHED_FIFO.
public final class ServoPath: @unchecked Sendable {
    // `engine`, `online`, `lastError`, `failingSince`, `busySince`,
    // `scheduling` and `busyReported` are guarded by `worker.condition`.

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
        /// On its way to its value (a channel with motion limits).
        public var moving = false
        /// The pulse last written, in µs, where a move has got to (nil
        /// before the first; kept for channels with motion limits).
        public var currentPulse: Double?
        /// A servo still for its `release_after_ms`: no pulses until the
        /// next command, which resumes from where it was.
        public var released = false
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
        /// Motion steps due (one per PWM period while something moves), and
        /// those taken late by a whole period or more (two in one write).
        public var motionPeriods = 0
        public var motionPeriodsMissed = 0
    }

    /// Everything status shows, taken under the lock at one instant.
    public struct Snapshot: Sendable {
        public var channels: [ChannelState]
        public var online: Bool
        public var lastError: String?
        public var failsafe: Failsafe?
        public var metrics: Metrics
        /// Receive → bus-write-complete latency: its percentiles, read under
        /// the lock. A snapshot holds no reference to the servo thread's
        /// histogram (92 KiB): if one did, the thread's next flush would copy
        /// it (copy on write), allocating on the real-time path (issue #29).
        public var latency: LatencyHistogram.Summary
        /// How late each motion step was after its period began.
        public var motionLateness: LatencyHistogram.Summary
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
        /// How often an idle thread proves it is alive (the systemd watchdog
        /// ping); nil: it sleeps until there is work.
        public var heartbeat: Duration?
        public init() {}
    }

    /// Real-time scheduling for the servo thread.
    public struct Realtime: Sendable, Equatable {
        /// SCHED_FIFO priority 1…99; 0 leaves the default scheduler.
        public var priority: Int32
        /// The process locked its memory (`realtime.lock_memory`, locked
        /// on fault: ``ProcessMemory``): the servo thread then locks its
        /// whole stack and warms its code paths up before it serves, so
        /// that serving never waits for a page.
        public var lockedMemory: Bool
        public init(priority: Int32, lockedMemory: Bool = false) {
            self.priority = priority
            self.lockedMemory = lockedMemory
        }
    }

    /// The servo thread's stack. Measured (issue #29, as ``EventLoop/stackSize``
    /// says how) under 500 frames/s with failsafes: 24 KiB resident in a
    /// release build, 32 KiB in a debug one, thread-local storage included.
    /// With locked memory the whole of it is made resident at start
    /// (``ProcessMemory/lockCurrentStack()``), so it is kept small: 128 KiB,
    /// four times the worst measured, and aarch64's minimum (PTHREAD_STACK_MIN).
    public static let stackSize = 128 * 1024

    private let drivers: [PCA9685]
    private let outputEnable: (any DigitalOutput)?
    private let logger: Logger
    private let timing: Timing
    private let realtime: Realtime?
    private var engine: ServoEngine
    private var online = false
    private var lastError: String?
    private var failingSince: ContinuousClock.Instant?
    /// Set while the servo thread is inside a bus transfer (stall watch).
    private var busySince: ContinuousClock.Instant?
    private var busyReported = false
    /// The servo thread's kernel id, once it runs (the stall watch reads
    /// what the kernel counted of its time).
    private var threadID: Int32?
    private var scheduling = "default scheduler"
    private let worker = ServiceThread(name: "blecontrol-servo", stackSize: ServoPath.stackSize, priorityInheritance: true)
    private var condition: Condition { worker.condition }
    private var chipTouched: [Bool]

    /// Called on the servo thread at least every `timing.heartbeat` while
    /// the thread is healthy: the systemd watchdog ping comes from here, so a
    /// stalled servo thread is what the watchdog catches.
    public var onHeartbeat: (@Sendable () -> Void)?
    /// Called (on the thread that engaged it) when a failsafe engages.
    public var onFailsafe: (@Sendable (String) -> Void)?
    /// Called on the servo thread when it enters a bus transfer and nobody
    /// watches for a stall yet (``acknowledgeBusy()`` re-arms it): lets the
    /// failsafe watch arm one timer per stall period of activity, not poll.
    public var onBusy: (@Sendable (ContinuousClock.Instant) -> Void)?

    /// - Parameter outputEnable: the line on the chips' OE pin, if wired:
    ///   made active once every output is off at start, inactive at stop.
    public init(drivers: [PCA9685], channels: [ChannelConfiguration], timing: Timing = Timing(), realtime: Realtime? = nil,
                outputEnable: (any DigitalOutput)? = nil, logger: Logger) {
        precondition(!drivers.isEmpty, "a servo path needs at least one PCA9685")
        self.drivers = drivers
        self.outputEnable = outputEnable
        self.logger = logger
        self.timing = timing
        self.realtime = realtime
        engine = ServoEngine(channels: channels, timing: timing)
        chipTouched = Array(repeating: false, count: drivers.count)
    }

    /// One chip, for tests and simple boards.
    public convenience init(driver: PCA9685, channels: [ChannelConfiguration], timing: Timing = Timing(), realtime: Realtime? = nil, logger: Logger) {
        self.init(drivers: [driver], channels: channels, timing: timing, realtime: realtime, logger: logger)
    }

    /// Convenience for callers that only set the retry interval.
    public convenience init(driver: PCA9685, channels: [ChannelConfiguration], retryInterval: Duration, logger: Logger) {
        var timing = Timing()
        timing.retryInterval = retryInterval
        timing.faultFailsafeAfter = retryInterval * 2
        self.init(drivers: [driver], channels: channels, timing: timing, logger: logger)
    }

    /// The frequency the first chip produces (all chips share the board's).
    public var actualFrequency: Hertz { drivers[0].actualFrequency }

    /// Starts the servo thread, which initialises the chips (every output
    /// off first) before it applies anything.
    public func start() {
        worker.start { [self] in
            let id = ThreadTime.currentID()
            condition.withLock { threadID = id }
            applyRealtime()
            if realtime?.lockedMemory == true { ProcessMemory.lockCurrentStack() }
            run()
        }
    }

    /// Stops the thread, then switches every output off without sleeping the
    /// chips (sleep cuts a pulse short and ESCs twitch).
    public func stop() {
        worker.stop()
        for driver in drivers {
            do {
                try driver.allOff()
            } catch {
                logger.error("outputs off at shutdown failed: \(error)")
            }
        }
        enableOutputs(false)
    }

    /// Drives the OE line (`servo.output_enable`); a failure is logged: the
    /// I2C all-off is what makes the outputs safe, OE is the second line.
    private func enableOutputs(_ enabled: Bool) {
        guard let outputEnable else { return }
        do {
            try outputEnable.set(enabled)
        } catch {
            logger.error("servo.output_enable: \(error)")
        }
    }

    /// Applies a SERVO_VAL or PWM_VAL to `channel`; returns false when the
    /// channel is not configured.
    @discardableResult
    public func submit(_ command: LastCommand, channel: Int, receivedAt: ContinuousClock.Instant = .now, over: Duration? = nil) -> Bool {
        update { $0.submit(command, channel: channel, receivedAt: receivedAt, over: over) }
    }

    /// ANALOG_OUT_EN: a stopped channel outputs nothing but keeps its value.
    @discardableResult
    public func setEnabled(_ enabled: Bool, channel: Int, receivedAt: ContinuousClock.Instant = .now) -> Bool {
        update { $0.setEnabled(enabled, channel: channel, receivedAt: receivedAt) }
    }

    /// SWITCH_VAL for a switch wired to a chip output (fully on or off).
    public func setSwitch(chip: Int = 0, output: Int, on: Bool) {
        _ = update {
            $0.setSwitch(chip: chip, output: output, on: on)
            return true
        }
    }

    /// Changes the engine under the lock and wakes the servo thread when it
    /// took the change.
    private func update(_ change: (inout ServoEngine) -> Bool) -> Bool {
        condition.withLock {
            let accepted = change(&engine)
            if accepted { condition.signal() }
            return accepted
        }
    }

    /// Puts every channel in its failsafe state (``ServoEngine/engageFailsafe(reason:at:)``).
    /// Idempotent while a failsafe is active. Safe from any thread; applied
    /// by the servo thread as soon as the bus lets it.
    public func engageFailsafe(reason: String, at now: ContinuousClock.Instant = .now) {
        let engaged = condition.withLock { () -> Bool in
            let engaged = engine.engageFailsafe(reason: reason, at: now)
            if engaged { condition.signal() }
            return engaged
        }
        guard engaged else { return }
        logger.warning("failsafe: \(reason)")
        onFailsafe?(reason)
    }

    /// Engages the failsafe for `reason`, or, when one holds already, makes
    /// `reason` the one it holds for (outputs untouched: they are in their
    /// failsafe state). For a cause that outlasts the one before it: a
    /// commander silent or gone during a stall or a fault, whose failsafe
    /// only a central taking its outputs over may end.
    public func holdFailsafe(reason: String, at now: ContinuousClock.Instant = .now) {
        let changed = condition.withLock { () -> Bool in
            if engine.engageFailsafe(reason: reason, at: now) {
                condition.signal()
                return true
            }
            return engine.restateFailsafe(reason: reason)
        }
        guard changed else { return }
        logger.warning("failsafe: \(reason)")
        onFailsafe?(reason)
    }

    /// A central is in control again (it sent an accepted frame): the
    /// failsafe is over. Returns what was cleared, if anything.
    @discardableResult
    public func clearFailsafe() -> Failsafe? {
        let cleared = condition.withLock { engine.clearFailsafe() }
        if let cleared { logger.notice("failsafe cleared (was: \(cleared.reason))") }
        return cleared
    }

    /// Calls `callback` (on the servo thread) once everything submitted so
    /// far has been written to the chips, with nil, or with the error that
    /// stopped it. This is what a write with response waits for.
    public func whenApplied(_ callback: @escaping @Sendable (String?) -> Void) {
        let queued = condition.withLock { engine.tracker.wait(callback) }
        if !queued { callback(nil) }
    }

    /// Everything status shows; without `latency`, its latency is left
    /// empty (the percentiles cost a walk of the histogram under the lock).
    public func snapshot(latency: Bool = true) -> Snapshot {
        condition.withLock {
            Snapshot(channels: engine.snapshotChannels, online: online, lastError: lastError, failsafe: engine.failsafe, metrics: engine.metrics,
                     latency: latency ? engine.latency.summary : LatencyHistogram.Summary(),
                     motionLateness: latency ? engine.motionLateness.summary : LatencyHistogram.Summary(), scheduling: scheduling)
        }
    }

    /// The failsafe reason, cheaply (poll requests).
    public var failsafeReason: String? { condition.withLock { engine.failsafe?.reason } }

    /// Whether the chips are offline or the failsafe holds, cheaply (the LED).
    public var offlineOrInFailsafe: Bool { condition.withLock { !online || engine.failsafe != nil } }

    /// How long the servo thread has been inside one bus transfer, if it is.
    public func busyFor(at now: ContinuousClock.Instant = .now) -> Duration? {
        condition.withLock { busySince.map { $0.duration(to: now) } }
    }

    /// How long the servo thread has been on a CPU or waiting for one, in
    /// all (``ThreadTime/runnable(thread:)``); nil before it runs or where
    /// the kernel does not say.
    public func runnableTime() -> Duration? {
        condition.withLock { threadID }.flatMap { ThreadTime.runnable(thread: $0) }
    }

    /// The stall watch has seen the last ``onBusy``: the next transfer may report again.
    public func acknowledgeBusy() {
        condition.withLock { busyReported = false }
    }

    /// A reloaded board file's channels and pacing (``ServoEngine/reconfigure(channels:timing:)``):
    /// unchanged channels keep their state. Returns the channels that changed.
    @discardableResult
    public func reconfigure(channels: [ChannelConfiguration], maxFlushesPerPeriod: Int) -> [Int] {
        condition.withLock {
            var timing = engine.timing
            timing.maxFlushesPerPeriod = maxFlushesPerPeriod
            let touched = engine.reconfigure(channels: channels, timing: timing)
            condition.signal()
            return touched
        }
    }

    /// Clears the latency histogram and counters (benchmarks).
    public func resetMetrics() {
        condition.withLock { engine.resetMetrics() }
    }

    // MARK: Servo thread

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
        var nextHeartbeat = ContinuousClock.now
        var warm = realtime?.lockedMemory != true
        while !condition.withLock({ worker.isStopping }) {
            if let heartbeat = timing.heartbeat, ContinuousClock.now >= nextHeartbeat {
                onHeartbeat?()
                nextHeartbeat = .now + heartbeat
            }
            if !condition.withLock({ online }) {
                guard startChips() else {
                    waitBeforeRetry()
                    continue
                }
                if !warm {
                    warmUp()
                    warm = true
                }
            }
            step(heartbeatDue: timing.heartbeat == nil ? nil : nextHeartbeat)
        }
    }

    /// With locked memory, once the chips first answer: runs what serving
    /// runs, before anything is served, so that each page it touches is
    /// locked now (MCL_ONFAULT locks a page at its first touch; a code page
    /// read from the SD card then would cost milliseconds on the servo
    /// path). The chips' write path: every driver forgets what its chip
    /// holds, so the first flush writes every output's all-off image again
    /// (the same registers: no output changes). The failsafe path and the
    /// drivers' arithmetic, on copies: a scratch copy of the engine takes
    /// values on every channel, engages its failsafe, and its batch goes
    /// through a scratch driver on a bus that goes nowhere.
    private func warmUp() {
        for driver in drivers { driver.forgetChipState() }
        var scratch = condition.withLock { engine }
        let now = ContinuousClock.now
        for channel in scratch.configured {
            _ = scratch.setEnabled(true, channel: channel, receivedAt: now)
            _ = scratch.submit(.servo(500), channel: channel, receivedAt: now)
        }
        let sink = PCA9685(bus: DiscardingI2CBus(), configuration: PCA9685.Configuration(), logger: logger, sleep: { _ in })
        try? sink.start()
        for engage in [false, true] {
            if engage { _ = scratch.engageFailsafe(reason: "warm-up", at: now) }
            guard case .flush = scratch.nextAction(at: now) else { continue }
            for item in scratch.batch {
                if let value = item.value { sink.stage(value, channel: item.output) }
                sink.setEnabled(item.enabled, channel: item.output)
            }
            let transactions = (try? sink.flush()) ?? 0
            scratch.flushSucceeded(transactions: transactions, at: .now)
        }
    }

    /// Initialises every chip (all outputs off first); false when one fails.
    private func startChips() -> Bool {
        do {
            for driver in drivers { try driver.start() }
            condition.withLock {
                online = true
                lastError = nil
                failingSince = nil
                // Whatever was asked for while the chips were away goes out now.
                engine.markAllDirty()
            }
            logger.info("PCA9685 initialised (\(drivers.count) chip\(drivers.count == 1 ? "" : "s")), every output off, \(drivers[0].actualFrequency)")
            // Every output is off: OE may let them through now.
            enableOutputs(true)
            return true
        } catch {
            reportFailure(error, initialising: true)
            // Nobody waits on a chip that is not there: fail them now.
            let failed = condition.withLock { engine.tracker.fail(upTo: engine.tracker.submitted) }
            for callback in failed { callback("\(error)") }
            return false
        }
    }

    /// Waits for work or a timed event, or writes one batch.
    private func step(heartbeatDue: ContinuousClock.Instant?) {
        condition.lock()
        let now = ContinuousClock.now
        switch engine.nextAction(at: now) {
        case .wait(let until):
            // The earlier of the two, without an array (no allocation here).
            let deadline = until.map { due in heartbeatDue.map { min($0, due) } ?? due } ?? heartbeatDue
            if !worker.isStopping {
                if let deadline { condition.wait(until: deadline) } else { condition.wait() }
            }
            condition.unlock()
            return
        case .flush:
            break
        }
        for index in chipTouched.indices { chipTouched[index] = false }
        for item in engine.batch {
            let driver = drivers[item.chip]
            if let value = item.value { driver.stage(value, channel: item.output) }
            driver.setEnabled(item.enabled, channel: item.output)
            chipTouched[item.chip] = true
        }
        let generation = engine.tracker.submitted
        busySince = now
        let report = !busyReported && onBusy != nil
        if report { busyReported = true }
        condition.unlock()
        if report { onBusy?(now) }

        do {
            var transactions = 0
            for (index, driver) in drivers.enumerated() where chipTouched[index] {
                transactions += try driver.flush()
            }
            let done = ContinuousClock.now
            let (ready, recovered) = condition.withLock { () -> ([ApplyTracker.Callback], Bool) in
                busySince = nil
                engine.flushSucceeded(transactions: transactions, at: done)
                let recovered = lastError != nil
                lastError = nil
                failingSince = nil
                return (engine.tracker.complete(upTo: generation), recovered)
            }
            if recovered { logger.info("PCA9685 writes succeed again") }
            for callback in ready { callback(nil) }
        } catch {
            let ready = condition.withLock { () -> [ApplyTracker.Callback] in
                busySince = nil
                engine.flushFailed()
                if failingSince == nil { failingSince = now }
                return engine.tracker.fail(upTo: generation)
            }
            reportFailure(error, initialising: false)
            for callback in ready { callback("\(error)") }
            escalateIfLasting(error, since: now)
            waitBeforeRetry()
        }
    }

    /// A fault that lasts `faultFailsafeAfter` engages the failsafe; it may
    /// be a power cycle (the chip wakes up asleep, all off), so the chips are
    /// initialised again once they answer.
    private func escalateIfLasting(_ error: any Error, since start: ContinuousClock.Instant) {
        let escalate = condition.withLock { () -> Bool in
            if failingSince == nil { failingSince = start }
            let lasting = failingSince.map { $0.duration(to: .now) >= timing.faultFailsafeAfter } == true
            guard lasting, engine.failsafe == nil else { return false }
            online = false
            return true
        }
        if escalate { engageFailsafe(reason: "PCA9685 not answering: \(error)") }
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
            if !worker.isStopping { condition.wait(until: .now + timing.retryInterval) }
        }
    }
}

extension PCA9685.Configuration {
    /// The driver settings of a board file's chip.
    public init(_ chip: PCA9685Chip) {
        self.init(address: chip.address, frequency: chip.frequency, oscillator: chip.oscillator, totemPole: chip.totemPole)
    }
}
