import BLEControlProtocol
import Board
import Devices
import Hardware
import Control
import TestSupport
import Testing
@testable import Firmware
@testable import Runtime

/// Channels with motion limits, on virtual time: the servo engine steps a
/// move once per PWM period along its profile, and the failsafe is never
/// slowed by it (issue 38).
@Suite("Motion: speed and acceleration limits, on virtual time")
struct MotionTests {
    static let period = Duration.milliseconds(20)

    static func channel(_ number: Int, role: ChannelRole = .servo, failsafe: FailsafeAction = .hold, speed: Double? = nil,
                        acceleration: Double? = nil) -> ChannelConfiguration {
        ChannelConfiguration(channel: number, output: number, role: role, minimum: Microseconds(1000), center: Microseconds(1500),
                             maximum: Microseconds(2000), failsafe: failsafe, failsafeDwell: .milliseconds(0),
                             motion: MotionLimits(speed: speed, acceleration: acceleration))
    }

    /// The engine with `channels`, each enabled and at `start` (its first
    /// value, which jumps), at `t0`.
    static func engine(_ channels: [ChannelConfiguration], start: UInt16 = 500, at t0: ContinuousClock.Instant) -> ServoEngine {
        var timing = ServoPath.Timing()
        timing.maxFlushesPerPeriod = 0
        var engine = ServoEngine(channels: channels, timing: timing)
        for configuration in channels {
            _ = engine.setEnabled(true, channel: configuration.channel, receivedAt: t0)
            _ = engine.submit(.servo(start), channel: configuration.channel, receivedAt: t0)
        }
        let first = engine.nextAction(at: t0)
        #expect(first == .flush)
        engine.flushSucceeded(transactions: 1, at: t0)
        return engine
    }

    /// Runs the servo thread's loop on virtual time from `from` until
    /// nothing is due: the pulse written per channel at each flush.
    static func run(_ engine: inout ServoEngine, from: ContinuousClock.Instant, limit: Int = 500) -> [(at: ContinuousClock.Instant, pulses: [Int: Double])] {
        var now = from
        var writes: [(ContinuousClock.Instant, [Int: Double])] = []
        for _ in 0..<limit {
            switch engine.nextAction(at: now) {
            case .flush:
                var pulses: [Int: Double] = [:]
                for item in engine.batch where item.enabled {
                    if case .pulse(let width)? = item.value { pulses[item.channel] = width.value }
                }
                writes.append((now, pulses))
                engine.flushSucceeded(transactions: 1, at: now)
            case .wait(let until):
                guard let until else { return writes }
                now = until
            }
        }
        Issue.record("the move did not end within \(limit) steps")
        return writes
    }

    @Test("Speed only: one step of speed × period per PWM period, on the ideal line, ending exactly at the value")
    func speedOnly() {
        let t0 = ContinuousClock.now
        var engine = Self.engine([Self.channel(0, speed: 1000)], at: t0)
        let t1 = t0 + .seconds(1)
        _ = engine.submit(.servo(1000), channel: 0, receivedAt: t1)
        #expect(engine.state(0)?.moving == true)
        let writes = Self.run(&engine, from: t1)
        #expect(engine.state(0)?.moving == false && engine.state(0)?.currentPulse == 2000, "status: at rest at its value")
        #expect(writes.count == 25, "500 µs at 20 µs a period: \(writes.map { $0.pulses[0] ?? 0 })")
        for (index, write) in writes.enumerated() {
            #expect(write.at == t1 + Self.period * index, "step \(index) one period after the last")
            #expect(abs((write.pulses[0] ?? 0) - (1500 + 20 * Double(index + 1))) < 1e-6, "step \(index)")
        }
        #expect(writes.last?.pulses[0] == 2000)
    }

