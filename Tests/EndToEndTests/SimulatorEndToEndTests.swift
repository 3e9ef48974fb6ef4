import BLEControlProtocol
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// One PCA9685 step at 50 Hz and 25 MHz: 1 / (25 MHz / (4096 × 122)) / 4096
/// ≈ 4.88 µs (datasheet §7.3.5 prescale 121).
private let pulseStep = 4.9

private let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// The original library's byte sequences (docs/protocol.md golden vectors).
private enum Bytes {
    static let initialize: [UInt8] = [0x00, 0x00]
    static let enable0: [UInt8] = [0x01, 0x02, 0x00, 0x01]
    static let servo0At500: [UInt8] = [0x02, 0x03, 0x00, 0x01, 0xF4]
    static let servo1At500: [UInt8] = [0x02, 0x03, 0x01, 0x01, 0xF4]
    static let lcdHello: [UInt8] = [0x04, 0x07, 0x00] + Array("Hello".utf8) + [0x00]
    static let unknown9: [UInt8] = [0x09, 0x00]
    static let error9: [UInt8] = [0xFF, 0x01, 0x09]
}

// One daemon at a time: each test starts its own on free ports, and two
// cores are busy enough with one.
@Suite("blecontrold on the simulator board, end to end", .serialized)
struct SimulatorEndToEndTests {
    @Test("servo(0, 500) on an enabled channel → 1500 µs; a disabled channel has no pulse; LCD shows Hello; command 9 → FF 01 09")
    func issueScenario() throws {
        let daemon = try SimulatorDaemon()
        let central = try LoopbackTCPClient(port: daemon.tcpPort)
        try central.send(Bytes.initialize)
        try central.send(Bytes.enable0)
        try central.send(Bytes.servo0At500)
        try central.send(Bytes.servo1At500)
        try central.send(Bytes.lcdHello)

        let status = try daemon.waitFor("channel 0 at 1500 µs and Hello on the LCD") { status in
            guard let pulse = status.pulse(0) else { return false }
            return abs(pulse - 1500) <= pulseStep && status.lcdLines.first?.hasPrefix("Hello") == true
        }
        #expect(abs((status.pulse(0) ?? 0) - 1500) <= pulseStep)
        #expect(status.pulse(1) == 0, "channel 1 was never enabled")
        #expect(status.channel(1)?["enabled"] as? Bool == false)
        #expect(status.lcdLines.first == "Hello" + String(repeating: " ", count: 11))
        #expect(status.lcdLines.count == 2)

        try central.send(Bytes.unknown9)
        #expect(central.receive(count: 3) == Bytes.error9)
        #expect(daemon.isRunning)
    }

    @Test("The original demo app's whole session: enable 0-7, servo sliders 0-3, PWM sliders 4-7 (a negative one too), switches 0-3, two LCD lines, leaving the screen")
    func demoAppSession() throws {
        let daemon = try SimulatorDaemon()
        let app = try LoopbackTCPClient(port: daemon.tcpPort)
        // On connect: every analog output enabled (with response each).
        for channel in UInt8(0)...7 { try app.send(FrameEncoder.encode(.enable(channel: channel, on: true))) }
        // The app resends every set value of a kind whenever one changes:
        // the servo sliders as they are moved one after another.
        let servos: [UInt16] = [100, 400, 700, 1000]
        for moved in 0..<servos.count {
            for channel in 0...moved { try app.send(FrameEncoder.encode(.servo(channel: UInt8(channel), value: servos[channel]))) }
        }
        // PWM sliders built from an Int16: -0.5 arrives as FE 0C.
        let pwm: [Int16] = [250, 500, 1000, -500]
        for (offset, value) in pwm.enumerated() {
            try app.send(FrameEncoder.encode(.pwm(channel: UInt8(4 + offset), value: UInt16(bitPattern: value))))
        }
        #expect(FrameEncoder.encode(.pwm(channel: 7, value: UInt16(bitPattern: -500))) == [0x03, 0x03, 0x07, 0xFE, 0x0C])
        // The four switches (without response), then the two LCD lines.
        for (index, on) in [true, false, true, true].enumerated() {
            try app.send([0x06, 0x02, UInt8(index), on ? 1 : 0])
        }
        try app.send([0x04, 0x0C, 0x00] + Array("BLEControl".utf8) + [0x00])
        try app.send([0x04, 0x0A, 0x01] + Array("Demo app".utf8) + [0x00])

        // Every output is read back from the emulated chips and the LCD,
        // which the servo and LCD threads write when they get to it: one
        // status that shows all of them, not one that shows the first few.
        _ = try daemon.waitFor("the demo app's outputs") { status in
            (0..<4).allSatisfy { abs((status.pulse($0) ?? 0) - (1000 + Double(servos[$0]))) <= pulseStep }
                && status.switchStates == [true, false, true, true] && status.lcdLines == ["BLEControl      ", "Demo app        "]
                && abs((status.duty(4) ?? 0) - 0.25) < 0.001 && abs((status.duty(5) ?? 0) - 0.5) < 0.001 && status.duty(6) == 1
                // A negative PWM value is 100 %, as the original board showed it.
                && status.duty(7) == 1
        }
        // Nothing the app sent drew an ERROR: the first reply on the
        // connection is the one this deliberately bad frame draws.
        try app.send(Bytes.unknown9)
        #expect(app.receive(count: 3) == Bytes.error9)

        // Leaving the control screen: every output disabled, the session stays.
        for channel in UInt8(0)...7 { try app.send(FrameEncoder.encode(.enable(channel: channel, on: false))) }
        let left = try daemon.waitFor("every channel stopped") { status in (0...7).allSatisfy { status.pulse($0) == 0 } }
        #expect((left["sessions"] as? [[String: Any]])?.count == 1)
        #expect((left["servo"] as? [String: Any])?["failsafe"] == nil || (left["servo"] as? [String: Any])?["failsafe"] is NSNull)
    }

