import BLEControlProtocol
import DeviceEmulators
import Foundation
import Hardware
import Testing
import TestSupport
@testable import Firmware
@testable import Runtime
import Board
import Control
import Reactor

@Suite("Firmware core on an emulated board", .serialized)
struct FirmwareCoreTests {
    @Test("SERVO_VAL on an enabled channel produces 1000 + value µs; nothing before ANALOG_OUT_EN")
    func servoValue() throws {
        let board = try EmulatedBoard()
        let session = board.session()
        session.receive([0x02, 0x03, 0x00, 0x01, 0xF4])
        #expect(board.settle() == nil)
        #expect(board.pulse(0) == 0, "a channel is stopped until enabled")
        session.receive([0x01, 0x02, 0x00, 0x01])
        #expect(board.settle() == nil)
        #expect(abs(board.pulse(0) - 1500) <= pulseStep)
        session.receive([0x01, 0x02, 0x00, 0x00])
        #expect(board.settle() == nil)
        #expect(board.pulse(0) == 0)
        session.receive([0x01, 0x02, 0x00, 0x01])
        #expect(board.settle() == nil)
        #expect(abs(board.pulse(0) - 1500) <= pulseStep, "the value survives a stop")
        #expect(board.takeReplies().isEmpty)
    }

    @Test("Servo and ESC channels clamp to their limits; PWM channels take duty", arguments: [
        (UInt8(0), Message.servo(channel: 0, value: 5000), 2000.0),
        (UInt8(4), Message.servo(channel: 4, value: 65535), 2000.0),
        (UInt8(0), Message.pwm(channel: 0, value: 75), 1500.0),
        (UInt8(0), Message.pwm(channel: 0, value: 1000), 2000.0),
        (UInt8(6), Message.servo(channel: 6, value: 500), 1500.0),
    ])
    func limits(channel: UInt8, message: Message, expected: Double) throws {
        let board = try EmulatedBoard()
        let session = board.session()
        session.receive(FrameEncoder.encode(.enable(channel: channel, on: true)) + FrameEncoder.encode(message))
        #expect(board.settle() == nil)
        #expect(abs(board.pulse(Int(channel)) - expected) <= pulseStep)
    }

    @Test("PWM_VAL on a pwm channel is a duty cycle")
    func pwmDuty() throws {
        let board = try EmulatedBoard()
        let session = board.session()
        session.receive(FrameEncoder.encode(.enable(channel: 7, on: true)) + FrameEncoder.encode(.pwm(channel: 7, value: 250)))
        #expect(board.settle() == nil)
        #expect(abs(board.chip.output(channel: 7).duty - 0.25) < 0.001)
        session.receive(FrameEncoder.encode(.pwm(channel: 7, value: 1000)))
        #expect(board.settle() == nil)
        #expect(board.chip.output(channel: 7).duty == 1)
    }

    @Test("Inverted channels mirror the range")
    func inverted() throws {
        let yaml = EmbeddedBoards.simulator.replacingOccurrences(of: "{ channel: 1, output: 1, role: servo, min_us: 1000, max_us: 2000 }", with: "{ channel: 1, output: 1, role: servo, min_us: 1000, max_us: 2000, invert: true }")
        let board = try EmulatedBoard(yaml: yaml)
        let session = board.session()
        session.receive(FrameEncoder.encode(.enable(channel: 1, on: true)) + FrameEncoder.encode(.servo(channel: 1, value: 200)))
        #expect(board.settle() == nil)
        #expect(abs(board.pulse(1) - 1800) <= pulseStep)
    }

