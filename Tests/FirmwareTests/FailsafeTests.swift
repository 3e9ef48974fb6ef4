import BLEControlProtocol
import DeviceEmulators
import Devices
import Foundation
import Hardware
import Logging
import TestSupport
import Testing
@testable import Firmware
@testable import Runtime
import Board
import Control
import Reactor

/// The simulator board with an ESC on channel 4 (board/rc-car.yaml's
/// failsafe), for the tests of every channel role.
let escBoard = EmbeddedBoards.simulator.replacingOccurrences(
    of: "- { channel: 4, output: 4, role: pwm }",
    with: "- { channel: 4, output: 4, role: esc, min_us: 1000, max_us: 2000, failsafe: pulse, failsafe_us: 1000, failsafe_dwell_ms: 500 }")

/// The ESC board with the failsafe knobs turned for tests. The fault and
/// stall timeouts are the longest a board file takes unless a test is
/// about them: a loaded machine may hold the servo thread in a write for a
/// while, which is no stall for a test of something else.
func testBoard(silenceMs: Int = 0, dwellMs: Int = 150, faultMs: Int = 60_000, stallMs: Int = 60_000) -> String {
    escBoard
        .replacingOccurrences(of: "failsafe_dwell_ms: 500", with: "failsafe_dwell_ms: \(dwellMs)")
        .replacingOccurrences(of: "silence_timeout_ms: 0 ", with: "silence_timeout_ms: \(silenceMs) ")
        .replacingOccurrences(of: "stall_timeout_ms: 500 ", with: "stall_timeout_ms: \(stallMs) ")
        .replacingOccurrences(of: "fault_timeout_ms: 1000 ", with: "fault_timeout_ms: \(faultMs) ")
}

/// A private directory for a test's control socket and instance lock.
func scratchDirectory(_ prefix: String) -> String {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID().uuidString.prefix(8))").path
    try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

/// A whole board in-process: transports on a free port, emulated chips to
/// read the outputs from.
final class RunningBoard {
    let runtime: BoardRuntime
    let chip: PCA9685Emulator
    let bus: EmulatedI2CBus
    let port: UInt16
    let socket: String

    init(yaml: String) throws {
        var logger = Logger(label: "failsafe-test")
        logger.logLevel = .critical
        socket = scratchDirectory("blecontrol-test") + "/control.sock"
        runtime = try BoardRuntime(configuration: try BoardFile.parse(yaml, path: "test.yaml"), logger: logger, controlSocketPath: socket)
        try runtime.start(tcpOverride: ("127.0.0.1", 0))
        chip = try #require(runtime.emulators?.pca9685.first)
        bus = try #require(runtime.emulators?.buses["main"])
        port = try #require(runtime.tcpPort)
    }

    deinit { runtime.stop() }

    func pulse(_ output: Int) -> Double { chip.output(channel: output).pulseWidth.value }
    /// `output`'s pulse widths in the chip's history, in µs, oldest first.
    func pulses(_ output: Int) -> [Int] { chip.history(channel: output).map { Int($0.pulseWidth.value.rounded()) } }
    /// Whether `output`'s last outputs were `expected` (µs, within 5; 0 is
    /// none), in order: an ESC's throttle, its neutral pulse, then none,
    /// however briefly a loaded machine let a poll see the neutral pulse.
    func ended(_ output: Int, with expected: [Int]) -> Bool {
        let last = pulses(output).suffix(expected.count)
        return last.count == expected.count && zip(last, expected).allSatisfy { $1 == 0 ? $0 == 0 : abs($0 - $1) < 5 }
    }
    func duty(_ output: Int) -> Double { chip.output(channel: output).duty }
    func servo() throws -> StatusReport.Servo { try #require(try runtime.status().servo) }

    /// A TCP central that enabled `channel` and sent it to full travel
    /// (2000 µs), once the chip puts that out: a commander.
    func commander(of channel: UInt8) throws -> LoopbackTCPClient {
        let central = try LoopbackTCPClient(port: port)
        try central.send(FrameEncoder.encode(.enable(channel: channel, on: true)) + FrameEncoder.encode(.servo(channel: channel, value: 1000)))
        #expect(eventually { abs(pulse(Int(channel)) - 2000) < 5 }, "channel \(channel) at 2000 µs")
        return central
    }

    /// Waits until the board has dispatched `frames` frames in all, then
    /// until everything dispatched has reached the servo chips (a
    /// control-socket send is answered only then; the display only when the
    /// send itself wrote to it, which this INIT does not). What is asserted after this has happened:
    /// no sleeping and hoping.
    func settle(frames: Int) throws {
        #expect(eventually { ((try? self.runtime.status().counters.frames) ?? 0) >= frames }, "the board never saw \(frames) frames")
        let client = try ControlClient(path: socket, timeout: Patience.time)
        _ = try client.send(FrameEncoder.encode(.initialize))
    }

    /// A central that enabled channels 0, 3, 4 and 6 and gave them values,
    /// once the chip has put out every one of them. Seen in the chip's
    /// history, not its present outputs: on a board with a short silence
    /// timeout the failsafe may take them over before a busy machine lets
    /// the test look.
    func drivingCentral() throws -> LoopbackTCPClient {
        let central = try LoopbackTCPClient(port: port)
        var frames: [UInt8] = []
        for (channel, value) in [(UInt8(0), UInt16(700)), (3, 800), (4, 600), (6, 0)] {
            FrameEncoder.encode(.enable(channel: channel, on: true), into: &frames)
            FrameEncoder.encode(channel == 6 ? .pwm(channel: 6, value: 500) : .servo(channel: channel, value: value), into: &frames)
        }
        try central.send(frames)
        func reached(_ output: Int, _ matches: (PCA9685Emulator.ChannelOutput) -> Bool) -> Bool { chip.history(channel: output).contains(where: matches) }
        #expect(eventually {
            reached(0) { abs($0.pulseWidth.value - 1700) < 5 } && reached(3) { abs($0.pulseWidth.value - 1800) < 5 }
                && reached(4) { abs($0.pulseWidth.value - 1600) < 5 } && reached(6) { abs($0.duty - 0.5) < 0.001 }
        })
        return central
    }
}