    @Test("The motion counters: a step per period on time is none missed and none late; a wake 2.5 periods late missed two, 10 ms late")
    func motionCounters() {
        let t0 = ContinuousClock.now
        var engine = Self.engine([Self.channel(0, speed: 1000)], at: t0)
        engine.resetMetrics()
        let t1 = t0 + .seconds(1)
        _ = engine.submit(.servo(1000), channel: 0, receivedAt: t1)
        let writes = Self.run(&engine, from: t1)
        #expect(engine.metrics.motionPeriods == writes.count && engine.metrics.motionPeriodsMissed == 0)
        #expect(engine.motionLateness.summary.maximum == 0, "every step at its instant")

        // Back down, the thread asleep for 2.5 periods after the first step.
        engine.resetMetrics()
        let t2 = t1 + .seconds(2)
        _ = engine.submit(.servo(500), channel: 0, receivedAt: t2)
        #expect(engine.nextAction(at: t2) == .flush)
        engine.flushSucceeded(transactions: 1, at: t2)
        let late = t2 + Self.period * 3 + .milliseconds(10)
        _ = Self.run(&engine, from: late)
        #expect(engine.metrics.motionPeriodsMissed == 2, "\(engine.metrics)")
        #expect(engine.motionLateness.summary.maximum == 10_000, "\(engine.motionLateness.summary)")
    }

    @Test("Speed and acceleration: a trapezoid within both limits, at rest at the value, in the ideal time ± one period")
    func speedAndAcceleration() {
        let (speed, acceleration) = (1000.0, 5000.0)
        let t0 = ContinuousClock.now
        var engine = Self.engine([Self.channel(1, speed: speed, acceleration: acceleration)], at: t0)
        _ = engine.submit(.servo(1000), channel: 1, receivedAt: t0)
        let pulses = [1500.0] + Self.run(&engine, from: t0).compactMap { $0.pulses[1] }
        let dt = 0.02
        var lastSpeed = 0.0
        for index in 1..<pulses.count {
            let stepSpeed = (pulses[index] - pulses[index - 1]) / dt
            #expect(stepSpeed >= 0 && stepSpeed <= speed + 1e-6, "step \(index): \(stepSpeed) µs/s")
            // The last step may land short of a whole step: it stops there.
            if index < pulses.count - 1 {
                #expect(abs(stepSpeed - lastSpeed) <= acceleration * dt + 1e-6, "step \(index): speed \(lastSpeed) → \(stepSpeed)")
            }
            lastSpeed = stepSpeed
        }
        #expect(pulses.last == 2000)
        // The ideal trapezoid: d/v + v/a = 0.5 + 0.2 s = 35 periods.
        #expect(abs(pulses.count - 1 - 35) <= 1, "\(pulses.count - 1) periods")
    }

    @Test("The failsafe is never slowed: hold stops where the servo is now, a preset goes straight there, an ESC stops at once")
    func failsafeMidMove() {
        let t0 = ContinuousClock.now
        var engine = Self.engine([Self.channel(0, speed: 1000), Self.channel(3, failsafe: .pulse(Microseconds(1500)), speed: 1000),
                                  Self.channel(4, role: .esc, failsafe: .off, speed: 1000)], at: t0)
        for channel in [0, 3, 4] { _ = engine.submit(.servo(1000), channel: channel, receivedAt: t0) }
        // Ten periods into the moves: 1700 µs each.
        var now = t0
        for _ in 0..<10 {
            let action = engine.nextAction(at: now)
            #expect(action == .flush)
            engine.flushSucceeded(transactions: 1, at: now)
            now = now + Self.period
        }
        let engaged = engine.engageFailsafe(reason: "test", at: now)
        #expect(engaged)
        let action = engine.nextAction(at: now)
        #expect(action == .flush)
        let batch = Dictionary(uniqueKeysWithValues: engine.batch.map { ($0.channel, $0) })
        engine.flushSucceeded(transactions: 1, at: now)
        #expect(batch[0]?.value == .pulse(Microseconds(1700)) && batch[0]?.enabled == true, "held where it was, not at 2000")
        #expect(batch[3]?.value == .pulse(Microseconds(1500)), "the preset at once, not ramped")
        #expect(batch[4]?.enabled == false, "the ESC stopped at once")
        let later = engine.nextAction(at: now + .seconds(5))
        #expect(later == .wait(until: nil), "nothing moves after a failsafe")
    }

    @Test("Without limits, and for the first value after start, a value is written at once")
    func unlimitedAndFirstValue() {
        let t0 = ContinuousClock.now
        var timing = ServoPath.Timing()
        timing.maxFlushesPerPeriod = 0
        var engine = ServoEngine(channels: [Self.channel(0), Self.channel(1, speed: 100)], timing: timing)
        for channel in [0, 1] {
            _ = engine.setEnabled(true, channel: channel, receivedAt: t0)
            _ = engine.submit(.servo(1000), channel: channel, receivedAt: t0)
        }
        let writes = Self.run(&engine, from: t0)
        #expect(writes.count == 1)
        #expect(writes.first?.pulses == [0: 2000, 1: 2000], "nothing known of where it was: no ramp from a guess")
        _ = engine.submit(.servo(0), channel: 0, receivedAt: t0 + .seconds(1))
        let again = Self.run(&engine, from: t0 + .seconds(1)).map(\.pulses)
        #expect(again == [[0: 1000]])
    }