    @Test("Calibration maps 1000/1500/2000 µs onto the channel's min/center/max", arguments: [
        (UInt16(0), 600.0), (250, 1000.0), (500, 1400.0), (750, 1900.0), (1000, 2400.0), (3000, 2400.0),
    ])
    func calibration(value: UInt16, expected: Double) throws {
        let yaml = EmbeddedBoards.simulator.replacingOccurrences(of: "{ channel: 2, output: 2, role: servo, min_us: 1000, max_us: 2000 }", with: "{ channel: 2, output: 2, role: servo, min_us: 600, center_us: 1400, max_us: 2400 }")
        let board = try EmulatedBoard(yaml: yaml)
        let session = board.session()
        session.receive(FrameEncoder.encode(.enable(channel: 2, on: true)) + FrameEncoder.encode(.servo(channel: 2, value: value)))
        #expect(board.settle() == nil)
        #expect(abs(board.pulse(2) - expected) <= pulseStep)
    }

    @Test("ERROR replies: unknown command, bad length, channel or line out of range, ERROR from a central")
    func errors() throws {
        let board = try EmulatedBoard()
        let session = board.session()
        let cases: [([UInt8], [UInt8])] = [
            ([0x09, 0x00], [0xFF, 0x01, 0x09]),
            (FrameEncoder.encode(.servo(channel: 20, value: 1)), [0xFF, 0x01, 0x02]),
            (FrameEncoder.encode(.pwm(channel: 8, value: 1)), [0xFF, 0x01, 0x03]),
            (FrameEncoder.encode(.enable(channel: 99, on: true)), [0xFF, 0x01, 0x01]),
            (FrameEncoder.encode(.lcdText(line: 2, text: Array("x".utf8))), [0xFF, 0x01, 0x04]),
            ([0x02, 0x02, 0x00, 0x01], [0xFF, 0x01, 0x02]),
            ([0xFF, 0x01, 0x02], [0xFF, 0x01, 0xFF]),
        ]
        for (input, reply) in cases {
            session.receive(input)
            #expect(board.takeReplies() == reply, "for \(input)")
        }
        #expect(board.dispatcher.counters.errors == cases.count)
        // After all that, a good frame still works.
        session.receive(FrameEncoder.encode(.enable(channel: 2, on: true)) + FrameEncoder.encode(.servo(channel: 2, value: 0)))
        #expect(board.settle() == nil)
        #expect(abs(board.pulse(2) - 1000) <= pulseStep)
    }

    @Test("LCD_TEXT and LCD_CLEAR reach the emulated display")
    func lcd() throws {
        let board = try EmulatedBoard()
        let session = board.session()
        session.receive([0x04, 0x07, 0x00] + Array("Hello".utf8) + [0x00])
        session.receive(FrameEncoder.encode(.lcdText(line: 1, text: Array("a line much longer than sixteen".utf8))))
        #expect(board.settle() == nil)
        #expect(board.lines == ["Hello           ", "a line much long"])
        session.receive(FrameEncoder.encode(.lcdText(line: 0, text: Array("Hi".utf8))))
        #expect(board.settle() == nil)
        #expect(board.lines == ["Hi              ", "a line much long"])
        session.receive(FrameEncoder.encode(.lcdClear))
        #expect(board.settle() == nil)
        #expect(board.lines == [String(repeating: " ", count: 16), String(repeating: " ", count: 16)])
        #expect(board.display.lcd.violations.isEmpty, "\(board.display.lcd.violations)")
    }

    @Test("Latest value wins; fewer bus writes than frames")
    func latestWins() throws {
        let board = try EmulatedBoard()
        let session = board.session()
        session.receive(FrameEncoder.encode(.enable(channel: 0, on: true)))
        var frames: [UInt8] = []
        for value in 0...1000 { FrameEncoder.encode(.servo(channel: 0, value: UInt16(value)), into: &frames) }
        session.receive(frames)
        #expect(board.settle() == nil)
        #expect(abs(board.pulse(0) - 2000) <= pulseStep)
        let metrics = board.servo.snapshot().metrics
        #expect(metrics.busTransactions < 1001)
    }

