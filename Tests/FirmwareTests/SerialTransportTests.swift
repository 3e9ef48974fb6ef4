import BLEControlProtocol
import Board
import DeviceEmulators
import LinuxHardware
import Testing
import TestSupport
@testable import Firmware
@testable import Runtime

/// An `HM10Stream` fed as the serial transport feeds it, on injected time:
/// the boundary rule is a real decoder's (a session's), a `.lost` ends the
/// session and its decoder, and what is held is released when the
/// transport's timer would release it.
private struct StreamRig {
    var stream = HM10Stream()
    var decoder: FrameDecoder?
    var now = ContinuousClock.now
    var events: [HM10Stream.Event] = []

    /// Feeds `chunk` `gap` after the last one.
    mutating func feed(_ chunk: [UInt8], after gap: Duration = .milliseconds(1)) {
        wait(gap)
        var decoder = self.decoder
        var events = self.events
        stream.feed(chunk, at: now, atFrameBoundary: { !(decoder?.hasPartialFrame ?? false) }) { event in
            Self.record(event, decoder: &decoder, events: &events, at: now)
        }
        self.decoder = decoder
        self.events = events
    }

    /// Lets `duration` pass, running the transport's timer when it is due.
    mutating func wait(_ duration: Duration) {
        let end = now + duration
        while let deadline = stream.deadline, deadline < end {
            now = deadline + .nanoseconds(1)
            var decoder = self.decoder
            var events = self.events
            stream.expire(at: now) { event in Self.record(event, decoder: &decoder, events: &events, at: now) }
            self.decoder = decoder
            self.events = events
        }
        now = end
    }

    /// Feeds `chunks` back to back, then lets the line go quiet.
    static func sort(_ chunks: [[UInt8]]) -> [HM10Stream.Event] {
        var rig = StreamRig()
        for chunk in chunks { rig.feed(chunk) }
        rig.wait(.seconds(1))
        return rig.events
    }

    private static func record(_ event: HM10Stream.Event, decoder: inout FrameDecoder?, events: inout [HM10Stream.Event], at now: ContinuousClock.Instant) {
        switch event {
        case .lost: decoder = nil
        case .connected: if decoder == nil { decoder = FrameDecoder(configuration: .init(idleTimeout: nil)) }
        case .data(let bytes):
            if decoder == nil { decoder = FrameDecoder(configuration: .init(idleTimeout: nil)) }
            decoder?.decode(bytes, at: now) { _ in }
            if case .data(let last)? = events.last {
                events[events.count - 1] = .data(last + bytes)
                return
            }
        }
        events.append(event)
    }
}

@Suite("The HM-10 stream: notices between frames, data inside them, nothing held for long")
struct HM10StreamTests {
    private let lost = Array("OK+LOST".utf8)
    private let connected = Array("OK+CONN".utf8)
    private let servo: [UInt8] = [0x02, 0x03, 0x00, 0x01, 0xF4]

    /// Every way to cut `bytes` in two, and one byte a chunk.
    private func splits(_ bytes: [UInt8]) -> [[[UInt8]]] {
        (0...bytes.count).map { [Array(bytes.prefix($0)), Array(bytes.dropFirst($0))] } + [bytes.map { [$0] }]
    }

    @Test("OK+CONN and OK+LOST between frames are notices, in order, however the bytes are split")
    func notices() {
        for chunks in splits(connected + servo + lost) {
            #expect(StreamRig.sort(chunks) == [.connected, .data(servo), .lost], "\(chunks)")
        }
    }

    @Test("The same bytes inside a frame are the central's data; a near miss is data too")
    func dataStaysData() {
        let text = FrameEncoder.encode(.lcdText(line: 0, text: lost + Array(" ".utf8) + connected)) + servo
        for chunks in splits(text) {
            #expect(StreamRig.sort(chunks) == [.data(text)], "\(chunks)")
        }
        let nearMiss = Array("OK+CONX".utf8)
        #expect(StreamRig.sort([nearMiss]) == [.data(nearMiss)])
        #expect(StreamRig.sort([Array("OK+".utf8), servo]) == [.data(Array("OK+".utf8) + servo)])
    }