    @Test("A move turned around midway slows down within its acceleration, then comes back")
    func reversal() {
        let t0 = ContinuousClock.now
        var engine = Self.engine([Self.channel(0, speed: 2000, acceleration: 4000)], at: t0)
        _ = engine.submit(.servo(1000), channel: 0, receivedAt: t0)
        var now = t0
        var pulses: [Double] = [1500]
        for _ in 0..<15 {
            _ = engine.nextAction(at: now)
            pulses.append(engine.batch.first?.value.flatMap { if case .pulse(let w) = $0 { w.value } else { nil } } ?? .nan)
            engine.flushSucceeded(transactions: 1, at: now)
            now = now + Self.period
        }
        _ = engine.submit(.servo(0), channel: 0, receivedAt: now)
        pulses += Self.run(&engine, from: now).compactMap { $0.pulses[0] }
        #expect(pulses.last == 1000)
        for index in 2..<pulses.count - 1 {
            let change = abs((pulses[index] - pulses[index - 1]) - (pulses[index - 1] - pulses[index - 2])) / 0.02 / 0.02
            #expect(change <= 4000 + 1e-3, "step \(index): acceleration \(change) µs/s²")
        }
    }
}

@Suite("Timed moves, on virtual time")
struct TimedMoveTests {
    @Test("Moves given one time finish together, on the same period, each at its own steady speed; a channel's speed limit still holds")
    func finishTogether() {
        let t0 = ContinuousClock.now
        var engine = MotionTests.engine([MotionTests.channel(0), MotionTests.channel(1), MotionTests.channel(2, speed: 100)], at: t0)
        let t1 = t0 + .seconds(1)
        // 500 µs, 200 µs and 500 µs in one second; channel 2 may go at 100 µs/s only.
        _ = engine.submit(.servo(1000), channel: 0, receivedAt: t1, over: .seconds(1))
        _ = engine.submit(.servo(300), channel: 1, receivedAt: t1, over: .seconds(1))
        _ = engine.submit(.servo(1000), channel: 2, receivedAt: t1, over: .seconds(1))
        let writes = MotionTests.run(&engine, from: t1, limit: 1000)
        func arrival(_ channel: Int, _ target: Double) -> Int? { writes.firstIndex { $0.pulses[channel] == target } }
        #expect(arrival(0, 2000) == 49 && arrival(1, 1300) == 49, "both on the 50th period: \(String(describing: arrival(0, 2000))), \(String(describing: arrival(1, 1300)))")
        #expect(writes[0].pulses[0] == 1510 && writes[0].pulses[1] == 1496, "10 µs a period up, 4 down")
        #expect(writes[0].pulses[2] == 1502 && arrival(2, 2000) == 249, "the speed limit wins: 2 µs a period, 250 periods")
    }