/// Channel configurations like the simulator board's, for engine tests.
private func simulatorChannels(dwellMs: Int = 150) throws -> [ChannelConfiguration] {
    try #require(try BoardFile.parse(testBoard(dwellMs: dwellMs), path: "t.yaml").servo?.channels)
}

@Suite("The failsafe engine and pacing, on virtual time")
struct ServoEngineTests {
    private func flush(_ engine: inout ServoEngine, at now: ContinuousClock.Instant) -> [ServoEngine.Staged] {
        guard engine.nextAction(at: now) == .flush else { return [] }
        let batch = engine.batch
        engine.flushSucceeded(transactions: 1, at: now)
        return batch
    }

    @Test("Failsafe per role: servo holds, preset servo moves, ESC neutral then off after exactly its dwell, PWM duty 0")
    func roles() throws {
        var engine = ServoEngine(channels: try simulatorChannels(dwellMs: 150), timing: ServoPath.Timing())
        let t0 = ContinuousClock.now
        for (channel, value) in [(0, UInt16(700)), (3, 800), (4, 600)] {
            _ = engine.setEnabled(true, channel: channel, receivedAt: t0)
            _ = engine.submit(.servo(value), channel: channel, receivedAt: t0)
        }
        _ = engine.setEnabled(true, channel: 6, receivedAt: t0)
        _ = engine.submit(.pwm(500), channel: 6, receivedAt: t0)
        _ = flush(&engine, at: t0)

        let t1 = t0 + .seconds(1)
        let result1 = engine.engageFailsafe(reason: "test", at: t1)
        #expect(result1)
        let again = engine.engageFailsafe(reason: "again", at: t1)
        #expect(!again, "one failsafe state, not a count")
        let batch = flush(&engine, at: t1)
        let byChannel = Dictionary(uniqueKeysWithValues: batch.map { ($0.channel, $0) })
        #expect(byChannel[0] == nil, "a holding servo is not even written")
        #expect(byChannel[3]?.value == .pulse(Microseconds(1500)) && byChannel[3]?.enabled == true)
        #expect(byChannel[4]?.value == .pulse(Microseconds(1000)) && byChannel[4]?.enabled == true)
        #expect(byChannel[6]?.value == .duty(0))
        #expect(engine.failsafe?.appliedAfter == .zero)

        // The ESC dwell ends at t1 + 150 ms, not a moment earlier.
        let result2 = engine.nextAction(at: t1 + .milliseconds(149))
        #expect(result2 == .wait(until: t1 + .milliseconds(150)))
        let after = flush(&engine, at: t1 + .milliseconds(150))
        #expect(after.map(\.channel) == [4])
        #expect(after.first?.enabled == false)
    }

    @Test("A servo thread that runs late still writes the ESC's neutral: the dwell counts from the write that put it on the chip")
    func lateThreadKeepsNeutral() throws {
        var engine = ServoEngine(channels: try simulatorChannels(dwellMs: 150), timing: ServoPath.Timing())
        let t0 = ContinuousClock.now
        _ = engine.setEnabled(true, channel: 4, receivedAt: t0)
        _ = engine.submit(.servo(600), channel: 4, receivedAt: t0)
        _ = flush(&engine, at: t0)
        let t1 = t0 + .seconds(1)
        _ = engine.engageFailsafe(reason: "test", at: t1)
        // The thread's next turn comes 640 ms late (a busy machine): past the dwell.
        let late = t1 + .milliseconds(640)
        let neutral = flush(&engine, at: late)
        #expect(neutral.first { $0.channel == 4 }?.value == .pulse(Microseconds(1000)), "neutral first, not off: \(neutral)")
        #expect(neutral.first { $0.channel == 4 }?.enabled == true)
        let waiting = engine.nextAction(at: late + .milliseconds(149))
        #expect(waiting == .wait(until: late + .milliseconds(150)))
        let off = flush(&engine, at: late + .milliseconds(150))
        #expect(off.map(\.channel) == [4] && off.first?.enabled == false)
    }

    @Test("servo.output_enable: OE let through once every output is off at start, taken away at stop after the all-off")
    func outputEnableLine() throws {
        let board = try RunningBoard(yaml: testBoard().replacingOccurrences(
            of: "  max_flushes_per_period: 4", with: "  output_enable: { emulated: true }\n  max_flushes_per_period: 4"))
        let line = try #require(board.runtime.emulators?.outputEnable)
        #expect(eventually { line.isActive })
        #expect((0..<16).allSatisfy { board.duty($0) == 0 })
        let central = try board.drivingCentral()
        #expect(board.pulse(0) > 0)
        board.runtime.stop()
        _ = central
        #expect(!line.isActive)
        #expect((0..<16).allSatisfy { board.duty($0) == 0 })
    }