    @Test("A central's last write ending in part of a notice does not hide the OK+LOST after it",
          arguments: ["O", "OK", "OK+", "OK+L", "OK+LO", "OK+LOS", "OK+C", "OK+CO", "OK+CON", "OKO", "OK+LOOK"])
    func restartsWhereTheMatchBroke(prefix: String) {
        let central = servo + Array(prefix.utf8)
        for chunks in splits(central + lost) {
            #expect(StreamRig.sort([connected] + chunks) == [.connected, .data(central), .lost], "\(chunks)")
        }
    }

    @Test("Part of a notice is held only while the line is busy: released as data just after the hold, on injected time")
    func heldPartReleased() {
        var rig = StreamRig()
        rig.feed(connected + servo + Array("OK+".utf8))
        #expect(rig.events == [.connected, .data(servo)], "OK+ is held")
        let deadline = rig.stream.deadline
        #expect(deadline == rig.now + HM10Stream.defaultHold)
        rig.wait(HM10Stream.defaultHold)
        #expect(rig.events == [.connected, .data(servo)], "not a moment early")
        rig.wait(.nanoseconds(1))
        #expect(rig.events == [.connected, .data(servo + Array("OK+".utf8))])
        #expect(rig.stream.deadline == nil)
        // What comes later is the central's: LOST alone is no notice.
        rig.feed(Array("LOST".utf8))
        #expect(rig.events == [.connected, .data(servo + Array("OK+LOST".utf8))])
    }

    @Test("A central that leaves inside a frame: the OK+LOST after its partial frame counts once the line is quiet, or with the next OK+CONN")
    func lostInsideAFrame() {
        // LCD_TEXT declaring 18 bytes, 3 sent: the rest never comes.
        let partial: [UInt8] = [0x04, 0x12, 0x00] + Array("ABC".utf8)
        for chunks in splits(partial + lost) {
            #expect(StreamRig.sort([connected] + chunks) == [.connected, .data(partial), .lost], "\(chunks)")
        }
        for chunks in splits(partial + lost + connected + servo) {
            #expect(StreamRig.sort([connected] + chunks) == [.connected, .data(partial), .lost, .connected, .data(servo)], "\(chunks)")
        }
        // A whole notice, then the start of another that never comes: the
        // line was not quiet after the first, so it is the central's text.
        var unfinished = StreamRig()
        // (Typed lets: one expression of array sums is more than the type
        // checker of some Swift releases will solve in time.)
        let textThenO: [UInt8] = partial + lost + Array("O".utf8)
        unfinished.feed(connected + textThenO)
        unfinished.wait(.seconds(1))
        #expect(unfinished.events == [.connected, .data(textThenO)])
        // The same letters with the frame going on: the central's text.
        var rig = StreamRig()
        rig.feed(connected + partial + lost)
        #expect(rig.events == [.connected, .data(partial)])
        let rest: [UInt8] = Array(" and more, and the end".utf8) + [0x00]
        rig.feed(rest, after: HM10Stream.defaultHold / 2)
        rig.wait(.seconds(1))
        let whole: [UInt8] = partial + lost + rest
        #expect(rig.events == [.connected, .data(whole)])
    }
}

/// A board on the emulated bus whose serial transport is an HM-10 emulator
/// on a pseudo-terminal.
private final class SerialBoard {
    let pty: PseudoTerminal
    let module: HM10Emulator
    let board: RunningBoard

    init(answersAT: Bool = true, atSetup: Bool = true, device: String? = nil) throws {
        pty = try PseudoTerminal()
        module = HM10Emulator(master: pty.master, answersAT: answersAT)
        let yaml = testBoard(silenceMs: 0).replacing("transports:\n", with: """
        transports:
          serial:
            device: \(device ?? pty.slavePath)
            baud: 9600
            at_setup: \(atSetup)
            name: BLECtl-Test

        """)
        board = try RunningBoard(yaml: yaml)
    }

    deinit {
        board.runtime.stop()
        module.stop()
        pty.close()
    }

    func serialState() -> String { (try? board.runtime.status().transports.serial) ?? "" }
}

