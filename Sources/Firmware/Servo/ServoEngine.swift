import Board
import Devices
import Hardware

/// The servo path's state and decisions, without a thread, a lock, a clock
/// or a bus: channel values, coalescing, flush pacing, the failsafe engine
/// and ESC dwells, given the instant of every event. ``ServoPath`` runs it
/// on the servo thread; tests drive it on virtual time, so pacing, dwells
/// and failsafe outputs are checked exactly, not by sleeping.
///
/// Hot path: channel state lives in fixed arrays indexed by protocol
/// channel (no hashing, no allocation per update or per flush once warm).
struct ServoEngine {
    /// A channel's state as the protocol (and the failsafe) set it.
    typealias ChannelState = ServoPath.ChannelState

    /// What the servo thread should do next.
    enum Action: Equatable {
        /// Write ``batch`` to the chips now.
        case flush
        /// Nothing to write; wake at this instant (a token, a dwell) or when
        /// signalled (nil).
        case wait(until: ContinuousClock.Instant?)
    }

    /// One staged channel: where it goes and what it shows.
    struct Staged {
        var channel: Int
        var chip: Int
        var output: Int
        var value: PCA9685.Output?
        var enabled: Bool
        var receivedAt: ContinuousClock.Instant?
    }

    static let channelSlots = 256

    private(set) var timing: ServoPath.Timing
    /// Protocol channel → state; nil for channels the board does not have.
    private(set) var channels: [ChannelState?]
    private var dirty: [Bool]
    private var receivedAt: [ContinuousClock.Instant?]
    /// ESC channels holding their neutral pulse until this instant.
    private var dwellUntil: [ContinuousClock.Instant?]
    /// ESC channels whose neutral pulse is staged but not yet on the chip:
    /// their dwell starts when a flush puts it there, so a servo thread
    /// that runs late never skips the neutral (an ESC would see its signal
    /// stop without the neutral it brakes on).
    private var dwellAfterFlush: [Bool]
    private(set) var configured: [Int]
    /// Outputs of channels a reload removed or moved: written off once.
    private var retired: [(chip: Int, output: Int)] = []
    /// PCA9685 outputs that SWITCH_VAL holds fully on or off (switches whose
    /// board-file output is a chip pin), with what each should show.
    private var switchOutputs: [(chip: Int, output: Int, on: Bool, dirty: Bool)] = []
    /// The channels taken by the last ``nextAction(at:)`` that said flush.
    private(set) var batch: [Staged] = []
    private(set) var metrics = ServoPath.Metrics()
    /// Allocated here, on the thread that builds the engine, and never again
    /// by the servo thread (``ServoPath/Snapshot/latency`` says why).
    private(set) var latency = LatencyHistogram()
    /// How late each motion step came after its period began (the same
    /// preallocated histogram: recording allocates nothing).
    private(set) var motionLateness = LatencyHistogram()
    private(set) var failsafe: ServoPath.Failsafe?
    private var flushTokens = 0.0
    private var tokensAt: ContinuousClock.Instant?
    var tracker = ApplyTracker()

    // Motion (channels with `speed_us_per_s` / `accel_us_per_s2`): each
    // channel's pulse as last staged, in µs (NaN: not known yet, the first
    // value jumps), its speed in µs/s, and whether it is on its way to its
    // value. Fixed arrays, like the rest: a tick allocates nothing.
    private var position: [Double]
    private var velocity: [Double]
    private var moving: [Bool]
    /// A timed move's speed (µs/s), for the move under way; NaN: none, the
    /// channel's limits apply.
    private var timedSpeed: [Double]
    private var movingCount = 0
    /// When the moving channels take their next step: one step per PWM
    /// period (the chip takes new counts only at the end of its period,
    /// datasheet §7.3.3), nil when nothing moves.
    private var motionTick: ContinuousClock.Instant?
    /// When a still servo with `release_after_ms` lets go (nil: not due).
    private var releaseAt: [ContinuousClock.Instant?]