    @Test("A latched ESC ignores values until ANALOG_OUT_EN on, and then waits for a new value")
    func escLatch() throws {
        var engine = ServoEngine(channels: try simulatorChannels(dwellMs: 0), timing: ServoPath.Timing())
        let t0 = ContinuousClock.now
        _ = engine.setEnabled(true, channel: 4, receivedAt: t0)
        _ = engine.submit(.servo(600), channel: 4, receivedAt: t0)
        _ = engine.engageFailsafe(reason: "test", at: t0)
        _ = flush(&engine, at: t0)
        _ = flush(&engine, at: t0 + .milliseconds(1))  // dwell 0: off
        #expect(engine.state(4)?.latched == true)
        _ = engine.submit(.servo(900), channel: 4, receivedAt: t0 + .seconds(1))
        let ignored = flush(&engine, at: t0 + .seconds(1))
        #expect(ignored.first?.enabled == false, "a value alone does not restart a latched ESC")
        _ = engine.setEnabled(true, channel: 4, receivedAt: t0 + .seconds(2))
        let enabled = flush(&engine, at: t0 + .seconds(2))
        #expect(enabled.first?.enabled == false, "enabling does not resume the pre-failsafe throttle")
        _ = engine.submit(.servo(300), channel: 4, receivedAt: t0 + .seconds(3))
        let resumed = flush(&engine, at: t0 + .seconds(3))
        #expect(resumed.first?.value == .pulse(Microseconds(1300)) && resumed.first?.enabled == true)
    }

    @Test("Pacing: a burst of 4 flushes per 20 ms period goes at once, then one every 5 ms")
    func pacing() throws {
        var timing = ServoPath.Timing()
        timing.maxFlushesPerPeriod = 4
        var engine = ServoEngine(channels: try simulatorChannels(), timing: timing)
        let t0 = ContinuousClock.now
        _ = engine.setEnabled(true, channel: 0, receivedAt: t0)
        for round in 0..<4 {
            _ = engine.submit(.servo(UInt16(round)), channel: 0, receivedAt: t0)
            let result3 = engine.nextAction(at: t0)
            #expect(result3 == .flush, "flush \(round) of the burst")
        }
        _ = engine.submit(.servo(9), channel: 0, receivedAt: t0)
        let result4 = engine.nextAction(at: t0)
        #expect(result4 == .wait(until: t0 + .milliseconds(5)))
        let result5 = engine.nextAction(at: t0 + .milliseconds(5))
        #expect(result5 == .flush)
        _ = engine.submit(.servo(10), channel: 0, receivedAt: t0)
        let result6 = engine.nextAction(at: t0 + .milliseconds(6))
        #expect(result6 == .wait(until: t0 + .milliseconds(10)))
        // Idle for a period refills the bucket.
        _ = engine.submit(.servo(11), channel: 0, receivedAt: t0)
        for _ in 0..<4 {
            let result7 = engine.nextAction(at: t0 + .milliseconds(100))
            #expect(result7 == .flush)
            _ = engine.submit(.servo(12), channel: 0, receivedAt: t0)
        }
    }

    @Test("A failed flush keeps its values for the next try")
    func failedFlush() throws {
        var engine = ServoEngine(channels: try simulatorChannels(), timing: ServoPath.Timing())
        let t0 = ContinuousClock.now
        _ = engine.setEnabled(true, channel: 2, receivedAt: t0)
        let result8 = engine.nextAction(at: t0)
        #expect(result8 == .flush)
        engine.flushFailed()
        let result9 = engine.nextAction(at: t0 + .seconds(1))
        #expect(result9 == .flush)
        #expect(engine.batch.map(\.channel) == [2])
    }

    @Test("Reconfigure: unchanged channels keep their state; changed ones start over; removed outputs go off once")
    func reconfigure() throws {
        let channels = try simulatorChannels()
        var engine = ServoEngine(channels: channels, timing: ServoPath.Timing())
        let t0 = ContinuousClock.now
        for channel in [0, 1, 2] {
            _ = engine.setEnabled(true, channel: channel, receivedAt: t0)
            _ = engine.submit(.servo(500), channel: channel, receivedAt: t0)
        }
        _ = flush(&engine, at: t0)
        var changed = channels.filter { $0.channel != 2 }
        changed[1].maximum = Microseconds(1900)
        let touched = engine.reconfigure(channels: changed, timing: ServoPath.Timing())
        #expect(touched == [1, 2])
        #expect(engine.state(0)?.enabled == true && engine.state(0)?.lastCommand == .servo(500))
        #expect(engine.state(1)?.enabled == false && engine.state(1)?.lastCommand == nil)
        #expect(engine.state(2) == nil)
        let batch = flush(&engine, at: t0 + .seconds(1))
        #expect(batch.contains { $0.channel == -1 && $0.output == 2 && !$0.enabled }, "channel 2's output switched off")
        #expect(!batch.contains { $0.channel == 0 }, "an unchanged channel is not written")
    }
}

@Suite("Failsafe triggers on virtual time")
struct FailsafeWatchTests {
    final class Probe: @unchecked Sendable {
        var lastFrame: ContinuousClock.Instant?
        var busySince: ContinuousClock.Instant?
        var engaged: [(String, ContinuousClock.Instant)] = []
        var acknowledged = 0
        /// The servo thread's runnable time at an instant (nil: unknown).
        var runnable: (ContinuousClock.Instant) -> Duration? = { _ in nil }
    }

    private func watch(_ loop: ManualLoop, _ probe: Probe, silence: Duration?, stall: Duration = .milliseconds(500)) -> FailsafeWatch {
        FailsafeWatch(loop: loop, silenceTimeout: silence, stallTimeout: stall,
                      lastFrame: { probe.lastFrame },
                      silence: { timeout in
                          // The hub silences the quiet commanders: they command nothing now.
                          probe.engaged.append(("silent for \(Int(timeout.inSeconds * 1000)) ms", loop.now))
                          probe.lastFrame = nil
                          return 1
                      },
                      busyFor: { now in probe.busySince.map { $0.duration(to: now) } },
                      acknowledgeBusy: { probe.acknowledged += 1 },
                      runnableTime: { probe.runnable(loop.now) },
                      engage: { probe.engaged.append(($0, loop.now)) })
    }

