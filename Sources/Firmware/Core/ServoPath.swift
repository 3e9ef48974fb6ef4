import Devices
import Foundation
import Hardware
import Logging

/// The path from a SERVO_VAL / PWM_VAL / ANALOG_OUT_EN frame to the PCA9685.
///
/// The event loop submits intents; a dedicated thread applies them. The
/// latest value per channel wins: while a write is on the bus, newer values
/// coalesce, and each flush writes every changed channel as one
/// auto-increment write per contiguous run (the driver's `flush()`).
///
/// Thread-safety: `submit`/`setEnabled`/`whenApplied`/`snapshot` are safe
/// from any thread; the driver is touched only by the servo thread.
public final class ServoPath: @unchecked Sendable {
    /// A channel's state as the protocol set it.
    public struct ChannelState: Sendable, Equatable {
        public var configuration: ChannelConfiguration
        public var enabled = false
        /// The last value command applied, for status.
        public var lastCommand: LastCommand?
        /// What the servo path asked the chip for (nil: no value yet).
        public var output: PCA9685.Output?
    }

    public enum LastCommand: Sendable, Equatable {
        case servo(UInt16)
        case pwm(UInt16)
    }

    /// Counters for `blecontrol status` and the benchmarks.
    public struct Metrics: Sendable {
        public var updates = 0
        public var coalesced = 0
        public var flushes = 0
        public var busTransactions = 0
        public var failedFlushes = 0
        public var latency = LatencyHistogram()
    }

    private struct Pending {
        var dirty = false
        var receivedAt: ContinuousClock.Instant?
    }

    private let driver: PCA9685
    private let logger: Logger
    private var channels: [Int: ChannelState]
    private var pending: [Int: Pending] = [:]
    private var metrics = Metrics()
    private var tracker = ApplyTracker()
    private var online = false
    private var lastError: String?
    private let worker = ServiceThread(name: "blecontrol-servo")
    private var condition: NSCondition { worker.condition }
    /// Read with `condition` locked.
    private var stopping: Bool { worker.isStopping }
    private let retryInterval: Duration

    /// - Parameter retryInterval: how long to wait before retrying a chip that
    ///   did not answer (start-up or a failed flush).
    public init(driver: PCA9685, channels: [ChannelConfiguration], retryInterval: Duration = .seconds(1), logger: Logger) {
        self.driver = driver
        self.logger = logger
        self.retryInterval = retryInterval
        var table: [Int: ChannelState] = [:]
        for configuration in channels { table[configuration.channel] = ChannelState(configuration: configuration) }
        self.channels = table
    }

    /// True when `channel` is configured on this board.
    public func isConfigured(_ channel: Int) -> Bool {
        condition.withLock { channels[channel] != nil }
    }

    /// Starts the servo thread, which initialises the chip (every output off
    /// first) before it applies anything.
    public func start() {
        worker.start { [self] in run() }
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
            guard var state = channels[channel] else { return false }
            let output: PCA9685.Output
            switch command {
            case .servo(let value): output = state.configuration.output(forServoValue: value)
            case .pwm(let value): output = state.configuration.output(forPWMValue: value)
            }
            state.lastCommand = command
            state.output = output
            channels[channel] = state
            markDirty(channel, receivedAt: receivedAt)
            return true
        }
    }

    /// ANALOG_OUT_EN: a stopped channel outputs nothing but keeps its value.
    @discardableResult
    public func setEnabled(_ enabled: Bool, channel: Int, receivedAt: ContinuousClock.Instant = .now) -> Bool {
        condition.withLock {
            guard channels[channel] != nil else { return false }
            channels[channel]?.enabled = enabled
            markDirty(channel, receivedAt: receivedAt)
            return true
        }
    }

    /// Calls `callback` (on the servo thread) once everything submitted so
    /// far has been written to the chip, with nil, or with the error that
    /// stopped it. This is what a write with response waits for.
    public func whenApplied(_ callback: @escaping @Sendable (String?) -> Void) {
        let queued = condition.withLock { tracker.wait(callback) }
        if !queued { callback(nil) }
    }

    /// Channel states, sorted by channel, with the chip's status.
    public func snapshot() -> (channels: [ChannelState], online: Bool, lastError: String?, metrics: Metrics) {
        condition.withLock {
            (channels.values.sorted { $0.configuration.channel < $1.configuration.channel }, online, lastError, metrics)
        }
    }

    /// Clears the latency histogram and counters (benchmarks).
    public func resetMetrics() {
        condition.withLock { metrics = Metrics() }
    }

    // MARK: Servo thread

    private func markDirty(_ channel: Int, receivedAt: ContinuousClock.Instant) {
        var entry = pending[channel] ?? Pending()
        if entry.dirty { metrics.coalesced += 1 }
        entry.dirty = true
        entry.receivedAt = receivedAt
        pending[channel] = entry
        metrics.updates += 1
        tracker.submit()
        condition.signal()
    }

    private func run() {
        while !condition.withLock({ stopping }) {
            if !online {
                do {
                    try driver.start()
                    condition.withLock {
                        online = true
                        lastError = nil
                        // Whatever was asked for while the chip was away goes out now.
                        for key in channels.keys { pending[key, default: Pending()].dirty = true }
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

    /// Waits for work, takes every dirty channel, and writes them in one flush.
    private func flushPending() {
        condition.lock()
        while !stopping && !pending.values.contains(where: \.dirty) { condition.wait() }
        if stopping {
            condition.unlock()
            return
        }
        var taken: [(channel: Int, receivedAt: ContinuousClock.Instant?)] = []
        for (channel, entry) in pending where entry.dirty {
            guard let state = channels[channel] else { continue }
            let output = state.configuration.output
            if let value = state.output { driver.stage(value, channel: output) }
            driver.setEnabled(state.enabled && state.output != nil, channel: output)
            taken.append((channel, entry.receivedAt))
            pending[channel]?.dirty = false
        }
        let generation = tracker.submitted
        condition.unlock()

        do {
            let transactions = try driver.flush()
            let now = ContinuousClock.now
            let ready = condition.withLock { () -> [@Sendable (String?) -> Void] in
                metrics.flushes += 1
                metrics.busTransactions += transactions
                for item in taken {
                    if let start = item.receivedAt { metrics.latency.record(start.duration(to: now)) }
                }
                if lastError != nil { logger.info("PCA9685 writes succeed again") }
                lastError = nil
                return tracker.complete(upTo: generation)
            }
            for callback in ready { callback(nil) }
        } catch {
            let ready = condition.withLock { () -> [@Sendable (String?) -> Void] in
                metrics.failedFlushes += 1
                // Keep the values: the next flush retries what failed.
                for item in taken { pending[item.channel, default: Pending()].dirty = true }
                return tracker.fail(upTo: generation)
            }
            reportFailure(error, initialising: false)
            for callback in ready { callback("\(error)") }
            waitBeforeRetry()
        }
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
            if !stopping { _ = condition.wait(until: Date(timeIntervalSinceNow: Self.seconds(retryInterval))) }
        }
    }

    static func seconds(_ duration: Duration) -> Double {
        let (seconds, attoseconds) = duration.components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