    @Test("A hand-typed LCD_TEXT without its 0x00 is shown at once and does not swallow the next frame")
    func handTypedText() throws {
        let daemon = try SimulatorDaemon()
        let central = try LoopbackTCPClient(port: daemon.tcpPort)
        try central.send(Bytes.enable0)
        try central.send([0x04, 0x04, 0x00, 0x41, 0x42, 0x43])
        _ = try daemon.waitFor("ABC on the top line") { $0.lcdLines.first?.hasPrefix("ABC ") == true }
        try central.send(Bytes.servo0At500)
        _ = try daemon.waitFor("channel 0 at 1500 µs") { abs(($0.pulse(0) ?? 0) - 1500) <= pulseStep }
        // In one write, too.
        try central.send([0x04, 0x04, 0x01, 0x44, 0x45, 0x46] + FrameEncoder.encode(.servo(channel: 0, value: 0)))
        _ = try daemon.waitFor("DEF and channel 0 at 1000 µs") { abs(($0.pulse(0) ?? 0) - 1000) <= pulseStep && $0.lcdLines.last?.hasPrefix("DEF ") == true }
        // A partial frame that expires is answered with ERROR for its command.
        try central.send([0x02, 0x03, 0x00])
        #expect(central.receive(count: 3) == [0xFF, 0x01, 0x02])
    }

