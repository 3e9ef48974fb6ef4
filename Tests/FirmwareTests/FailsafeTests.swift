import BLEControlProtocol
import DeviceEmulators
import Foundation
import Hardware
import Logging
import TestSupport
import Testing
@testable import Firmware

/// The simulator board with the failsafe knobs turned for tests.
private func board(silenceMs: Int = 0, dwellMs: Int = 150, faultMs: Int = 200, stallMs: Int = 200) -> String {
    EmbeddedBoards.simulator
        .replacingOccurrences(of: "failsafe_dwell_ms: 500", with: "failsafe_dwell_ms: \(dwellMs)")
        .replacingOccurrences(of: "silence_timeout_ms: 0 ", with: "silence_timeout_ms: \(silenceMs) ")
        .replacingOccurrences(of: "stall_timeout_ms: 500 ", with: "stall_timeout_ms: \(stallMs) ")
        .replacingOccurrences(of: "fault_timeout_ms: 1000 ", with: "fault_timeout_ms: \(faultMs) ")
}

/// A whole board in-process: transports on a free port, emulated chips to
/// read the outputs from.
final class RunningBoard {
    let runtime: BoardRuntime
    let chip: PCA9685Emulator
    let bus: EmulatedI2CBus
    let port: UInt16

    init(yaml: String) throws {
        var logger = Logger(label: "failsafe-test")
        logger.logLevel = .critical
        runtime = try BoardRuntime(configuration: try BoardFile.parse(yaml, path: "test.yaml"), logger: logger)
        let socket = FileManager.default.temporaryDirectory.appendingPathComponent("blecontrol-test-\(UUID().uuidString.prefix(8)).sock").path
        try runtime.start(controlSocketPath: socket, tcpOverride: ("127.0.0.1", 0))
        chip = runtime.emulators!.pca9685!
        bus = runtime.emulators!.buses["main"]!
        port = runtime.tcpPort!
    }

    deinit { runtime.stop() }

    func pulse(_ output: Int) -> Double { chip.output(channel: output).pulseWidth.value }
    func duty(_ output: Int) -> Double { chip.output(channel: output).duty }
    func servo() throws -> StatusReport.Servo { try #require(try runtime.status().servo) }

    /// A central that enabled channels 0, 3, 4 and 6 and gave them values.
    func drivingCentral() throws -> LoopbackTCPClient {
        let central = try LoopbackTCPClient(port: port)
        var frames: [UInt8] = []
        for (channel, value) in [(UInt8(0), UInt16(700)), (3, 800), (4, 600), (6, 0)] {
            FrameEncoder.encode(.enable(channel: channel, on: true), into: &frames)
            FrameEncoder.encode(channel == 6 ? .pwm(channel: 6, value: 500) : .servo(channel: channel, value: value), into: &frames)
        }
        try central.send(frames)
        #expect(eventually { abs(self.pulse(4) - 1600) < 5 && abs(self.duty(6) - 0.5) < 0.001 })
        return central
    }
}

/// Polls `condition` for up to `timeout` (outputs apply on other threads).
func eventually(timeout: Duration = .seconds(5), _ condition: () -> Bool) -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if condition() { return true }
        usleep(2_000)
    }
    return condition()
}

@Suite("Failsafe engine and its triggers", .serialized)
struct FailsafeTests {
    @Test("The last central disconnecting: servo holds, preset servo moves, ESC neutral then off, PWM duty 0 — applied within 100 ms")
    func disconnect() throws {
        let board = try RunningBoard(yaml: board())
        var central: LoopbackTCPClient? = try board.drivingCentral()
        _ = central
        central = nil  // closes the connection
        #expect(eventually { (try? board.servo().failsafe) != nil })
        let servo = try board.servo()
        #expect(servo.failsafe?.contains("last central disconnected") == true)
        // One failsafe flush writes every changed run; wait for all of it.
        #expect(eventually { (try? board.servo().failsafeAppliedMs) != nil })
        #expect(abs(board.pulse(4) - 1000) < 5, "ESC at its neutral pulse")
        #expect(abs(board.pulse(0) - 1700) < 5, "channel 0 holds")
        #expect(abs(board.pulse(3) - 1500) < 5, "channel 3 goes to its preset")
        #expect(board.duty(6) == 0, "PWM duty 0")
        let applied = try #require(try board.servo().failsafeAppliedMs)
        #expect(applied <= 100, "failsafe outputs reached the chip \(applied) ms after the disconnect was seen")
        #expect(eventually { board.pulse(4) == 0 }, "the ESC stops after its dwell")
        let lines = board.runtime.emulators!.lcd!.lcd.lines
        #expect(eventually { board.runtime.emulators!.lcd!.lcd.lines.first?.hasPrefix("FAILSAFE") == true }, "\(lines)")
    }