    @Test("A hexapod's gait step: 18 channels on two chips, each with board/hexapod.yaml's limits, given one time, all arrive on the same period, every period writing all 18")
    func hexapodGait() {
        let t0 = ContinuousClock.now
        let legs = (0..<18).map { number in
            ChannelConfiguration(channel: number, output: number % 9, role: .servo, minimum: Microseconds(900), center: Microseconds(1500),
                                 maximum: Microseconds(2100), failsafe: .hold, failsafeDwell: .milliseconds(0), chip: number / 9,
                                 motion: MotionLimits(speed: 1200, acceleration: 12000))
        }
        var engine = MotionTests.engine(legs, at: t0)
        let t1 = t0 + .seconds(1)
        // Each joint its own distance (0 to 340 µs), one second for all: a timed move goes at its steady speed.
        for leg in legs {
            _ = engine.submit(.servo(UInt16(500 + (leg.channel % 6) * 40 - (leg.channel / 6) * 40)), channel: leg.channel, receivedAt: t1, over: .seconds(1))
        }
        let writes = MotionTests.run(&engine, from: t1, limit: 1000)
        let moving = legs.filter { abs((engine.state($0.channel)?.currentPulse ?? 0) - 1500) > 0.5 }.map(\.channel)
        let arrivals = moving.map { channel in writes.lastIndex { $0.pulses[channel] != nil } }
        #expect(!moving.isEmpty && Set(arrivals).count == 1, "every moving joint's last step on one period: \(arrivals)")
        #expect(arrivals.first == 49, "the 50th period, one second: \(String(describing: arrivals.first))")
        #expect(writes.dropLast().allSatisfy { write in moving.allSatisfy { write.pulses[$0] != nil } }, "each period wrote every moving joint")
        #expect(writes.allSatisfy { $0.at >= t1 } && zip(writes, writes.dropFirst()).allSatisfy { $1.at - $0.at == MotionTests.period },
                "one write a period, each a period after the last")
    }

    @Test("A timed move on a channel without limits, from a known pulse; the first value still jumps")
    func timedFromKnownPulse() {
        let t0 = ContinuousClock.now
        var timing = ServoPath.Timing()
        timing.maxFlushesPerPeriod = 0
        var engine = ServoEngine(channels: [MotionTests.channel(0)], timing: timing)
        _ = engine.setEnabled(true, channel: 0, receivedAt: t0)
        _ = engine.submit(.servo(0), channel: 0, receivedAt: t0, over: .seconds(1))
        #expect(MotionTests.run(&engine, from: t0).map(\.pulses) == [[0: 1000]], "nothing known of where it was: it jumps")
        _ = engine.submit(.servo(100), channel: 0, receivedAt: t0 + .seconds(1), over: .milliseconds(100))
        let steps = MotionTests.run(&engine, from: t0 + .seconds(1)).compactMap { $0.pulses[0] }
        #expect(steps == [1020, 1040, 1060, 1080, 1100], "\(steps)")
        _ = engine.submit(.servo(200), channel: 0, receivedAt: t0 + .seconds(2))
        #expect(MotionTests.run(&engine, from: t0 + .seconds(2)).map(\.pulses) == [[0: 1200]], "untimed again: at once")
    }
}

@Suite("Start position and release, on virtual time")
struct StartAndReleaseTests {
    static func channel(_ number: Int, start: Double? = nil, release: Duration? = nil, speed: Double? = nil) -> ChannelConfiguration {
        ChannelConfiguration(channel: number, output: number, role: .servo, minimum: Microseconds(1000), center: Microseconds(1500),
                             maximum: Microseconds(2000), failsafe: .hold, motion: MotionLimits(speed: speed),
                             start: start.map(Microseconds.init), releaseAfter: release)
    }

    @Test("start_us: the channel pulses from start-up, so its first move is a ramp from there, not a jump")
    func startPosition() {
        var timing = ServoPath.Timing()
        timing.maxFlushesPerPeriod = 0
        var engine = ServoEngine(channels: [Self.channel(0, start: 1200, speed: 1000), Self.channel(1)], timing: timing)
        let t0 = ContinuousClock.now
        let first = MotionTests.run(&engine, from: t0)
        #expect(first.map(\.pulses) == [[0: 1200]], "only the channel with start_us pulses at start")
        #expect(engine.state(0)?.enabled == true)
        _ = engine.submit(.servo(500), channel: 0, receivedAt: t0 + .seconds(1))
        let ramp = MotionTests.run(&engine, from: t0 + .seconds(1)).compactMap { $0.pulses[0] }
        #expect(ramp.count == 15 && ramp.first == 1220 && ramp.last == 1500, "300 µs at 20 µs a period: \(ramp)")
    }