    @Test("The same frames merged into one write and split byte by byte")
    func splitAndMerged() throws {
        // The longest idle timeout a board file takes: however long a busy
        // machine keeps this test from sending its next byte, no partial
        // frame is dropped (handTypedText waits for one that is).
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("blecontrol-split-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let board = directory.appendingPathComponent("board.yaml")
        let simulator = try String(contentsOf: repositoryRoot.appendingPathComponent("board/simulator.yaml"), encoding: .utf8)
        try #require(simulator.contains("idle_timeout_ms: 500 "))
        try simulator.replacingOccurrences(of: "idle_timeout_ms: 500 ", with: "idle_timeout_ms: 60000 ").write(to: board, atomically: true, encoding: .utf8)
        let daemon = try SimulatorDaemon(extraArguments: ["--board", board.path])
        let merged = try LoopbackTCPClient(port: daemon.tcpPort)
        try merged.send(Bytes.initialize + Bytes.enable0 + Bytes.servo0At500 + Bytes.lcdHello + Bytes.unknown9 + FrameEncoder.encode(.servo(channel: 0, value: 250)))
        #expect(merged.receive(count: 3) == Bytes.error9)
        _ = try daemon.waitFor("channel 0 at 1250 µs") { abs(($0.pulse(0) ?? 0) - 1250) <= pulseStep }

        let trickle = try LoopbackTCPClient(port: daemon.tcpPort)
        for byte in Bytes.enable0 + FrameEncoder.encode(.servo(channel: 0, value: 1000)) + Bytes.unknown9 + FrameEncoder.encode(.lcdText(line: 1, text: Array("byte by byte".utf8))) {
            try trickle.send([byte])
            usleep(2_000)
        }
        #expect(trickle.receive(count: 3) == Bytes.error9)
        let status = try daemon.waitFor("channel 0 at 2000 µs and line 1") {
            abs(($0.pulse(0) ?? 0) - 2000) <= pulseStep && $0.lcdLines.last?.hasPrefix("byte by byte") == true
        }
        #expect(status.lcdLines == ["Hello           ", "byte by byte    "])
    }

    @Test("Disabling a channel stops its pulse; enabling it again restores the value")
    func enableDisable() throws {
        let daemon = try SimulatorDaemon()
        let central = try LoopbackTCPClient(port: daemon.tcpPort)
        try central.send(FrameEncoder.encode(.enable(channel: 2, on: true)) + FrameEncoder.encode(.servo(channel: 2, value: 700)))
        _ = try daemon.waitFor("channel 2 at 1700 µs") { abs(($0.pulse(2) ?? 0) - 1700) <= pulseStep }
        try central.send(FrameEncoder.encode(.enable(channel: 2, on: false)))
        _ = try daemon.waitFor("channel 2 off") { $0.pulse(2) == 0 }
        try central.send(FrameEncoder.encode(.enable(channel: 2, on: true)))
        _ = try daemon.waitFor("channel 2 back at 1700 µs") { abs(($0.pulse(2) ?? 0) - 1700) <= pulseStep }
    }

    @Test("The CLI drives the board and reports ERROR replies")
    func cli() throws {
        let daemon = try SimulatorDaemon()
        #expect(try daemon.cli(["enable", "3", "on"]).status == 0)
        #expect(try daemon.cli(["servo", "3", "250"]).status == 0)
        #expect(try daemon.cli(["lcd", "1", "from the CLI"]).status == 0)
        let status = try daemon.waitFor("channel 3 at 1250 µs") { abs(($0.pulse(3) ?? 0) - 1250) <= pulseStep }
        #expect(status.lcdLines.last == "from the CLI    ")

        let refused = try daemon.cli(["send", "09 00"])
        #expect(refused.status == 1)
        #expect(refused.stdout.contains("ERROR for command 9"))
        let outOfRange = try daemon.cli(["servo", "200", "10"])
        #expect(outOfRange.status == 1, "channel 200 is not on the board")
        #expect(try daemon.cli(["clear"]).status == 0)
        _ = try daemon.waitFor("a blank display") { $0.lcdLines.allSatisfy { $0.allSatisfy { $0 == " " } } }

        let text = try daemon.cli(["status"])
        #expect(text.status == 0)
        #expect(text.stdout.contains("board simulator"))
        let watch = try daemon.cli(["watch", "--count", "2", "--interval", "50"])
        #expect(watch.status == 0)
        #expect(watch.stdout.components(separatedBy: "board simulator").count == 3)

        let counters = try daemon.status()["counters"] as? [String: Any]
        #expect((counters?["errors"] as? Int ?? 0) >= 2)
        #expect((counters?["frames"] as? Int ?? 0) >= 4)
    }

    @Test("Garbage on the TCP port never stops the daemon; sessions come and go")
    func garbage() throws {
        let daemon = try SimulatorDaemon()
        var generator = SplitMix64(seed: 0xB1EC0)
        for round in 0..<20 {
            let client = try LoopbackTCPClient(port: daemon.tcpPort)
            let count = Int(generator.next() % 4096) + 1
            let bytes = (0..<count).map { _ in UInt8(truncatingIfNeeded: generator.next()) }
            try? client.send(bytes)
            if round % 2 == 0 { _ = client.receive(count: 1, timeout: .milliseconds(20)) }
        }
        #expect(daemon.isRunning)
        let central = try LoopbackTCPClient(port: daemon.tcpPort)
        // A central starts with a frame (INIT): a first unknown command is
        // no central's, and closes the connection.
        try central.send(Bytes.initialize + Bytes.unknown9)
        #expect(central.receive(count: 3) == Bytes.error9)
        let status = try daemon.status()
        #expect(((status["counters"] as? [String: Any])?["errors"] as? Int ?? 0) > 0)
        // The 20 garbage sessions are gone; the last central and maybe the
        // status query's own control session remain.
        _ = try daemon.waitFor("garbage sessions closed") { (($0["sessions"] as? [[String: Any]])?.filter { ($0["transport"] as? String) == "tcp" }.count) == 1 }
        #expect(daemon.stop() == 0)
    }

    @Test("SIGTERM stops the daemon with every output off and exit status 0")
    func sigterm() throws {
        let daemon = try SimulatorDaemon()
        let central = try LoopbackTCPClient(port: daemon.tcpPort)
        try central.send(Bytes.enable0 + Bytes.servo0At500)
        _ = try daemon.waitFor("channel 0 running") { ($0.pulse(0) ?? 0) > 0 }
        #expect(daemon.stop() == 0)
        #expect(daemon.log(tail: 5).contains("every output off"))
        #expect(central.isClosedByPeer)
    }

    @Test("Garbage on the control socket gets error replies, never a crash")
    func controlGarbage() throws {
        let daemon = try SimulatorDaemon()
        func answered(_ count: Int) -> (String) -> Bool { { $0.utf8.count { $0 == UInt8(ascii: "\n") } >= count } }
        let answers = try daemon.rawControl(Array("not json\n{\"op\":\"fly\"}\n{\"op\":\"send\",\"hex\":\"zz\"}\n{\"op\":\"send\",\"hex\":\"0900\"}\n".utf8),
                                            until: answered(4))
        let lines = answers.split(separator: "\n")
        #expect(lines.count == 4, "\(answers)")
        #expect(lines.prefix(3).allSatisfy { $0.contains("\"ok\":false") })
        #expect(lines.last?.contains("ff0109") == true)
        // Random bytes: a line (and an error answer) every 256 bytes or so,
        // none near the 64 KiB a line may have. All answered: the daemon
        // has been through every byte of it.
        var generator = SplitMix64(seed: 7)
        let garbage = (0..<200_000).map { _ in UInt8(truncatingIfNeeded: generator.next()) }
        let lineCount = garbage.count { $0 == UInt8(ascii: "\n") }
        let garbageAnswers = try daemon.rawControl(garbage, until: answered(lineCount))
        #expect(garbageAnswers.utf8.count { $0 == UInt8(ascii: "\n") } == lineCount)
        #expect(daemon.isRunning)
        #expect(try daemon.cli(["status"]).status == 0)
    }

    @Test("systemd: READY=1 once listening, WATCHDOG=1 from the servo thread, STATUS on failsafe, STOPPING on SIGTERM")
    func sdNotify() throws {
        let notify = try NotifySocket()
        let daemon = try SimulatorDaemon(environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "200000"])
        // Pings again and again (every 100 ms, half of WATCHDOG_USEC, when
        // the machine lets it: how often is not this test's business).
        var messages = notify.messages { $0.contains { $0.contains("READY=1") } && $0.filter { $0 == "WATCHDOG=1" }.count >= 3 }
        #expect(messages.contains { $0.contains("READY=1") }, "\(messages)")
        #expect(messages.filter { $0 == "WATCHDOG=1" }.count >= 3, "\(messages)")
        var central: LoopbackTCPClient? = try LoopbackTCPClient(port: daemon.tcpPort)
        try central?.send(Bytes.enable0 + Bytes.servo0At500)
        _ = try daemon.waitFor("channel 0 running") { ($0.pulse(0) ?? 0) > 0 }
        central = nil  // the central in control of channel 0 leaves: failsafe
        messages = notify.messages { $0.contains { $0.hasPrefix("STATUS=failsafe: central left: tcp") } }
        #expect(messages.contains { $0.hasPrefix("STATUS=failsafe: central left: tcp") }, "\(messages)")
        daemon.process.interrupt()  // SIGINT: the same orderly stop as SIGTERM
        messages = notify.messages { $0.contains { $0.hasPrefix("STOPPING=1") } }
        #expect(messages.contains { $0.hasPrefix("STOPPING=1") }, "\(messages)")
    }

