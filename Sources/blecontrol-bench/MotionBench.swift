import BLEControlProtocol
import Board
import Foundation
import TestSupport

/// Issue #38's real-time figures: eight servos moving without pause for
/// PERIODS PWM periods (50 Hz), with and without SCHED_FIFO and a busy loop
/// on every core; beside them today's unramped path, a SERVO_VAL per channel
/// per period. Printed, never asserted.
///
/// Ramped: each channel is limited to 1000 µs/s and is sent to the other end
/// every half second, so it never arrives: every period has a step due. A
/// missed period is one whose step the thread took late by a whole period or
/// more (two steps in one write); lateness is from the instant the step was
/// due. Unramped: the receive → bus-write latency of each frame, and the
/// frames that took longer than a period (the status's deadline misses).
func benchmarkMotion(periods: Int) throws {
    let cores = ProcessInfo.processInfo.activeProcessorCount
    print("motion on the servo thread: 8 servos on the simulator's PCA9685 (50 Hz, 100 kHz emulated bus), \(periods) periods a run, \(cores) cores")
    print("  path                        scheduling          load              periods  missed  late p50 µs  p99 µs  max µs")
    for ramped in [true, false] {
        for realtime in [false, true] {
            for busy in [false, true] {
                let run = try motionRun(ramped: ramped, realtime: realtime, busy: busy, cores: cores, periods: periods)
                let path = (ramped ? "ramped (speed 1000 µs/s)" : "unramped (a value a period)").padding(toLength: 27, withPad: " ", startingAt: 0)
                let load = (busy ? "busy loop × \(cores)" : "idle").padding(toLength: 17, withPad: " ", startingAt: 0)
                print("  \(path) \(run.scheduling.padding(toLength: 19, withPad: " ", startingAt: 0)) \(load) \(String(format: "%7d  %6d  %11d  %6d  %6d", run.periods, run.missed, run.p50, run.p99, run.max))")
            }
        }
    }
}

private func motionRun(ramped: Bool, realtime: Bool, busy: Bool, cores: Int, periods: Int)
    throws -> (periods: Int, missed: Int, p50: Int, p99: Int, max: Int, scheduling: String) {
    var yaml = EmbeddedBoards.simulator
    for channel in 4...7 {
        yaml = yaml.board(replacing: "- { channel: \(channel), output: \(channel), role: pwm }",
                                         with: "- { channel: \(channel), output: \(channel), role: servo, min_us: 1000, max_us: 2000 }")
    }
    if ramped {
        for channel in 0...7 {
            yaml = yaml.board(replacing: "- { channel: \(channel), output: \(channel), role: servo, min_us: 1000, max_us: 2000",
                                             with: "- { channel: \(channel), output: \(channel), role: servo, min_us: 1000, max_us: 2000, speed_us_per_s: 1000")
        }
    }
    if realtime { yaml = yaml.board(replacing: "  priority: 0", with: "  priority: 50") }
    let runtime = try startBoard(yaml: yaml)
    defer { runtime.stop() }
    let central = try LoopbackTCPClient(port: runtime.tcpPort!)
    var frames: [UInt8] = []
    for channel in UInt8(0)..<8 { FrameEncoder.encode(.enable(channel: channel, on: true), into: &frames) }
    try central.send(frames)
    usleep(200_000)

    let spinning = LockedBox(false)
    spinning.value = busy
    var spinners: [Thread] = []
    if busy {
        for _ in 0..<cores {
            let thread = Thread { while spinning.value { for _ in 0..<10_000 { _ = ContinuousClock.now } } }
            thread.start()
            spinners.append(thread)
        }
    }
    defer { spinning.value = false }
    runtime.resetServoMetrics()
    let period = Duration.milliseconds(20)
    let start = ContinuousClock.now
    // Ramped: the other end every 25 periods; unramped: a new value every period.
    let every = ramped ? 25 : 1
    var round = 0
    while round * every < periods {
        pause(until: start + period * (round * every))
        var batch: [UInt8] = []
        for channel in UInt8(0)..<8 {
            let value: UInt16 = ramped ? (round % 2 == 0 ? 1000 : 0) : UInt16((round * 37 + Int(channel) * 101) % 1001)
            FrameEncoder.encode(.servo(channel: channel, value: value), into: &batch)
        }
        try central.send(batch)
        round += 1
    }
    usleep(100_000)
    let servo = try runtime.status().servo!
    if ramped {
        return (servo.motionPeriods ?? 0, servo.motionPeriodsMissed ?? 0, servo.motionLatenessP50Us ?? -1, servo.motionLatenessP99Us ?? -1,
                servo.motionLatenessMaxUs ?? -1, servo.scheduling)
    }
    return (round, servo.deadlineMisses, servo.latencyP50Us ?? -1, servo.latencyP99Us ?? -1, servo.latencyMaxUs ?? -1, servo.scheduling)
}