@Suite("The HM-10 serial transport, on a pseudo-terminal", .serialized)
struct SerialTransportTests {
    @Test("Set-up by AT, OK+CONN opens a session, frames drive the outputs, ERROR goes back over the UART, OK+LOST engages the failsafe")
    func connectFramesLost() throws {
        let rig = try SerialBoard()
        #expect(rig.module.waitForCommand("AT+NAMEBLECtl-Test", timeout: Patience.time))
        #expect(rig.module.atCommands == ["AT", "AT+NOTI1", "AT+NAMEBLECtl-Test"])
        #expect(rig.module.notificationsOn && rig.module.moduleName == "BLECtl-Test")
        #expect(eventually { rig.serialState().contains("HM-10 set up, no central") }, "\(rig.serialState())")

        rig.module.connect()
        #expect(eventually { rig.serialState().contains("central connected") })
        var frames: [UInt8] = []
        FrameEncoder.encode(.enable(channel: 0, on: true), into: &frames)
        FrameEncoder.encode(.servo(channel: 0, value: 600), into: &frames)
        // An LCD text that says what the module's notice says: data, not a notice.
        FrameEncoder.encode(.lcdText(line: 0, text: Array("OK+LOST".utf8)), into: &frames)
        frames += [0x09, 0x00]  // no such command: ERROR 09 back
        rig.module.centralWrites(frames)
        #expect(rig.module.takeReplies(count: 3) == [0xFF, 0x01, 0x09], "the ERROR notification reaches the central")
        try rig.board.settle(frames: 3)
        #expect(abs(rig.board.pulse(0) - 1600) < 5)
        // The settle's INIT waits for the servo path, not the display.
        #expect(eventually { rig.board.runtime.emulators?.lcd?.lcd.lines.first?.hasPrefix("OK+LOST") == true })
        #expect(rig.serialState().contains("central connected"), "the text did not end the session")
        #expect(try rig.board.servo().failsafe == nil)

        rig.module.lose()
        #expect(eventually { (try? rig.board.servo().failsafe)?.hasPrefix("central left: serial") == true })
        #expect(rig.serialState().contains("no central"))
    }