    @Test("A second daemon for the same board refuses to start before it touches a device; the first keeps running")
    func secondDaemon() throws {
        let daemon = try SimulatorDaemon()
        let second = try run(Executables.daemon, ["--socket", daemon.socketPath, "--tcp", "127.0.0.1:0"])
        #expect(second.status == 1)
        #expect(second.stderr.contains("already runs this board"), "\(second.stderr)")
        #expect(!second.stderr.contains("PCA9685 initialised"), "the second daemon initialised the chip: \(second.stderr)")
        #expect(daemon.isRunning)
        #expect(try daemon.cli(["status"]).status == 0)
    }

    @Test("board/raspberry-pi.yaml on a machine without its devices: a clear failure, not a crash",
          .enabled(if: !FileManager.default.fileExists(atPath: "/dev/i2c-1")))
    func raspberryPiWithoutHardware() throws {
        let board = repositoryRoot.appendingPathComponent("board/raspberry-pi.yaml").path
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("pi-\(UUID().uuidString.prefix(6))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: directory) }
        let socket = directory.appendingPathComponent("control.sock").path
        let result = try run(Executables.daemon, ["--board", board, "--socket", socket])
        #expect(result.status == 1)
        #expect(result.stderr.contains("/dev/i2c-1 does not exist"), "\(result.stderr)")
        let safe = try run(Executables.daemon, ["safe-outputs", "--board", board])
        #expect(safe.status == 1)
        #expect(safe.stderr.contains("/dev/i2c-1"))
    }

    @Test("Values mean what the user thinks: servo and pwm take 0…1000 (µs and negatives refused, named with the unit) unless --raw; ERROR replies say why; a channel not enabled is named")
    func valuesAndReasons() throws {
        let daemon = try SimulatorDaemon()
        for (arguments, words) in [(["servo", "0", "1500"], ["0…1000", "1000…2000 µs", "got 1500", "`blecontrol servo 0 500`", "--raw"]),
                                   (["servo", "0", "-5"], ["0…1000", "got -5"]),
                                   (["servo", "0", "70000"], ["0…1000", "got 70000"]),
                                   (["pwm", "4", "1001"], ["per mille", "got 1001"])] {
            let refused = try daemon.cli(arguments)
            #expect(refused.status == 2, "\(arguments)")
            for word in words { #expect(refused.stderr.contains(word), "\(arguments): \(refused.stderr)") }
        }
        // Nothing of them reached the board.
        #expect(try daemon.status().channel(0)?["value"] == nil)
        let raw = try daemon.cli(["servo", "0", "-5", "--raw"])
        #expect(raw.status == 0, "\(raw.stderr)")
        _ = try daemon.waitFor("channel 0's value 65531, the original app's Int16 as sent") { $0.channel(0)?["value"] as? Int == 65531 }
        let notEnabled = try daemon.cli(["servo", "1", "500"])
        #expect(notEnabled.status == 0)
        #expect(notEnabled.stderr.contains("channel 1 is not enabled") && notEnabled.stderr.contains("blecontrol enable 1 on"), "\(notEnabled.stderr)")
        #expect(try daemon.cli(["enable", "1", "on"]).status == 0)
        #expect(!(try daemon.cli(["servo", "1", "500"]).stderr.contains("not enabled")))
        for (arguments, reason) in [(["servo", "12", "500"], "channel 12 is not on board simulator (channels 0-7)"),
                                    (["lcd", "5", "hi"], "line 5 is not on board simulator's 2-line LCD (lines 0-1)"),
                                    (["switch", "7", "on"], "switch 7 is not on board simulator (switches 0-3)")] {
            let refused = try daemon.cli(arguments)
            #expect(refused.status == 1)
            #expect(refused.stdout.contains(reason), "\(arguments): \(refused.stdout)")
        }
    }

    @Test("blecontrol pulse: µs through the channel's calibration (inverted, widened); outside it, a PWM channel, a missing channel and --ble refused with the reason")
    func pulseInMicroseconds() throws {
        let simulator = try String(contentsOf: repositoryRoot.appendingPathComponent("board/simulator.yaml"), encoding: .utf8)
        let calibrated = simulator.replacingOccurrences(of: "{ channel: 1, output: 1, role: servo, min_us: 1000, max_us: 2000 }",
                                                        with: "{ channel: 1, output: 1, role: servo, min_us: 600, max_us: 2400, invert: true }")
        #expect(calibrated != simulator, "board/simulator.yaml's channel 1 line moved: the test's replacement no longer applies")
        let board = FileManager.default.temporaryDirectory.appendingPathComponent("pulse-\(UUID().uuidString.prefix(6)).yaml")
        try calibrated.write(to: board, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: board) }
        let daemon = try SimulatorDaemon(extraArguments: ["--board", board.path])
        #expect(try daemon.cli(["enable", "0", "on"]).status == 0)
        #expect(try daemon.cli(["enable", "1", "on"]).status == 0)
        #expect(try daemon.cli(["pulse", "0", "1750"]).status == 0)
        _ = try daemon.waitFor("channel 0 at 1750 µs") { abs(($0.pulse(0) ?? 0) - 1750) < 5 }
        // Inverted and widened: 2300 µs is a SERVO_VAL near its far end, and
        // the chip produces 2300 µs, not the nominal 1000 + value.
        let wide = try daemon.cli(["pulse", "1", "2300us"])
        #expect(wide.status == 0, "\(wide.stderr)")
        _ = try daemon.waitFor("channel 1 at 2300 µs") { abs(($0.pulse(1) ?? 0) - 2300) < 5 }
        for (arguments, reason, status) in [(["pulse", "0", "2400"], "2400 µs is outside channel 0's calibration (1000…2000 µs)", Int32(1)),
                                            (["pulse", "4", "1500"], "channel 4 is a PWM channel", 1),
                                            (["pulse", "12", "1500"], "there is no channel 12", 1),
                                            (["pulse", "0", "fast"], "must be a pulse width in µs", 2),
                                            (["pulse", "0", "1500", "--ble", "Board"], "calibration", 2)] {
            let refused = try daemon.cli(arguments)
            #expect(refused.status == status, "\(arguments): \(refused.stderr)")
            #expect(refused.stderr.contains(reason), "\(arguments): \(refused.stderr)")
        }
        #expect(abs((try daemon.status().pulse(0) ?? 0) - 1750) < 5, "a refused pulse moves nothing")
        let notEnabled = try daemon.cli(["pulse", "2", "1500"])
        #expect(notEnabled.status == 0 && notEnabled.stderr.contains("channel 2 is not enabled"), "\(notEnabled.stderr)")
    }

    @Test("blecontrol servo --over: a timed move through the control socket, in steps; --over over the air is refused")
    func timedMoveFromTheCLI() throws {
        let daemon = try SimulatorDaemon()
        #expect(try daemon.cli(["enable", "0", "on"]).status == 0)
        #expect(try daemon.cli(["servo", "0", "0"]).status == 0)
        _ = try daemon.waitFor("channel 0 at 1000 µs") { abs(($0.pulse(0) ?? 0) - 1000) < 5 }
        let moved = try daemon.cli(["servo", "0", "1000", "--over", "400ms"])
        #expect(moved.status == 0, "\(moved.stderr)")
        // Its steps are MotionTests' (virtual time) and RunningMotionTests'
        // (the chip's history); here, that the CLI's move arrives.
        _ = try daemon.waitFor("channel 0 at 2000 µs") { abs(($0.pulse(0) ?? 0) - 2000) < 5 }
        for arguments in [["servo", "0", "500", "--over", "1s", "--ble", "Board"], ["servo", "0", "500", "--over", "fast"],
                          ["pulse", "0", "1500", "--over", "0"]] {
            let refused = try daemon.cli(arguments)
            #expect(refused.status == 2 && refused.stderr.contains("--over"), "\(arguments): \(refused.stderr)")
        }
    }

    @Test("blecontrol failsafe clear: the operator ends a failsafe on purpose; logged with who; the outputs stay where it put them")
    func operatorClearsFailsafe() throws {
        let daemon = try SimulatorDaemon()
        #expect(try daemon.cli(["failsafe", "clear"]).stdout.contains("no failsafe"))
        do {
            // The README's TCP example: a central that commands, then leaves.
            let central = try LoopbackTCPClient(port: daemon.tcpPort)
            try central.send(FrameEncoder.encode(.enable(channel: 4, on: true)) + FrameEncoder.encode(.pwm(channel: 4, value: 500)))
            _ = try daemon.waitFor("channel 4 at 50 %") { abs(($0.duty(4) ?? 0) - 0.5) < 0.001 }
        }
        _ = try daemon.waitFor("the failsafe") { (($0["servo"] as? [String: Any])?["failsafe"] as? String)?.hasPrefix("central left: tcp") == true }
        let cleared = try daemon.cli(["failsafe", "clear"])
        #expect(cleared.status == 0, "\(cleared.stderr)")
        #expect(cleared.stdout.contains("failsafe cleared (was: central left: tcp"), "\(cleared.stdout)")
        let after = try daemon.status()
        #expect((after["servo"] as? [String: Any])?["failsafe"] == nil)
        #expect(after.duty(4) == 0, "PWM stays at its failsafe duty until a command moves it")
        #expect(daemon.log(tail: 40).contains("failsafe cleared by"), "who did it is logged")
        #expect(try daemon.cli(["failsafe", "open"]).status == 2)
    }

    @Test("Silent control-socket connections cannot lock the operator out: status answers beside 64 of them, and they are closed")
    func silentControlConnections() throws {
        let daemon = try SimulatorDaemon()
        var silent: [Int32] = []
        defer { for fd in silent { close(fd) } }
        for _ in 0..<64 {
            let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            guard fd >= 0, withUnixAddress(daemon.socketPath, { connect(fd, $0, $1) }) == 0 else { continue }
            silent.append(fd)
        }
        #expect(silent.count == 64)
        let status = try daemon.cli(["status"])
        #expect(status.status == 0, "\(status.stderr)")
        // Each silent one is closed in the end (the oldest at once, made way
        // for; the rest at their deadline): a read sees the end.
        var closed = 0
        for fd in silent {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            receiveChunks(from: fd, whenClosed: { closed += 1 }) { _ in true }
        }
        #expect(closed == silent.count)
        #expect(try daemon.cli(["status"]).status == 0)
    }

    @Test("The instance lock is never a link nor someone else's file: the daemon refuses, and the link's target is untouched")
    func instanceLockInASharedPlace() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("lock-\(UUID().uuidString.prefix(6))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: directory) }
        let target = directory.appendingPathComponent("precious").path
        try "precious\n".write(toFile: target, atomically: true, encoding: .utf8)
        let lock = directory.appendingPathComponent("blecontrold-simulator.lock").path
        symlink(target, lock)
        let socket = directory.appendingPathComponent("control.sock").path
        let linked = try run(Executables.daemon, ["--socket", socket, "--tcp", "127.0.0.1:0"])
        #expect(linked.status == 1)
        #expect(linked.stderr.contains("symbolic link"), "\(linked.stderr)")
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "precious\n")
        unlink(lock)
        // A directory anyone may write (as /tmp): refused before the lock.
        let shared = directory.appendingPathComponent("shared").path
        mkdir(shared, 0o777)
        chmod(shared, 0o1777)
        let inShared = try run(Executables.daemon, ["--socket", shared + "/control.sock", "--tcp", "127.0.0.1:0"])
        #expect(inShared.status == 1)
        #expect(inShared.stderr.contains("is writable by others"), "\(inShared.stderr)")
        #expect(!FileManager.default.fileExists(atPath: shared + "/blecontrold-simulator.lock"))
        if geteuid() == 0 {
            // Made first by another user (nobody).
            try "".write(toFile: lock, atomically: false, encoding: .utf8)
            chown(lock, 65534, 65534)
            let theirs = try run(Executables.daemon, ["--socket", socket, "--tcp", "127.0.0.1:0"])
            #expect(theirs.status == 1)
            #expect(theirs.stderr.contains("someone else made it"), "\(theirs.stderr)")
        }
    }