    init(channels configurations: [ChannelConfiguration], timing: ServoPath.Timing) {
        self.timing = timing
        var table = [ChannelState?](repeating: nil, count: Self.channelSlots)
        for configuration in configurations where (0..<Self.channelSlots).contains(configuration.channel) {
            table[configuration.channel] = Self.initialState(configuration)
        }
        channels = table
        configured = configurations.map(\.channel).filter { (0..<Self.channelSlots).contains($0) }.sorted()
        dirty = Array(repeating: false, count: Self.channelSlots)
        receivedAt = Array(repeating: nil, count: Self.channelSlots)
        dwellUntil = Array(repeating: nil, count: Self.channelSlots)
        dwellAfterFlush = Array(repeating: false, count: Self.channelSlots)
        position = Array(repeating: .nan, count: Self.channelSlots)
        velocity = Array(repeating: 0, count: Self.channelSlots)
        moving = Array(repeating: false, count: Self.channelSlots)
        timedSpeed = Array(repeating: .nan, count: Self.channelSlots)
        releaseAt = Array(repeating: nil, count: Self.channelSlots)
        batch.reserveCapacity(Self.channelSlots)
        // A start position is written at once, like any value.
        for channel in configured where table[channel]?.configuration.start != nil { dirty[channel] = true }
    }

    /// A channel as the board starts it: stopped with no value, or, with
    /// `start_us`, enabled at that pulse (written right after the chip's
    /// all-off), so its first move starts from a known place.
    static func initialState(_ configuration: ChannelConfiguration) -> ChannelState {
        var state = ChannelState(configuration: configuration)
        if let start = configuration.start {
            state.enabled = true
            state.output = .pulse(start)
        }
        return state
    }

    func state(_ channel: Int) -> ChannelState? {
        (0..<Self.channelSlots).contains(channel) ? channels[channel] : nil
    }

    var snapshotChannels: [ChannelState] { configured.compactMap { channels[$0] } }

    // MARK: Events

    /// SERVO_VAL / PWM_VAL; false when the channel is not configured.
    /// `over`: a timed move (servo and ESC channels, from where the pulse is
    /// now): at the speed that takes it there in that time, never faster
    /// than the channel's `speed_us_per_s`; moves given the same time
    /// together finish together.
    mutating func submit(_ command: ServoPath.LastCommand, channel: Int, receivedAt instant: ContinuousClock.Instant?, over: Duration? = nil) -> Bool {
        guard var state = state(channel) else { return false }
        state.lastCommand = command
        state.released = false
        // A latched ESC keeps its failsafe output until re-enabled.
        if !state.latched {
            switch command {
            case .servo(let value): state.output = state.configuration.output(forServoValue: value)
            case .pwm(let value): state.output = state.configuration.output(forPWMValue: value)
            }
        }
        channels[channel] = state
        timedSpeed[channel] = .nan
        if let over, over > .zero, state.configuration.role != .pwm, case .pulse(let width)? = state.output, !position[channel].isNaN {
            let speed = abs(width.value - position[channel]) / over.inSeconds
            timedSpeed[channel] = min(speed, state.configuration.motion.speed ?? .infinity)
        }
        if startsMotion(channel) {
            // The motion's ticks write it; the value counts as submitted now.
            receivedAt[channel] = instant
            metrics.updates += 1
            tracker.submit()
        } else {
            markDirty(channel, receivedAt: instant)
        }
        return true
    }

    /// ANALOG_OUT_EN: a stopped channel outputs nothing but keeps its value.
    /// Enabling also releases an ESC latched by a failsafe.
    mutating func setEnabled(_ enabled: Bool, channel: Int, receivedAt instant: ContinuousClock.Instant?) -> Bool {
        guard var state = state(channel) else { return false }
        state.enabled = enabled
        state.released = false
        if enabled {
            state.latched = false
            clearDwell(channel)
        }
        channels[channel] = state
        // Enabled again with a value away from where the pulse last was:
        // the first write is that place, and the move starts from it.
        if !startsMotion(channel) { stopMotion(channel) }
        markDirty(channel, receivedAt: instant)
        return true
    }