    @Test("Silence: engaged exactly at the last frame plus the timeout, once, however frames came before")
    func silence() {
        let loop = ManualLoop()
        let probe = Probe()
        let watch = watch(loop, probe, silence: .milliseconds(300))
        let t0 = loop.now
        for step in 0..<10 {
            loop.advance(to: t0 + .milliseconds(100 * step))
            probe.lastFrame = loop.now
            watch.frameArrived()
        }
        let last = try! #require(probe.lastFrame)
        loop.advance(to: last + .milliseconds(299))
        #expect(probe.engaged.isEmpty)
        loop.advance(to: last + .milliseconds(300))
        #expect(probe.engaged.count == 1)
        #expect(probe.engaged.first?.0 == "silent for 300 ms")
        #expect(probe.engaged.first?.1 == last + .milliseconds(300))
        loop.advance(by: .seconds(10))
        #expect(probe.engaged.count == 1, "once per silence")
        #expect(loop.pendingTimers == 0, "an idle, silent board arms no timer")
    }

    @Test("Stall: a transfer stuck past the timeout engages; short transfers do not, and the watch disarms when idle")
    func stall() {
        let loop = ManualLoop()
        let probe = Probe()
        let watch = watch(loop, probe, silence: nil, stall: .milliseconds(200))
        let t0 = stuckTransfer(loop, probe, watch)
        loop.advance(to: t0 + .milliseconds(10))
        probe.busySince = nil  // that write finished
        loop.advance(to: t0 + .milliseconds(200))
        #expect(probe.engaged.isEmpty)
        #expect(probe.acknowledged == 1)
        #expect(loop.pendingTimers == 0)

        // Stuck: seen at the deadline, and again a fifth of it later.
        let t1 = stuckTransfer(loop, probe, watch)
        loop.advance(to: t1 + .milliseconds(239))
        #expect(probe.engaged.isEmpty)
        loop.advance(to: t1 + .milliseconds(240))
        #expect(probe.engaged.first?.0 == "servo thread stalled in a bus write for 240 ms")
        #expect(probe.engaged.first?.1 == t1 + .milliseconds(240))
    }

    /// A transfer that starts now and has not ended (the servo thread
    /// reports it); its start.
    private func stuckTransfer(_ loop: ManualLoop, _ probe: Probe, _ watch: FailsafeWatch) -> ContinuousClock.Instant {
        let start = loop.now
        probe.busySince = start
        watch.servoBusy(since: start)
        return start
    }

    /// A transfer starts; the host runs neither thread for `pause`, so the
    /// loop's first look at it fires late; 1 ms after both wake, the servo
    /// thread ends it and, if `next`, starts another. Its start.
    private func pausedTransfer(_ loop: ManualLoop, _ probe: Probe, _ watch: FailsafeWatch, pause: Duration, next: Bool) -> ContinuousClock.Instant {
        let start = stuckTransfer(loop, probe, watch)
        loop.pause(until: start + pause)
        loop.run()
        loop.advance(to: start + pause + .milliseconds(1))
        probe.busySince = next ? loop.now : nil
        return start
    }

    @Test("Stall: a pause of the whole process (the loop wakes late, inside the servo thread's transfer) is not a stall when the transfer then ends")
    func pauseIsNotAStall() {
        let loop = ManualLoop()
        let probe = Probe()
        let watch = watch(loop, probe, silence: nil, stall: .milliseconds(500))
        // Found 700 ms old by a late look, then ended at once.
        _ = pausedTransfer(loop, probe, watch, pause: .milliseconds(700), next: false)
        loop.advance(by: .seconds(2))
        #expect(probe.engaged.isEmpty)
        #expect(probe.acknowledged == 1)
        #expect(loop.pendingTimers == 0)

        // Paused again; the transfer the servo thread starts on waking is
        // judged on its own age.
        let t1 = pausedTransfer(loop, probe, watch, pause: .milliseconds(650), next: true)
        loop.advance(to: t1 + .milliseconds(1250))
        #expect(probe.engaged.isEmpty)
        loop.advance(to: t1 + .milliseconds(1251))
        #expect(probe.engaged.first?.0 == "servo thread stalled in a bus write for 600 ms")
    }

    @Test("Stall: a servo thread the kernel counts runnable (starved, not blocked) is looked at again, up to ten stall timeouts")
    func starvedIsNotStuck() {
        let loop = ManualLoop()
        let probe = Probe()
        let watch = watch(loop, probe, silence: nil, stall: .milliseconds(500))
        // Waiting for a CPU the whole time (a guest the host does not run).
        let t0 = loop.now
        probe.runnable = { t0.duration(to: $0) }
        _ = stuckTransfer(loop, probe, watch)
        loop.advance(to: t0 + .milliseconds(4999))
        #expect(probe.engaged.isEmpty)
        loop.advance(to: t0 + .milliseconds(5000))
        #expect(probe.engaged.first?.0 == "servo thread stalled in a bus write for 5000 ms", "a driver spinning in a transfer is on a CPU too")

        // Starved until 800 ms, then the transfer ends: nothing engages.
        let starved = ManualLoop()
        let quiet = Probe()
        let second = self.watch(starved, quiet, silence: nil, stall: .milliseconds(500))
        let t1 = starved.now
        quiet.runnable = { t1.duration(to: $0) }
        _ = stuckTransfer(starved, quiet, second)
        starved.advance(to: t1 + .milliseconds(800))
        quiet.busySince = nil
        starved.advance(by: .seconds(10))
        #expect(quiet.engaged.isEmpty)
        #expect(quiet.acknowledged == 1)
        #expect(starved.pendingTimers == 0)
    }

