import BLEControlProtocol
import Board
import DeviceEmulators
import LinuxHardware
import Testing
import TestSupport
@testable import Firmware

@Suite("The HM-10 stream: notices between frames, data inside them")
struct HM10StreamTests {
    /// Feeds `chunks` with a boundary rule like a session's: a frame
    /// starts at 0x02 and spans 5 bytes.
    private func sort(_ chunks: [[UInt8]]) -> [HM10Stream.Event] {
        var stream = HM10Stream()
        var events: [HM10Stream.Event] = []
        var inFrame = 0
        for chunk in chunks {
            stream.feed(chunk, atFrameBoundary: { inFrame == 0 }) { event in
                if case .data(let bytes) = event {
                    for byte in bytes {
                        if inFrame > 0 { inFrame -= 1 } else if byte == 0x02 { inFrame = 4 }
                    }
                    if case .data(let last)? = events.last {
                        events[events.count - 1] = .data(last + bytes)
                        return
                    }
                }
                events.append(event)
            }
        }
        return events
    }

    @Test("OK+CONN and OK+LOST between frames are notices, in order, however the bytes are split")
    func notices() {
        let servo: [UInt8] = [0x02, 0x03, 0x00, 0x01, 0xF4]
        let stream = Array("OK+CONN".utf8) + servo + Array("OK+LOST".utf8)
        #expect(sort([stream]) == [.connected, .data(servo), .lost])
        #expect(sort(stream.map { [$0] }) == [.connected, .data(servo), .lost], "one byte at a time")
        #expect(sort([Array(stream.prefix(3)), Array(stream.dropFirst(3))]) == [.connected, .data(servo), .lost])
    }

    @Test("The same bytes inside a frame are the central's data; a near miss is data too")
    func dataStaysData() {
        // "OK+LO" inside a 5-byte frame starting at 0x02: data.
        let inside: [UInt8] = [0x02] + Array("OK+L".utf8)
        #expect(sort([inside]) == [.data(inside)])
        let nearMiss = Array("OK+CONX".utf8)
        #expect(sort([nearMiss]) == [.data(nearMiss)])
        #expect(sort([Array("OK+".utf8), [0x02, 1, 2, 3, 4]]) == [.data(Array("OK+".utf8) + [0x02, 1, 2, 3, 4])])
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
        #expect(rig.board.runtime.emulators?.lcd?.lcd.lines.first?.hasPrefix("OK+LOST") == true)
        #expect(rig.serialState().contains("central connected"), "the text did not end the session")
        #expect(try rig.board.servo().failsafe == nil)

        rig.module.lose()
        #expect(eventually { (try? rig.board.servo().failsafe)?.hasPrefix("central left: serial") == true })
        #expect(rig.serialState().contains("no central"))
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