    @Test("OK+LOST after a central's last write that ends in O, OK or OK+: the failsafe engages and the ESC on channel 4 stops",
          arguments: ["O", "OK", "OK+"])
    func lostAfterNoticePrefix(suffix: String) throws {
        let rig = try SerialBoard()
        #expect(eventually { rig.serialState().contains("HM-10 set up, no central") }, "\(rig.serialState())")
        rig.module.connect()
        #expect(eventually { rig.serialState().contains("central connected") })
        // PWM_VAL 500 on the ESC: half a 20 ms frame, clamped to full throttle.
        rig.module.centralWrites(FrameEncoder.encode(.enable(channel: 4, on: true)) + FrameEncoder.encode(.pwm(channel: 4, value: 500)) + Array(suffix.utf8))
        #expect(eventually { rig.board.duty(4) > 0 }, "channel 4 never ran")
        rig.module.lose()
        #expect(eventually { (try? rig.board.servo().failsafe)?.hasPrefix("central left: serial") == true },
                "OK+LOST after \(suffix) was not seen: \(rig.serialState())")
        #expect(eventually { rig.board.duty(4) == 0 }, "channel 4 still at duty \(rig.board.duty(4))")
        #expect(rig.serialState().contains("no central"))
    }

    @Test("A central's O that never becomes a notice reaches its session: an O alone is answered ERROR 4F once it expires")
    func heldPrefixReleased() throws {
        let rig = try SerialBoard()
        #expect(eventually { rig.serialState().contains("HM-10 set up, no central") }, "\(rig.serialState())")
        rig.module.connect()
        #expect(eventually { rig.serialState().contains("central connected") })
        // 0x4F is no command: held as a possible OK+LOST, released as data,
        // then discarded as a partial frame by the idle timeout, with ERROR.
        rig.module.centralWrites(Array("O".utf8))
        #expect(rig.module.takeReplies(count: 3) == [0xFF, 0x01, 0x4F], "the O was held for ever")
        #expect(rig.serialState().contains("central connected"))
    }

    @Test("A central that floods bad frames faster than the line takes their ERRORs: replies beyond a second of the line are dropped, the port and the session stay")
    func repliesBeyondTheLine() throws {
        let rig = try SerialBoard()
        #expect(eventually { rig.serialState().contains("HM-10 set up, no central") }, "\(rig.serialState())")
        rig.module.connect()
        #expect(eventually { rig.serialState().contains("central connected") })
        rig.module.pauseReading()
        // 1 MB of unknown commands: 1.5 MB of ERROR, more than the
        // pseudo-terminal and any bound of the board's hold.
        let flood = [UInt8](repeating: 0, count: 1_000_000).enumerated().map { $0.offset % 2 == 0 ? UInt8(0x09) : 0x00 }
        rig.module.centralWrites(flood)
        #expect(eventually { ((try? rig.board.runtime.status().counters.errors) ?? 0) >= flood.count / 2 },
                "the board stopped taking the flood: \(rig.serialState())")
        rig.module.resumeReading()
        // Once the line has caught up, a new bad frame is answered again
        // (asked until it is: one asked while a second is still queued is
        // dropped like the flood's).
        var replies: [UInt8] = []
        #expect(eventually {
            rig.module.centralWrites([0x0A, 0x00])
            replies += rig.module.takeReplies(count: 1, timeout: .milliseconds(50))
            return replies.suffix(3) == [0xFF, 0x01, 0x0A]
        }, "no answer to a new frame: \(replies.count) bytes of replies, the last \(replies.suffix(6))")
        // A second of the line (960 bytes) and the pseudo-terminal's own buffer.
        #expect(replies.count < 100_000, "\(replies.count) bytes of replies were kept for a 9600-baud line")
        #expect(rig.serialState().contains("central connected"), "\(rig.serialState())")
        #expect(try rig.board.servo().failsafe == nil)
    }

    @Test("A module that does not answer AT: said in status; the first data opens the session and frames still work")
    func silentModule() throws {
        let rig = try SerialBoard(answersAT: false)
        #expect(eventually { rig.serialState().contains("did not answer AT") }, "\(rig.serialState())")
        rig.module.connect()  // says nothing: notices are off
        var frames: [UInt8] = []
        FrameEncoder.encode(.enable(channel: 0, on: true), into: &frames)
        FrameEncoder.encode(.servo(channel: 0, value: 300), into: &frames)
        rig.module.centralWrites(frames)
        try rig.board.settle(frames: 2)
        #expect(abs(rig.board.pulse(0) - 1300) < 5)
        #expect(rig.serialState().contains("central connected"))
    }

    @Test("Garbage on the line is answered like any bad frame, and the daemon runs on")
    func garbage() throws {
        let rig = try SerialBoard(atSetup: false)
        #expect(eventually { rig.serialState().contains("AT set-up off") })
        #expect(rig.module.atCommands.isEmpty, "no AT command without at_setup")
        rig.module.connect()  // notices are off: the module says nothing
        // Two commands that do not exist, the second with a data byte.
        rig.module.centralWrites([0x42, 0x00, 0x07, 0x01, 0x55])
        #expect(rig.module.takeReplies(count: 6) == [0xFF, 0x01, 0x42, 0xFF, 0x01, 0x07])
        rig.module.centralWrites(FrameEncoder.encode(.enable(channel: 0, on: true)) + FrameEncoder.encode(.servo(channel: 0, value: 100)))
        #expect(eventually { abs(rig.board.pulse(0) - 1100) < 5 })
    }

    @Test("A serial device that is not there: a clear state in status, and the rest of the board runs")
    func missingDevice() throws {
        let rig = try SerialBoard(device: "/dev/ttyNOSUCH7")
        #expect(eventually { rig.serialState().contains("/dev/ttyNOSUCH7 does not exist") && rig.serialState().contains("retrying") }, "\(rig.serialState())")
        let central = try LoopbackTCPClient(port: rig.board.port)
        try central.send(FrameEncoder.encode(.enable(channel: 0, on: true)) + FrameEncoder.encode(.servo(channel: 0, value: 900)))
        #expect(eventually { abs(rig.board.pulse(0) - 1900) < 5 })
    }
}