    @Test("Stall: a servo thread the kernel counts asleep (blocked in the transfer) engages at the second look; starved first, at the first look after")
    func blockedIsStuck() {
        let loop = ManualLoop()
        let probe = Probe()
        let watch = watch(loop, probe, silence: nil, stall: .milliseconds(500))
        probe.runnable = { _ in .seconds(3) }
        let t0 = stuckTransfer(loop, probe, watch)
        loop.advance(to: t0 + .milliseconds(599))
        #expect(probe.engaged.isEmpty)
        loop.advance(to: t0 + .milliseconds(600))
        #expect(probe.engaged.first?.0 == "servo thread stalled in a bus write for 600 ms")

        // Runnable for the first 700 ms (it ran, and entered the transfer
        // late), then asleep in it: engaged at the look after 700 ms.
        let later = ManualLoop()
        let blocked = Probe()
        let second = self.watch(later, blocked, silence: nil, stall: .milliseconds(500))
        let t1 = later.now
        blocked.runnable = { min(t1.duration(to: $0), .milliseconds(700)) }
        _ = stuckTransfer(later, blocked, second)
        later.advance(to: t1 + .milliseconds(799))
        #expect(blocked.engaged.isEmpty)
        later.advance(to: t1 + .milliseconds(800))
        #expect(blocked.engaged.first?.0 == "servo thread stalled in a bus write for 800 ms")
    }

    @Test("Stall: the second look engages only on the transfer the first one saw, however late it fires")
    func secondLookSameTransfer() {
        let loop = ManualLoop()
        let probe = Probe()
        let watch = watch(loop, probe, silence: nil, stall: .milliseconds(500))
        // A second pause holds the loop past its grace look, until the
        // transfer begun on waking is itself 599 ms old.
        let t0 = pausedTransfer(loop, probe, watch, pause: .milliseconds(700), next: true)
        loop.pause(until: t0 + .milliseconds(1300))
        loop.run()
        #expect(probe.engaged.isEmpty, "a newer transfer is sighted, not engaged")
        loop.advance(to: t0 + .milliseconds(1301))
        probe.busySince = nil
        loop.advance(by: .seconds(2))
        #expect(probe.engaged.isEmpty)
        #expect(loop.pendingTimers == 0)
    }
}

@Suite("Sessions on virtual time")
struct SessionHubTests {
    @Test("A partial frame is discarded exactly at the idle timeout, however many bytes came before")
    func expiry() throws {
        let board = try EmulatedBoard()
        let loop = ManualLoop()
        let hub = board.hub(on: loop, idleTimeout: .milliseconds(500))
        let session = hub.open(transport: .tcp, peer: "t") { _ in }
        let t0 = loop.now
        hub.receive([0x02], for: session)
        loop.advance(to: t0 + .milliseconds(400))
        hub.receive([0x03], for: session)
        loop.advance(to: t0 + .milliseconds(900))
        #expect(session.deadline != nil, "still waiting exactly 500 ms after the last byte")
        loop.advance(to: t0 + .milliseconds(900) + .microseconds(1))
        #expect(session.deadline == nil, "discarded once idle for longer than 500 ms")
        #expect(board.dispatcher.counters.discardedPartials == 1)
        #expect(loop.pendingTimers == 0)
    }

    @Test("A central that is gone is not in control: a frame whose reply closes the session cannot clear the failsafe")
    func goneIsNotInControl() throws {
        let board = try EmulatedBoard()
        let loop = ManualLoop()
        let hub = board.hub(on: loop, idleTimeout: nil)
        var inControl = 0
        var commanderGone = 0
        hub.onCentralInControl = { _, _ in inControl += 1 }
        hub.onCommanderLeft = { _, _ in commanderGone += 1 }
        var session: Session!
        // Sending the ERROR reply fails: the transport closes the session
        // from inside the send, as a reset connection does.
        session = hub.open(transport: .tcp, peer: "reset") { _ in hub.close(session) }
        // An accepted frame and one that draws ERROR, in one write.
        hub.receive(FrameEncoder.encode(.enable(channel: 0, on: true)) + [0x09, 0x00], for: session)
        #expect(commanderGone == 1)
        #expect(inControl == 0, "the session closed before the write was done")

        let healthy = hub.open(transport: .tcp, peer: "ok") { _ in }
        hub.receive(FrameEncoder.encode(.enable(channel: 0, on: true)), for: healthy)
        #expect(inControl == 1)
        let cli = hub.open(transport: .control, peer: "cli") { _ in }
        hub.receive(FrameEncoder.encode(.enable(channel: 0, on: true)), for: cli)
        #expect(inControl == 1, "the CLI is an operator, not a central")
    }
}

@Suite("Failsafe end to end in-process", .serialized)
struct FailsafeTests {
    @Test("The last central disconnecting: servo holds, preset servo moves, ESC neutral then off, PWM duty 0; the LCD shows why, then the centrals' text again")
    func disconnect() throws {
        let board = try RunningBoard(yaml: testBoard())
        var central: LoopbackTCPClient? = try board.drivingCentral()
        try central?.send(FrameEncoder.encode(.lcdText(line: 0, text: Array("user text".utf8))))
        #expect(eventually { board.runtime.emulators?.lcd?.lcd.lines.first?.hasPrefix("user text") == true })
        central = nil  // closes the connection
        #expect(eventually { (try? board.servo().failsafe) != nil })
        #expect(try board.servo().failsafe?.hasPrefix("central left: tcp 127.0.0.1:") == true)
        #expect(try board.servo().failsafe?.hasSuffix("(channels 0, 3, 4, 6)") == true, "the outputs it was in control of")
        // One failsafe flush writes every changed run; wait for all of it.
        #expect(eventually { (try? board.servo().failsafeAppliedMs) != nil })
        #expect(abs(board.pulse(0) - 1700) < 5, "channel 0 holds")
        #expect(abs(board.pulse(3) - 1500) < 5, "channel 3 goes to its preset")
        #expect(board.duty(6) == 0, "PWM duty 0")
        #expect(eventually { board.pulse(4) == 0 }, "the ESC stops after its dwell")
        // The ESC's last outputs, in order: its throttle, the neutral pulse
        // (however briefly a loaded machine let a test see it), then none.
        // How long the dwell lasts is ServoEngineTests' business, on virtual time.
        #expect(board.ended(4, with: [1600, 1000, 0]), "ESC outputs \(board.pulses(4)): throttle, neutral, off")
        #expect(eventually { board.runtime.emulators?.lcd?.lcd.lines.first?.hasPrefix("FAILSAFE") == true })
        #expect(try board.runtime.status().lcd?.overlay == "failsafe")

        // A central back in control: the failsafe ends and the text it left
        // comes back. INIT alone commands nothing: a command does it.
        let again = try LoopbackTCPClient(port: board.port)
        try again.send(FrameEncoder.encode(.initialize))
        try again.send(FrameEncoder.encode(.enable(channel: 0, on: true)))
        #expect(eventually { (try? board.servo().failsafe) == nil })
        #expect(eventually { board.runtime.emulators?.lcd?.lcd.lines.first?.hasPrefix("user text") == true })
        #expect(try board.runtime.status().lcd?.overlay == nil)
    }