    /// Every channel to its failsafe state (board file, per role): servo
    /// `hold` keeps its pulse, `pulse` goes to the preset, `off` stops; an
    /// ESC goes to its neutral pulse, stops after the dwell and stays
    /// stopped until enabled again; a PWM output goes to duty 0. Returns
    /// false when a failsafe was already engaged (it is one state, not a count).
    mutating func engageFailsafe(reason: String, at now: ContinuousClock.Instant) -> Bool {
        guard failsafe == nil else { return false }
        failsafe = ServoPath.Failsafe(reason: reason, since: now)
        metrics.failsafes += 1
        var changed = false
        for channel in configured {
            guard var state = channels[channel] else { continue }
            let configuration = state.configuration
            // Never slowed: a moving servo holds where it is now (not where
            // it was heading), a preset and an ESC's stop act at once.
            let wasMoving = moving[channel]
            stopMotion(channel)
            switch (configuration.role, configuration.failsafe) {
            case (.servo, .hold):
                guard wasMoving else { continue }
                state.output = .pulse(Microseconds(position[channel]))
            case (.servo, .pulse(let width)):
                state.output = .pulse(width)
                state.released = false
                position[channel] = width.value
            case (.esc, .pulse(let width)):
                state.output = .pulse(width)
                position[channel] = width.value
                state.latched = true
                clearDwell(channel)
                dwellAfterFlush[channel] = true
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
        if !changed { failsafe?.appliedAfter = .zero }
        return true
    }

    /// The failsafe that holds now holds for `reason`; the outputs stay as
    /// it put them. False when none holds, or it held for `reason` already.
    mutating func restateFailsafe(reason: String) -> Bool {
        guard let held = failsafe?.reason, held != reason else { return false }
        failsafe?.reason = reason
        return true
    }

    /// A central is in control again: the failsafe is over. Outputs stay
    /// where the failsafe put them until new values come.
    mutating func clearFailsafe() -> ServoPath.Failsafe? {
        defer { failsafe = nil }
        return failsafe
    }

    /// The chip came back (or started): everything asked for goes out again.
    mutating func markAllDirty() {
        for channel in configured { dirty[channel] = true }
        for index in switchOutputs.indices { switchOutputs[index].dirty = true }
    }

    /// SWITCH_VAL on a switch wired to a chip output: held fully on or off.
    mutating func setSwitch(chip: Int, output: Int, on: Bool) {
        if let index = switchOutputs.firstIndex(where: { $0.chip == chip && $0.output == output }) {
            switchOutputs[index].on = on
            switchOutputs[index].dirty = true
        } else {
            switchOutputs.append((chip, output, on, true))
        }
        tracker.submit()
    }

    // MARK: The servo thread's next step

    /// Ends due dwells, then either takes every dirty channel into
    /// ``batch`` (flush now) or says until when to wait.
    mutating func nextAction(at now: ContinuousClock.Instant) -> Action {
        // The earliest of the three, without an array: this runs at every
        // turn of the servo thread.
        let deadline = Self.earliest(Self.earliest(expireDwells(at: now), advanceMotion(at: now)), expireReleases(at: now))
        guard !retired.isEmpty || configured.contains(where: { dirty[$0] }) || switchOutputs.contains(where: \.dirty) else {
            return .wait(until: deadline)
        }
        // Pace flushes: no more than useful per PWM period.
        if let nextToken = takeFlushToken(at: now) {
            return .wait(until: deadline.map { min($0, nextToken) } ?? nextToken)
        }
        batch.removeAll(keepingCapacity: true)
        for (chip, output) in retired {
            batch.append(Staged(channel: -1, chip: chip, output: output, value: nil, enabled: false, receivedAt: nil))
        }
        retired.removeAll()
        for index in switchOutputs.indices where switchOutputs[index].dirty {
            let item = switchOutputs[index]
            // Full on / full off (§7.3.3): a duty of exactly 1 or 0.
            batch.append(Staged(channel: -2 - index, chip: item.chip, output: item.output, value: .duty(item.on ? 1 : 0), enabled: true, receivedAt: nil))
            switchOutputs[index].dirty = false
        }
        for channel in configured where dirty[channel] {
            guard let state = channels[channel] else { continue }
            let configuration = state.configuration
            var value = state.output
            // A channel that moves (limits, or a timed move under way)
            // shows where its move has got to.
            if !configuration.motion.isUnlimited || moving[channel], case .pulse? = value, !position[channel].isNaN {
                value = .pulse(Microseconds(position[channel]))
            }
            let enabled = state.enabled && !state.released && value != nil
            if enabled, case .pulse(let width)? = value {
                position[channel] = width.value
                if !configuration.motion.isUnlimited { channels[channel]?.currentPulse = width.value }
            }
            // Still at a pulse: its release is due after release_after_ms.
            if let after = configuration.releaseAfter, enabled, !moving[channel], case .pulse? = value {
                releaseAt[channel] = now + after
            } else {
                releaseAt[channel] = nil
            }
            batch.append(Staged(channel: channel, chip: configuration.chip, output: configuration.output, value: value,
                                enabled: enabled, receivedAt: receivedAt[channel]))
            receivedAt[channel] = nil
            dirty[channel] = false
        }
        return .flush
    }

    /// The batch reached the chips at `now` in `transactions` bus writes.
    mutating func flushSucceeded(transactions: Int, at now: ContinuousClock.Instant) {
        metrics.flushes += 1
        metrics.busTransactions += transactions
        for item in batch {
            if item.channel >= 0 && dwellAfterFlush[item.channel] {
                dwellAfterFlush[item.channel] = false
                if let dwell = channels[item.channel]?.configuration.failsafeDwell {
                    dwellUntil[item.channel] = now + dwell
                }
            }
            guard let received = item.receivedAt else { continue }
            let elapsed = received.duration(to: now)
            latency.record(elapsed)
            if elapsed > timing.period { metrics.deadlineMisses += 1 }
        }
        if let engaged = failsafe, engaged.appliedAfter == nil {
            failsafe?.appliedAfter = engaged.since.duration(to: now)
        }
    }

    /// The batch did not reach the chips: keep the values for the next try.
    mutating func flushFailed() {
        metrics.failedFlushes += 1
        for item in batch {
            if item.channel >= 0 {
                dirty[item.channel] = true
            } else if item.channel <= -2 {
                switchOutputs[-2 - item.channel].dirty = true
            } else {
                retired.append((item.chip, item.output))
            }
        }
    }

    mutating func resetMetrics() {
        metrics = ServoPath.Metrics()
        latency.reset()
        motionLateness.reset()
    }

    /// A reloaded board file: channels whose configuration is unchanged keep
    /// their state (enabled, value, latch) and nothing is written for them;
    /// a changed channel starts over stopped, with no value, until a central
    /// sends again; a removed channel's output is switched off. Returns the
    /// channels that changed, were added or removed.
    mutating func reconfigure(channels configurations: [ChannelConfiguration], timing newTiming: ServoPath.Timing) -> [Int] {
        timing = newTiming
        var touched: [Int] = []
        var table = [ChannelState?](repeating: nil, count: Self.channelSlots)
        for configuration in configurations where (0..<Self.channelSlots).contains(configuration.channel) {
            if let old = channels[configuration.channel], old.configuration == configuration {
                table[configuration.channel] = old
            } else {
                // New limits take effect from the channel's next move.
                stopMotion(configuration.channel)
                if let old = channels[configuration.channel], old.configuration.chip != configuration.chip || old.configuration.output != configuration.output {
                    position[configuration.channel] = .nan
                }
                table[configuration.channel] = Self.initialState(configuration)
                releaseAt[configuration.channel] = nil
                touched.append(configuration.channel)
                dirty[configuration.channel] = true
                receivedAt[configuration.channel] = nil
                clearDwell(configuration.channel)
            }
        }
        for channel in configured {
            guard let old = channels[channel] else { continue }
            let kept = table[channel]
            // The old output is no longer this channel's (removed, or moved
            // to another output): switch it off once.
            if kept == nil || kept!.configuration.output != old.configuration.output || kept!.configuration.chip != old.configuration.chip {
                retired.append((old.configuration.chip, old.configuration.output))
                if kept == nil {
                    touched.append(channel)
                    dirty[channel] = false
                    clearDwell(channel)
                    stopMotion(channel)
                    position[channel] = .nan
                }
            }
        }
        channels = table
        configured = configurations.map(\.channel).filter { (0..<Self.channelSlots).contains($0) }.sorted()
        if !touched.isEmpty || !retired.isEmpty { tracker.submit() }
        return touched.sorted()
    }

    // MARK: Internals

    private mutating func markDirty(_ channel: Int, receivedAt instant: ContinuousClock.Instant?) {
        if dirty[channel] { metrics.coalesced += 1 }
        dirty[channel] = true
        receivedAt[channel] = instant
        metrics.updates += 1
        tracker.submit()
    }

    /// Takes a flush token (nil: flush now) or says when the next one is due.
    private mutating func takeFlushToken(at now: ContinuousClock.Instant) -> ContinuousClock.Instant? {
        let capacity = Double(timing.maxFlushesPerPeriod)
        guard capacity > 0 else { return nil }
        let perToken = timing.period / timing.maxFlushesPerPeriod
        let perTokenNanoseconds = Double(perToken.components.seconds) * 1e9 + Double(perToken.components.attoseconds) / 1e9
        if let tokensAt {
            let elapsed = tokensAt.duration(to: now)
            let elapsedNanoseconds = Double(elapsed.components.seconds) * 1e9 + Double(elapsed.components.attoseconds) / 1e9
            flushTokens = min(capacity, flushTokens + elapsedNanoseconds / perTokenNanoseconds)
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

    private mutating func clearDwell(_ channel: Int) {
        dwellUntil[channel] = nil
        dwellAfterFlush[channel] = false
    }

    /// Ends ESC dwells that are due; returns the next dwell deadline, if any.
    private mutating func expireDwells(at now: ContinuousClock.Instant) -> ContinuousClock.Instant? {
        expire(\.dwellUntil, at: now) { engine, channel in
            engine.stopMotion(channel)
            engine.channels[channel]?.enabled = false
            engine.channels[channel]?.output = nil
            engine.markDirty(channel, receivedAt: nil)
        }
    }

    /// Lets go of the still servos whose release is due (their pulses stop
    /// at the next write: the chip ends the period it is in, §7.3.3);
    /// returns the next release due.
    private mutating func expireReleases(at now: ContinuousClock.Instant) -> ContinuousClock.Instant? {
        expire(\.releaseAt, at: now) { engine, channel in
            guard !engine.moving[channel], engine.channels[channel]?.enabled == true else { return }
            engine.channels[channel]?.released = true
            engine.dirty[channel] = true
        }
    }

    /// Runs `due` for each channel whose instant in `deadlines` has come
    /// (clearing it); returns the earliest still to come.
    private mutating func expire(_ deadlines: WritableKeyPath<ServoEngine, [ContinuousClock.Instant?]>, at now: ContinuousClock.Instant,
                                 _ due: (inout ServoEngine, Int) -> Void) -> ContinuousClock.Instant? {
        var next: ContinuousClock.Instant?
        for channel in configured {
            guard let instant = self[keyPath: deadlines][channel] else { continue }
            if instant <= now {
                self[keyPath: deadlines][channel] = nil
                due(&self, channel)
            } else {
                next = Self.earliest(next, instant)
            }
        }
        return next
    }

    /// The earlier of two instants, either of which may be absent.
    private static func earliest(_ a: ContinuousClock.Instant?, _ b: ContinuousClock.Instant?) -> ContinuousClock.Instant? {
        guard let a else { return b }
        guard let b else { return a }
        return min(a, b)
    }

    // MARK: Motion

    /// Whether `channel` now moves to its value along a profile (its
    /// limits, a known position, enabled, a pulse away from it), and starts
    /// it if so. Without limits, or with no known position (the first value
    /// after start, a reload that moved the channel), the value is written
    /// at once.
    private mutating func startsMotion(_ channel: Int) -> Bool {
        guard let state = channels[channel], !state.configuration.motion.isUnlimited || !timedSpeed[channel].isNaN, state.enabled, !state.latched,
              case .pulse(let width)? = state.output, !position[channel].isNaN else { return false }
        if width.value == position[channel] {
            stopMotion(channel)
            return false
        }
        if !moving[channel] {
            moving[channel] = true
            movingCount += 1
            channels[channel]?.moving = true
        }
        return true
    }

    private mutating func stopMotion(_ channel: Int) {
        velocity[channel] = 0
        timedSpeed[channel] = .nan
        if moving[channel] {
            moving[channel] = false
            movingCount -= 1
            channels[channel]?.moving = false
        }
        if movingCount == 0 { motionTick = nil }
    }

    /// Steps every moving channel once per PWM period that has begun since
    /// the last step (several when the thread was late, so the moves keep
    /// to the clock); returns when the next step is due.
    private mutating func advanceMotion(at now: ContinuousClock.Instant) -> ContinuousClock.Instant? {
        guard movingCount > 0 else { return nil }
        let tick = motionTick ?? now
        guard now >= tick else { return tick }
        let period = timing.period
        let steps = min(1 + Int(((now - tick) / period).rounded(.down)), 50)
        metrics.motionPeriods += steps
        metrics.motionPeriodsMissed += steps - 1
        motionLateness.record(now - tick - period * (steps - 1))
        let dt = period.inSeconds
        for channel in configured where moving[channel] {
            for _ in 0..<steps where moving[channel] { step(channel, dt: dt) }
            dirty[channel] = true
        }
        motionTick = movingCount > 0 ? tick + period * steps : nil
        return motionTick
    }

    /// One step of `dt` seconds towards the channel's value: at most its
    /// speed, its speed changed by at most its acceleration, and slowing
    /// in time to stop at the value. The speed it can still stop from is
    /// the discrete one: slowing by a·dt a step from k·a·dt covers
    /// a·dt²·k(k+1)/2, so k = (√(1 + 8d/(a·dt²)) − 1)/2 (the continuous
    /// √(2·a·d) would crawl to the value over several extra periods).
    /// Arriving ends the move.
    private mutating func step(_ channel: Int, dt: Double) {
        guard let state = channels[channel], case .pulse(let width)? = state.output else { return stopMotion(channel) }
        let limits = state.configuration.motion
        let target = width.value, here = position[channel]
        let distance = target - here
        guard distance != 0 else { return stopMotion(channel) }
        let direction: Double = distance > 0 ? 1 : -1
        // A timed move goes at its own steady speed, so it ends on time.
        let timed = !timedSpeed[channel].isNaN
        let top = timed ? timedSpeed[channel] : limits.speed ?? .infinity
        var speed: Double
        if !timed, let acceleration = limits.acceleration {
            let perStep = acceleration * dt
            let stoppable = perStep * (((1 + 8 * abs(distance) / (perStep * dt)).squareRoot() - 1) / 2)
            let wanted = direction * min(top, stoppable)
            let change = acceleration * dt
            speed = velocity[channel] + min(max(wanted - velocity[channel], -change), change)
        } else {
            speed = direction * top
        }
        var next = here + speed * dt
        // Arrived, or within a rounding error of it: a timed move's steps
        // (distance ÷ periods) added up in floating point can fall short by
        // a billionth of a µs, which would cost one more period and finish
        // one joint of a gait a period after the others.
        if (target - next) * direction <= 1e-6 {
            next = target
            speed = 0
        }
        position[channel] = next
        velocity[channel] = speed
        if next == target { stopMotion(channel) }
    }
}