    @Test("safe-outputs: the daemon's record first, whatever the board file says since; without one, the board file read leniently")
    func safeOutputsRecordFirst() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("record-\(UUID().uuidString.prefix(6))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(at: directory) }
        let record = directory.appendingPathComponent("driven-outputs").path
        // A board the daemon ran: its chip at 0x41 on a bus this machine lacks.
        let ran = directory.appendingPathComponent("ran.yaml")
        try "name: pi\nbuses:\n  i2c:\n    device: /dev/i2c-97\nservo:\n  bus: i2c\n  address: 0x41\n  channels:\n    - channel: 0\n      role: servo\n".write(to: ran, atomically: true, encoding: .utf8)
        let started = try run(Executables.daemon, ["--board", ran.path, "--record", record, "--socket", directory.appendingPathComponent("s").path])
        #expect(started.status == 1, "\(started.stderr)")  // no /dev/i2c-97 here
        // The record was written before the start failed: before any output.
        #expect(FileManager.default.fileExists(atPath: record))
        // Since then the file was edited: a typo, and another chip address.
        let edited = directory.appendingPathComponent("edited.yaml")
        try "name: pi\nbuses:\n  i2c:\n    device: /dev/i2c-98\nservo:\n  bus: i2c\n  address: 0x40\n  channels:\n    - channel: 0\n      role: servo\nlcd:\n  colums: 16\n".write(to: edited, atomically: true, encoding: .utf8)
        let fromRecord = try run(Executables.daemon, ["safe-outputs", "--record", record, "--board", edited.path])
        #expect(fromRecord.stdout.contains("chips and lines: from \(record)"), "\(fromRecord.stdout)")
        #expect(fromRecord.stderr.contains("PCA9685 0x41 on /dev/i2c-97"), "\(fromRecord.stderr)")
        #expect(!fromRecord.stderr.contains("i2c-98") && !fromRecord.stderr.contains("unknown key"), "\(fromRecord.stderr)")
        // A record anyone could have written is not believed.
        chmod(record, 0o666)
        let untrusted = try run(Executables.daemon, ["safe-outputs", "--record", record, "--board", edited.path])
        #expect(untrusted.stdout.contains("writable by group or others"), "\(untrusted.stdout)")
        // No record: the edited file, leniently: its chip, not its typo.
        try FileManager.default.removeItem(atPath: record)
        let fromBoard = try run(Executables.daemon, ["safe-outputs", "--record", record, "--board", edited.path])
        #expect(fromBoard.stdout.contains("no record at \(record); from the board file \(edited.path), read leniently"), "\(fromBoard.stdout)")
        #expect(fromBoard.stderr.contains("PCA9685 0x40 on /dev/i2c-98"), "\(fromBoard.stderr)")
        #expect(fromBoard.status == 1)
        // A link where the record should be is not followed.
        symlink(ran.path, record)
        let linked = try run(Executables.daemon, ["safe-outputs", "--record", record, "--board", edited.path])
        #expect(linked.stdout.contains("record not used"), "\(linked.stdout)")
    }