    @Test("release_after_ms: a still servo's pulses stop after exactly that long; the next command resumes from where it was")
    func release() {
        var timing = ServoPath.Timing()
        timing.maxFlushesPerPeriod = 0
        var engine = ServoEngine(channels: [Self.channel(0, release: .milliseconds(500), speed: 1000)], timing: timing)
        let t0 = ContinuousClock.now
        _ = engine.setEnabled(true, channel: 0, receivedAt: t0)
        _ = engine.submit(.servo(700), channel: 0, receivedAt: t0)
        let held = engine.nextAction(at: t0)
        #expect(held == .flush)
        engine.flushSucceeded(transactions: 1, at: t0)
        let waiting = engine.nextAction(at: t0 + .milliseconds(499))
        #expect(waiting == .wait(until: t0 + .milliseconds(500)), "the release is due 500 ms after the last write")
        let letGo = engine.nextAction(at: t0 + .milliseconds(500))
        #expect(letGo == .flush)
        #expect(engine.batch.first?.enabled == false, "no pulses once released")
        engine.flushSucceeded(transactions: 1, at: t0 + .milliseconds(500))
        #expect(engine.state(0)?.released == true)
        // The next command starts from 1700 µs, where it let go: a ramp.
        _ = engine.submit(.servo(800), channel: 0, receivedAt: t0 + .seconds(2))
        #expect(engine.state(0)?.released == false)
        let resumed = MotionTests.run(&engine, from: t0 + .seconds(2))
        let ramp = resumed.compactMap { $0.pulses[0] }
        #expect(ramp.first == 1720 && ramp.last == 1800, "\(ramp)")
        // Still again: released again after 500 ms (the run above ends with it).
        #expect(resumed.last?.pulses.isEmpty == true && engine.state(0)?.released == true)
    }
}

@Suite("Motion on the running board: the servo thread steps a move on the emulated chip")
struct RunningMotionTests {
    @Test("A channel with speed_us_per_s 200 reaches its value through intermediate pulses, each higher than the last")
    func rampOnTheChip() throws {
        let board = try RunningBoard(yaml: testBoard().replacingOccurrences(
            of: "- { channel: 0, output: 0, role: servo, min_us: 1000, max_us: 2000 }",
            with: "- { channel: 0, output: 0, role: servo, min_us: 1000, max_us: 2000, speed_us_per_s: 200 }"))
        let central = try LoopbackTCPClient(port: board.port)
        try central.send(FrameEncoder.encode(.enable(channel: 0, on: true)) + FrameEncoder.encode(.servo(channel: 0, value: 0)))
        #expect(eventually { abs(board.pulse(0) - 1000) < 5 }, "the first value jumps")
        try central.send(FrameEncoder.encode(.servo(channel: 0, value: 1000)))
        // 1000 µs at 200 µs/s: five seconds, 250 periods of 4 µs. The
        // servo thread is real-time, so how many steps it writes is the
        // machine's (a late thread takes several periods in one write;
        // qemu-user beside two guests once wrote a 0.6 s move in one step):
        // a few under way is the outcome, and only a stall of the whole five
        // seconds would hide it. The steps' sizes are MotionTests' (an
        // injected clock).
        let under = { board.chip.history(channel: 0).map(\.pulseWidth.value).filter { $0 > 1005 && $0 < 1995 } }
        #expect(eventually { under().count >= 3 }, "intermediate pulses: \(under())")
        #expect(eventually { abs(board.pulse(0) - 2000) < 5 }, "the move ends at its value")
        let widths = board.chip.history(channel: 0).map(\.pulseWidth.value).filter { $0 > 1005 }
        #expect(zip(widths, widths.dropFirst()).allSatisfy { $0 < $1 }, "each step higher: \(widths)")
        _ = central
    }

    @Test("A timed move through the control socket (over_ms): the chip puts out its steps, each higher than the last")
    func timedMoveThroughTheControlSocket() throws {
        let board = try RunningBoard(yaml: testBoard())
        let client = try ControlClient(path: board.socket, timeout: Patience.time)
        _ = try client.send(FrameEncoder.encode(.enable(channel: 1, on: true)) + FrameEncoder.encode(.servo(channel: 1, value: 0)))
        #expect(eventually { abs(board.pulse(1) - 1000) < 5 })
        // Two minutes: under way when a poll looks, however late the
        // machine lets the servo thread run (see rampOnTheChip); a plain
        // command then ends it at its value.
        _ = try client.send(FrameEncoder.encode(.servo(channel: 1, value: 1000)), over: .seconds(120))
        #expect(eventually { (1005.0..<1995.0).contains(board.pulse(1)) }, "a move in steps, not a jump: \(board.pulse(1))")
        _ = try client.send(FrameEncoder.encode(.servo(channel: 1, value: 1000)))
        #expect(eventually { abs(board.pulse(1) - 2000) < 5 })
        let widths = board.chip.history(channel: 1).map(\.pulseWidth.value).filter { $0 > 1005 }
        #expect(widths.count >= 2, "a move in steps, not a jump: \(widths)")
        #expect(zip(widths, widths.dropFirst()).allSatisfy { $0 < $1 }, "\(widths)")
    }
}