    @Test("After a failsafe an ESC stays stopped until ANALOG_OUT_EN on, and resumes only with a new value")
    func escLatch() throws {
        let board = try RunningBoard(yaml: board(dwellMs: 50))
        _ = try board.drivingCentral()
        board.runtime.engageFailsafe(reason: "test")
        #expect(eventually { board.pulse(4) == 0 })
        let central = try LoopbackTCPClient(port: board.port)
        try central.send(FrameEncoder.encode(.servo(channel: 4, value: 900)))
        usleep(100_000)
        #expect(board.pulse(4) == 0, "a value alone does not restart a latched ESC")
        #expect(try board.servo().failsafe == nil, "a frame from a central clears the failsafe state")
        #expect(try board.runtime.status().channels.first { $0.channel == 4 }?.latched == true)
        try central.send(FrameEncoder.encode(.enable(channel: 4, on: true)))
        usleep(100_000)
        #expect(board.pulse(4) == 0, "enabling does not resume the pre-failsafe throttle")
        try central.send(FrameEncoder.encode(.servo(channel: 4, value: 300)))
        #expect(eventually { abs(board.pulse(4) - 1300) < 5 })
    }

    @Test("No frame for the silence timeout: failsafe within the timeout plus one check")
    func silence() throws {
        let board = try RunningBoard(yaml: board(silenceMs: 300))
        let central = try board.drivingCentral()
        let lastFrame = ContinuousClock.now
        #expect(eventually { (try? board.servo().failsafe) != nil })
        let engagedAfter = lastFrame.duration(to: .now)
        #expect(try board.servo().failsafe?.contains("no frame for 300 ms") == true)
        #expect(engagedAfter >= .milliseconds(300))
        #expect(engagedAfter < .milliseconds(300 + 200), "engaged \(engagedAfter) after the last frame")
        #expect(eventually { abs(board.pulse(3) - 1500) < 5 })
        _ = central
    }

    @Test("A PCA9685 that stops answering puts the board in failsafe; the failsafe outputs land when it returns")
    func lastingFault() throws {
        let board = try RunningBoard(yaml: board(faultMs: 200))
        let central = try board.drivingCentral()
        board.bus.injectFault(.noAcknowledge, at: I2CAddress(0x40)!, for: .milliseconds(1500))
        try central.send(FrameEncoder.encode(.servo(channel: 0, value: 100)))
        #expect(eventually { (try? board.servo().failsafe)?.contains("not answering") == true })
        #expect(eventually(timeout: .seconds(8)) { (try? board.servo().online) == true && board.pulse(4) == 0 && abs(board.pulse(3) - 1500) < 5 })
        _ = central
    }

    @Test("A servo thread stuck in a bus write is reported as a failsafe")
    func stall() throws {
        let board = try RunningBoard(yaml: board(stallMs: 200))
        let central = try board.drivingCentral()
        board.bus.injectFault(.stall, at: I2CAddress(0x40)!, for: .milliseconds(800))
        try central.send(FrameEncoder.encode(.servo(channel: 0, value: 100)))
        #expect(eventually { (try? board.servo().failsafe)?.contains("stalled") == true })
        #expect(try board.runtime.status().led?.pattern == "fast-blink" || eventually { (try? board.runtime.status().led?.pattern) == "fast-blink" })
    }

    @Test("Stopping the board switches every output off")
    func stopAllOff() throws {
        let board = try RunningBoard(yaml: board())
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
        let end = ContinuousClock.now + .seconds(2)
        var round = 0
        while ContinuousClock.now < end {
            round += 1
            // Two full lines per round: far more than the display can take.
            try lcdCentral.send(FrameEncoder.encode(.lcdText(line: 0, text: Array("flood \(round) ABCDEFGHIJ".utf8))) + FrameEncoder.encode(.lcdText(line: 1, text: Array("\(round) abcdefghijklmnop".utf8))))
            try servoCentral.send(FrameEncoder.encode(.servo(channel: 0, value: UInt16(round % 1000))))
            usleep(2_000)
        }
        let servo = try board.servo()
        #expect(servo.maxBusWaitUs > 0, "the flood never contended with the servo path; the test proved nothing")
        #expect(servo.maxLcdChunksWaited <= 1)
        #expect((try board.runtime.status().lcd?.busWrites ?? 0) > 10)
    }
}