    @Test("A bad board file or bad arguments: a clear message and exit status 2")
    func badBoardFile() throws {
        let directory = FileManager.default.temporaryDirectory
        let board = directory.appendingPathComponent("bad-board-\(UUID().uuidString.prefix(6)).yaml")
        try "name: bad\nbuses:\n  main:\n    emulated: true\nservo:\n  address: 0x99\n  channels: []\n".write(to: board, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: board) }
        let result = try run(Executables.daemon, ["--board", board.path])
        #expect(result.status == 2)
        #expect(result.stderr.contains("\(board.path):6: servo.address: "), "\(result.stderr)")

        let missing = try run(Executables.daemon, ["--board", "/nonexistent.yaml"])
        #expect(missing.status == 2)
        #expect(missing.stderr.contains("/nonexistent.yaml"))
        #expect(try run(Executables.daemon, ["--tcp", "nowhere"]).status != 0)
        #expect(try run(Executables.daemon, ["--log-level", "loud"]).status != 0)

        let check = try run(Executables.daemon, ["--check-board"])
        #expect(check.status == 0)
    }

    @Test("Hostile board files: 20 000 nested brackets and a file over 1 MiB are refused with file:line and exit status 2, not a crash")
    func hostileBoardFiles() throws {
        let directory = FileManager.default.temporaryDirectory
        let nested = directory.appendingPathComponent("nested-\(UUID().uuidString.prefix(6)).yaml")
        try ("name: deep\nbuses: " + String(repeating: "[", count: 20_000) + String(repeating: "]", count: 20_000) + "\n")
            .write(to: nested, atomically: true, encoding: .utf8)
        let large = directory.appendingPathComponent("large-\(UUID().uuidString.prefix(6)).yaml")
        // A flow list of 300 000 entries: 1.5 MB.
        try ("name: big\nbuses: [" + String(repeating: "1111, ", count: 300_000) + "1]\n").write(to: large, atomically: true, encoding: .utf8)
        defer {
            try? FileManager.default.removeItem(at: nested)
            try? FileManager.default.removeItem(at: large)
        }
        for arguments in [["--check-board"], []] {
            let deep = try run(Executables.daemon, ["--board", nested.path] + arguments)
            #expect(deep.status == 2, "\(deep.stderr)")
            #expect(deep.stderr.contains("\(nested.path):2: "), "\(deep.stderr)")
            #expect(deep.stderr.contains("nested deeper than"), "\(deep.stderr)")
            let big = try run(Executables.daemon, ["--board", large.path] + arguments)
            #expect(big.status == 2, "\(big.stderr)")
            #expect(big.stderr.contains("\(large.path):1: "), "\(big.stderr)")
        }
    }
}