    @Test("After a failsafe an ESC stays stopped until ANALOG_OUT_EN on, and resumes only with a new value")
    func escLatch() throws {
        let board = try RunningBoard(yaml: testBoard(dwellMs: 50))
        _ = try board.drivingCentral()
        board.runtime.engageFailsafe(reason: "test")
        #expect(eventually { board.pulse(4) == 0 })
        let central = try LoopbackTCPClient(port: board.port)
        var frames = try board.runtime.status().counters.frames
        try central.send(FrameEncoder.encode(.servo(channel: 4, value: 900)))
        frames += 1
        try board.settle(frames: frames)
        #expect(board.pulse(4) == 0, "a value alone does not restart a latched ESC")
        #expect(try board.servo().failsafe == nil, "an accepted frame from a connected central clears the failsafe state")
        #expect(try board.runtime.status().channels.first { $0.channel == 4 }?.latched == true)
        try central.send(FrameEncoder.encode(.enable(channel: 4, on: true)))
        frames += 2  // the settle's own INIT counted too
        try board.settle(frames: frames)
        #expect(board.pulse(4) == 0, "enabling does not resume the pre-failsafe throttle")
        try central.send(FrameEncoder.encode(.servo(channel: 4, value: 300)))
        #expect(eventually { abs(board.pulse(4) - 1300) < 5 })
    }

    @Test("No frame for the silence timeout engages the failsafe")
    func silence() throws {
        let board = try RunningBoard(yaml: testBoard(silenceMs: 300))
        let central = try board.drivingCentral()
        #expect(eventually { (try? board.servo().failsafe) != nil })
        let reason = try board.servo().failsafe
        #expect(reason?.hasPrefix("central silent: tcp") == true, "\(String(describing: reason))")
        #expect(eventually { abs(board.pulse(3) - 1500) < 5 })
        _ = central
    }

    @Test("Silence is per commander on real TCP: a frozen central's channel fails safe while another central writes without pause")
    func frozenBesideBusyOverTCP() throws {
        let board = try RunningBoard(yaml: testBoard(silenceMs: 3000))
        let frozen = try board.commander(of: 0)
        // The busy central (the review's SWITCH_VAL central) sends a switch
        // frame every millisecond from its own thread, from here to the
        // end: it must never be silent itself. When the test's thread did
        // the sending, a loaded machine could keep it away for the timeout
        // while it read the status, and the busy central's own failsafe
        // then rightly ended at its next switch frame (issue 36).
        let port = board.port
        let next = LockedBox<[Message]>([])
        let sentWithNext = LockedBox<Int?>(nil)
        let stop = LockedBox(false)
        let sender = Thread {
            guard let busy = try? LoopbackTCPClient(port: port) else { return }
            var sent = 0
            while !stop.value {
                let extra = next.swap([])
                var bytes = FrameEncoder.encode(.switchValue(index: 0, on: sent % 2 == 0))
                for message in extra { FrameEncoder.encode(message, into: &bytes) }
                if (try? busy.send(bytes)) == nil { break }
                sent += 1 + extra.count
                if !extra.isEmpty { sentWithNext.value = sent }
                usleep(1000)
            }
        }
        sender.start()
        defer {
            stop.value = true
            _ = eventually { sender.isFinished }
        }
        /// Has the busy central send `messages` beside its switch frames,
        /// then waits until the board has dealt with every frame both
        /// centrals sent up to them.
        func sendBusy(_ messages: [Message]) throws {
            sentWithNext.value = nil
            next.value = messages
            let sent = eventuallyValue { sentWithNext.value }
            #expect(sent != nil, "the busy central's sender stopped")
            try board.settle(frames: 2 + (sent ?? 0))
        }
        let reason = eventuallyValue { try? board.servo().failsafe }
        #expect(reason?.hasPrefix("central silent: tcp 127.0.0.1:") == true, "\(String(describing: reason))")
        #expect(reason?.hasSuffix("(channel 0)") == true, "the frozen central's channel, not the busy one's switch: \(String(describing: reason))")
        #expect(eventually { abs(board.pulse(0) - 2000) < 5 }, "a servo's failsafe is hold: it stays where it was")
        // Another central's text and its own switch end nothing; taking
        // channel 0 over does.
        try sendBusy([.lcdText(line: 0, text: Array("busy".utf8))])
        #expect(try board.servo().failsafe == reason, "another central's frames for its own outputs did not end it")
        try sendBusy([.servo(channel: 0, value: 500)])
        #expect(eventually { (try? board.servo().failsafe) == nil && abs(board.pulse(0) - 1500) < 5 })
        _ = frozen
    }