    @Test("A partial frame idle past the timeout is discarded; the next frame decodes")
    func idleTimeout() throws {
        let board = try EmulatedBoard()
        let session = board.session(idleTimeout: .milliseconds(500))
        let start = ContinuousClock.now
        session.receive([0x02, 0x03, 0x00], at: start)
        #expect(session.deadline != nil)
        session.expire(at: start + .milliseconds(600))
        #expect(board.dispatcher.counters.discardedPartials == 1)
        session.receive(FrameEncoder.encode(.enable(channel: 0, on: true)) + FrameEncoder.encode(.servo(channel: 0, value: 500)), at: start + .milliseconds(700))
        #expect(board.settle() == nil)
        #expect(abs(board.pulse(0) - 1500) <= pulseStep)
    }

    @Test("A NACKing PCA9685 is reported and retried; values apply once it answers")
    func servoFault() throws {
        let board = try EmulatedBoard()
        let session = board.session()
        #expect(eventually { board.servo.snapshot().online })
        board.bus.injectFault(.noAcknowledge, at: I2CAddress(0x40)!, count: 3)
        session.receive(FrameEncoder.encode(.enable(channel: 0, on: true)) + FrameEncoder.encode(.servo(channel: 0, value: 250)))
        #expect(eventually { abs(board.pulse(0) - 1250) <= pulseStep })
        let snapshot = board.servo.snapshot()
        #expect(snapshot.metrics.failedFlushes >= 1)
        #expect(snapshot.online)
    }

    @Test("An LCD that is absent at start is drawn once it appears")
    func lcdAbsent() throws {
        let board = try EmulatedBoard(attachDisplay: false)
        let session = board.session()
        session.receive(FrameEncoder.encode(.lcdText(line: 0, text: Array("late".utf8))))
        #expect(eventually { board.lcd.snapshot().lastError != nil })
        #expect(board.lcd.snapshot().online == false)
        board.bus.attach(board.display, at: I2CAddress(0x27)!)
        #expect(eventually { board.lines.first == "late            " })
    }

    @Test("An LCD unplugged and plugged back in is initialised again and redrawn from the framebuffer; servos keep working")
    func lcdReplug() throws {
        let board = try EmulatedBoard()
        let session = board.session()
        session.receive(FrameEncoder.encode(.lcdText(line: 0, text: Array("before".utf8))))
        #expect(board.settle() == nil)
        #expect(board.lines.first == "before          ")
        // Unplugged: the backpack stops acknowledging and loses power.
        board.bus.detach(at: I2CAddress(0x27)!)
        board.display.powerCycle()
        session.receive(FrameEncoder.encode(.lcdText(line: 1, text: Array("while away".utf8))))
        #expect(eventually { board.lcd.snapshot().online == false })
        session.receive(FrameEncoder.encode(.enable(channel: 0, on: true)) + FrameEncoder.encode(.servo(channel: 0, value: 500)))
        #expect(eventually { abs(board.pulse(0) - 1500) <= pulseStep }, "servos keep working while the LCD is away")
        // Plugged back in: blank and uninitialised until the service notices.
        board.bus.attach(board.display, at: I2CAddress(0x27)!)
        #expect(eventually { board.lines == ["before          ", "while away      "] })
        #expect(board.display.lcd.isInitialized)
        #expect(board.lcd.snapshot().online)
    }

    @Test("Stopping the servo path switches every output off")
    func stopAllOff() throws {
        let board = try EmulatedBoard()
        let session = board.session()
        var frames: [UInt8] = []
        for channel in UInt8(0)..<8 {
            FrameEncoder.encode(.enable(channel: channel, on: true), into: &frames)
            FrameEncoder.encode(.servo(channel: channel, value: 500), into: &frames)
        }
        session.receive(frames)
        #expect(board.settle() == nil)
        #expect((0..<8).allSatisfy { board.pulse($0) > 0 })
        board.servo.stop()
        #expect((0..<16).allSatisfy { board.pulse($0) == 0 })
    }
}