    @Test("A commander's silence during another failsafe (a stall, a fault) is kept: another central's command of its own output ends neither, taking the silent one's channel over ends both")
    func silenceDuringAnotherFailsafe() throws {
        let board = try RunningBoard(yaml: testBoard(silenceMs: 1000))
        let frozen = try board.commander(of: 0)
        // What the stall watch and a lasting I2C fault do: a failsafe that
        // any command ends. The frozen central then goes silent under it.
        board.runtime.engageFailsafe(reason: "servo thread stalled in a bus write for 600 ms")
        let reason = eventuallyValue { (try? board.servo().failsafe).flatMap { $0.hasPrefix("central silent") ? $0 : nil } }
        #expect(reason?.hasPrefix("central silent: tcp 127.0.0.1:") == true && reason?.hasSuffix("(channel 0)") == true,
                "the silence, not the stall, is what holds the failsafe now: \(String(describing: try? board.servo().failsafe))")
        // Another central commands its own channel: the stall alone would
        // end there; the frozen central's channel keeps it.
        let other = try LoopbackTCPClient(port: board.port)
        try other.send(FrameEncoder.encode(.enable(channel: 3, on: true)) + FrameEncoder.encode(.servo(channel: 3, value: 100)))
        try board.settle(frames: 4)
        #expect(try board.servo().failsafe == reason, "another central's command of its own output did not end it")
        try other.send(FrameEncoder.encode(.servo(channel: 0, value: 500)))
        #expect(eventually { (try? board.servo().failsafe) == nil && abs(board.pulse(0) - 1500) < 5 })
        _ = frozen
    }

    @Test("Two commanders gone: taking one's channel over ends its part only; the failsafe holds for the other, under its reason, until its channel is taken too")
    func twoCommandersGone() throws {
        let board = try RunningBoard(yaml: testBoard())
        let first = try board.commander(of: 0)
        let second = try board.commander(of: 3)
        first.disconnect()
        let firstReason = eventuallyValue { try? board.servo().failsafe }
        #expect(firstReason?.hasSuffix("(channel 0)") == true, "\(String(describing: firstReason))")
        second.disconnect()
        // The second one's leaving joins it (the reason stays the first's);
        // seen once its session is closed.
        #expect(eventually { (try? board.runtime.status().sessions.count) == 0 })
        #expect(try board.servo().failsafe == firstReason)
        let third = try LoopbackTCPClient(port: board.port)
        try third.send(FrameEncoder.encode(.servo(channel: 0, value: 500)))
        let secondReason = eventuallyValue { (try? board.servo().failsafe).flatMap { $0 == firstReason ? nil : $0 } }
        #expect(secondReason?.hasPrefix("central left: tcp") == true && secondReason?.hasSuffix("(channel 3)") == true,
                "channel 3's commander still holds it: \(String(describing: secondReason))")
        #expect(eventually { abs(board.pulse(0) - 1500) < 5 }, "the command that took channel 0 over is applied")
        try third.send(FrameEncoder.encode(.servo(channel: 3, value: 500)))
        #expect(eventually { (try? board.servo().failsafe) == nil && abs(board.pulse(3) - 1500) < 5 })
    }

    @Test("Silent TCP connections cannot lock a central out: they never fill the last slots, and each is closed after its deadline")
    func silentConnectionsLeaveRoom() throws {
        let board = try RunningBoard(yaml: testBoard())
        // As many as the transport has slots, none sending a byte.
        let silent = try (0..<64).map { _ in try LoopbackTCPClient(port: board.port) }
        let central = try LoopbackTCPClient(port: board.port)
        try central.send(FrameEncoder.encode(.enable(channel: 0, on: true)) + FrameEncoder.encode(.servo(channel: 0, value: 250)))
        #expect(eventually { abs(board.pulse(0) - 1250) < 5 }, "the central was served beside 64 silent connections")
        // The ones that never sent a frame's head are all closed in the end
        // (the oldest made way at once; the rest at their deadline).
        let closed = silent.filter { $0.isClosedByPeer }.count
        #expect(closed == silent.count)
        // The central that sent frames is not one of them: still served.
        try central.send(FrameEncoder.encode(.servo(channel: 0, value: 750)))
        #expect(eventually { abs(board.pulse(0) - 1750) < 5 })
    }

    @Test("A PCA9685 that stops answering puts the board in failsafe; the failsafe outputs land when it returns")
    func lastingFault() throws {
        let board = try RunningBoard(yaml: testBoard(faultMs: 200))
        let central = try board.drivingCentral()
        // Gone until the failsafe has engaged, however long a busy machine
        // takes to get there; back then.
        board.bus.injectFault(.noAcknowledge, at: I2CAddress(0x40)!)
        try central.send(FrameEncoder.encode(.servo(channel: 0, value: 100)))
        #expect(eventually { (try? board.servo().failsafe)?.contains("not answering") == true })
        board.bus.clearFault(at: I2CAddress(0x40)!)
        #expect(eventually { (try? board.servo().online) == true && board.pulse(4) == 0 && abs(board.pulse(3) - 1500) < 5 })
        _ = central
    }

    @Test("A servo thread stuck in a bus write is reported as a failsafe, and the LED blinks fast")
    func stall() throws {
        let board = try RunningBoard(yaml: testBoard(stallMs: 200))
        let central = try board.drivingCentral()
        // Every write hangs (a second at a time) until the stall is seen,
        // however late a busy machine lets the watch look.
        board.bus.injectFault(.stall, at: I2CAddress(0x40)!)
        try central.send(FrameEncoder.encode(.servo(channel: 0, value: 100)))
        #expect(eventually { (try? board.servo().failsafe)?.contains("stalled") == true })
        #expect(eventually { (try? board.runtime.status().led?.pattern) == "fast-blink" })
        board.bus.clearFault(at: I2CAddress(0x40)!)
    }

    @Test("SWITCH_VAL drives the configured switches; an unknown index gets ERROR 06; a failsafe sets the safe states")
    func switches() throws {
        let board = try RunningBoard(yaml: testBoard())
        let central = try LoopbackTCPClient(port: board.port)
        var frames: [UInt8] = []
        for index in UInt8(0)...3 { FrameEncoder.encode(.switchValue(index: index, on: index % 2 == 0), into: &frames) }
        FrameEncoder.encode(.switchValue(index: 9, on: true), into: &frames)
        try central.send(frames)
        #expect(central.receive(count: 3) == [0xFF, 0x01, 0x06], "switch 9 is not on this board")
        try board.settle(frames: 5)
        let lines = try #require(board.runtime.emulators?.switches)
        #expect((0...3).map { lines[$0]?.isActive } == [true, false, true, false])
        #expect(try board.runtime.status().switches.map(\.on) == [true, false, true, false])
        board.runtime.engageFailsafe(reason: "test")
        #expect(eventually { (0...3).allSatisfy { lines[$0]?.isActive == false } }, "safe state: off")
        _ = central
    }

    @Test("Stopping the board switches every output off")
    func stopAllOff() throws {
        let board = try RunningBoard(yaml: testBoard())
        _ = try board.drivingCentral()
        board.runtime.stop()
        #expect((0..<16).allSatisfy { board.pulse($0) == 0 })
    }
}

@Suite("Bus priority", .serialized)
struct BusPriorityTests {
    @Test("An LCD flood never holds a servo write behind more than one LCD chunk")
    func lcdFlood() throws {
        let board = try RunningBoard(yaml: EmbeddedBoards.simulator)
        let servoCentral = try LoopbackTCPClient(port: board.port)
        let lcdCentral = try LoopbackTCPClient(port: board.port)
        try servoCentral.send(FrameEncoder.encode(.enable(channel: 0, on: true)))
        var round = 0
        // Until the flood has contended with the servo path a good number of
        // times (counted by the arbiter, not timed).
        while round < 3000 {
            round += 1
            // Two full lines per round: far more than the display can take.
            try lcdCentral.send(FrameEncoder.encode(.lcdText(line: 0, text: Array("flood \(round) ABCDEFGHIJ".utf8))) + FrameEncoder.encode(.lcdText(line: 1, text: Array("\(round) abcdefghijklmnop".utf8))))
            try servoCentral.send(FrameEncoder.encode(.servo(channel: 0, value: UInt16(round % 1000))))
            usleep(1_000)
            if round % 100 == 0, (try board.servo().maxBusWaitUs) > 0, (try board.runtime.status().lcd?.busWrites ?? 0) > 50 { break }
        }
        let servo = try board.servo()
        #expect(servo.maxBusWaitUs > 0, "the flood never contended with the servo path; the test proved nothing")
        #expect(servo.maxLcdChunksWaited <= 1)
    }

    // Only where there is no system bus: beside a real bluetoothd this
    // would forget the machine's own bonds.
    @Test("forget-bonds without bluetoothd is a clear refusal, and the board keeps running",
          .enabled(if: Files.environment("DBUS_SYSTEM_BUS_ADDRESS") == nil && !Files.exists("/run/dbus/system_bus_socket")))
    func forgetBondsWithoutBlueZ() throws {
        let board = try RunningBoard(yaml: testBoard())
        let client = try ControlClient(path: board.socket)
        let response = try client.request(ControlProtocol.Request(op: .forgetBonds))
        #expect(response.ok == false)
        #expect(response.error?.hasPrefix("bluetoothd is not reachable (BLE: ") == true, "\(response.error ?? "")")
        #expect(try client.status().board == board.runtime.status().board)
    }
}

/// `blecontrol web`'s bridge opens its control connection as a central.
@Suite("The control socket's central: the web page through the bridge")
struct ControlCentralTests {
    @Test("A connection that says `central` is a web session: its frames drive the outputs, and when it goes the failsafe acts")
    func centralLeaves() throws {
        let board = try RunningBoard(yaml: EmbeddedBoards.simulator)
        do {
            // Closed at the end of this block: the central leaves.
            let client = try ControlClient(path: board.socket, timeout: Patience.time)
            let opened = try client.request(ControlProtocol.Request(op: .central, peer: "127.0.0.1:50312"))
            #expect(opened.ok)
            let report = try client.status()
            #expect(report.sessions.contains { $0.transport == "web" && $0.peer == "127.0.0.1:50312" })
            _ = try client.send(FrameEncoder.encode(.enable(channel: 0, on: true)) + FrameEncoder.encode(.servo(channel: 0, value: 200)))
            #expect(try board.runtime.status().channels[0].setpointUs == 1200)
            let again = try client.request(ControlProtocol.Request(op: .central, peer: "127.0.0.1:50312"))
            #expect(again.ok == false && again.error?.contains("sent frames already") == true, "\(again.error ?? "")")
        }
        let engaged = try eventually { try board.runtime.status().servo?.failsafe?.hasPrefix("central left: web 127.0.0.1:50312") == true }
        let failsafe = try board.runtime.status().servo?.failsafe
        #expect(engaged, "\(failsafe ?? "none")")
    }

    @Test("`central` refuses a peer name that is empty, too long or not printable ASCII")
    func peerNames() throws {
        let board = try RunningBoard(yaml: EmbeddedBoards.simulator)
        for peer in ["", String(repeating: "x", count: ControlProtocol.maximumPeerLength + 1), "a\u{1B}[2J", "café", "a b"] {
            let client = try ControlClient(path: board.socket, timeout: Patience.time)
            let response = try client.request(ControlProtocol.Request(op: .central, peer: peer))
            #expect(response.ok == false && response.error?.hasPrefix("central needs \"peer\"") == true, "\(peer.debugDescription)")
        }
        #expect(try board.runtime.status().sessions.allSatisfy { $0.transport != "web" })
    }
}
