import BLEControlProtocol
import Board
import Control
import DeviceEmulators
import LinuxHardware
import Logging
import Reactor
import Testing
import TestSupport
@testable import Firmware
@testable import Runtime

// The disconnect failsafe follows the central in control (docs/protocol.md,
// "Failsafe"): a central that leaves while an output's last command was its
// own takes the failsafe with it, whatever else is connected; one that never
// commanded an output is an observer.

/// The transports whose sessions are centrals.
private let centralKinds: [TransportKind] = [.tcp, .ble, .serial, .mqtt]

/// A hub on virtual time over the emulated board, recording what the
/// runtime would act on.
private final class OwnershipRig {
    let board: EmulatedBoard
    let loop = ManualLoop()
    let hub: SessionHub
    /// Each call of onCommanderLeft: who, and what it was in control of.
    var left: [(transport: TransportKind, outputs: [Dispatcher.Output])] = []
    var inControl: [TransportKind] = []

    init() throws {
        board = try EmulatedBoard()
        hub = board.hub(on: loop, idleTimeout: nil)
        hub.onCommanderLeft = { [unowned self] session, outputs in left.append((session.transport, outputs)) }
        hub.onCentralInControl = { [unowned self] session, _ in inControl.append(session.transport) }
    }

    func open(_ kind: TransportKind) -> Session { hub.open(transport: kind, peer: "\(kind)") { _ in } }
    func send(_ messages: [Message], from session: Session) {
        hub.receive(messages.flatMap { FrameEncoder.encode($0) }, for: session)
    }
}

@Suite("The failsafe follows the central in control, on virtual time")
struct FailsafeOwnershipRuleTests {
    @Test("For every pair of central transports: the commander leaving engages it with the observer still there; the observer leaving does not")
    func commanderAndObserver() throws {
        for commanderKind in centralKinds {
            for observerKind in centralKinds {
                let rig = try OwnershipRig()
                let observer = rig.open(observerKind)
                let commander = rig.open(commanderKind)
                // The observer talks, but moves nothing: INIT and text.
                rig.send([.initialize, .lcdText(line: 0, text: Array("hello".utf8))], from: observer)
                rig.send([.enable(channel: 4, on: true), .pwm(channel: 4, value: 500), .servo(channel: 0, value: 100)], from: commander)
                rig.hub.close(commander)
                #expect(rig.left.count == 1, "\(commanderKind) commander, \(observerKind) observer")
                #expect(rig.left.first?.transport == commanderKind)
                #expect(rig.left.first?.outputs == [.channel(0), .channel(4)])
                #expect(rig.loop.pendingTimers == 0, "at once, on no timer: the same bound as with nobody else connected")
                rig.hub.close(observer)
                #expect(rig.left.count == 1, "an observer leaving takes nothing with it (\(observerKind))")
            }
        }
    }

    @Test("Only the last command counts: a commander whose outputs another central took over leaves without the failsafe")
    func lastCommandCounts() throws {
        let rig = try OwnershipRig()
        let first = rig.open(.ble)
        let second = rig.open(.ble)
        rig.send([.enable(channel: 0, on: true), .servo(channel: 0, value: 500)], from: first)
        rig.send([.servo(channel: 0, value: 700)], from: second)
        rig.hub.close(first)
        #expect(rig.left.isEmpty, "channel 0 obeys the second central now")
        rig.hub.close(second)
        #expect(rig.left.map(\.outputs) == [[.channel(0)]])
    }

    @Test("The control socket is an operator: its commands neither take an output from a central nor make it a commander")
    func operatorTakesNothing() throws {
        let rig = try OwnershipRig()
        let central = rig.open(.tcp)
        let cli = rig.open(.control)
        rig.send([.enable(channel: 4, on: true)], from: central)
        rig.send([.pwm(channel: 4, value: 900), .enable(channel: 5, on: true)], from: cli)
        rig.hub.close(cli)
        #expect(rig.left.isEmpty)
        rig.hub.close(central)
        #expect(rig.left.map(\.outputs) == [[.channel(4)]], "the central still took channel 4's failsafe with it")
    }

    @Test("A frame refused with ERROR commands nothing: a central whose every command failed is an observer")
    func refusedCommandsNothing() throws {
        let rig = try OwnershipRig()
        let central = rig.open(.mqtt)
        rig.send([.enable(channel: 12, on: true), .switchValue(index: 9, on: true)], from: central)  // not on this board
        rig.hub.close(central)
        #expect(rig.left.isEmpty)
    }

    @Test("The observer's first accepted frame puts it in control: that is what ends a failsafe")
    func observerTakesControl() throws {
        let rig = try OwnershipRig()
        let observer = rig.open(.mqtt)
        let commander = rig.open(.tcp)
        rig.send([.enable(channel: 4, on: true)], from: commander)
        #expect(rig.inControl == [.tcp])
        rig.hub.close(commander)
        #expect(rig.left.count == 1)
        rig.send([.pwm(channel: 4, value: 100)], from: observer)
        #expect(rig.inControl == [.tcp, .mqtt])
        rig.hub.close(observer)
        #expect(rig.left.map(\.transport) == [.tcp, .mqtt], "now a commander, it takes the failsafe with it in turn")
    }

    @Test("Silence is measured on the centrals in control: an observer's frames do not keep a quiet commander's outputs alive")
    func silenceFollowsCommanders() throws {
        let rig = try OwnershipRig()
        let observer = rig.open(.ble)
        let commander = rig.open(.tcp)
        rig.send([.initialize], from: observer)
        #expect(rig.hub.lastFrameAt == nil, "nobody commands anything yet")
        rig.send([.enable(channel: 4, on: true)], from: commander)
        let commanded = try #require(rig.hub.lastFrameAt)
        rig.loop.advance(to: commanded + .milliseconds(100))
        rig.send([.lcdText(line: 0, text: Array("still here".utf8))], from: observer)
        #expect(rig.hub.lastFrameAt == commanded)
        rig.send([.initialize], from: commander)
        #expect(rig.hub.lastFrameAt == commanded + .milliseconds(100), "any frame of the commander's counts")
    }
}

/// Who was silenced, with what, and when (a type of its own at file scope:
/// sid's Swift 6.2.3 crashed emitting debug info for one local to a function).
private final class SilencedRecord {
    var all: [(TransportKind, [Dispatcher.Output], ContinuousClock.Instant)] = []
}

@Suite("Silence is per commander, on virtual time")
struct SilencePerCommanderTests {
    /// The rig's hub watched as the runtime watches it.
    private static func watched(_ rig: OwnershipRig, timeout: Duration) -> (FailsafeWatch, () -> [(TransportKind, [Dispatcher.Output], ContinuousClock.Instant)]) {
        let silenced = SilencedRecord()
        rig.hub.onCommanderSilent = { session, outputs in silenced.all.append((session.transport, outputs, rig.loop.now)) }
        let watch = FailsafeWatch(loop: rig.loop, silenceTimeout: timeout, stallTimeout: .seconds(600),
                                  lastFrame: { rig.hub.quietestCommanderFrameAt },
                                  silence: { rig.hub.silenceCommanders(quietFor: $0) },
                                  busyFor: { _ in nil }, acknowledgeBusy: {}, engage: { _ in })
        rig.hub.onFrame = { watch.frameArrived() }
        return (watch, { silenced.all })
    }

    @Test("For every pair of central transports: a frozen commander fails safe at its own deadline, however often another commander writes; the busy one only once it stops")
    func frozenBesideBusy() throws {
        for frozenKind in centralKinds {
            for busyKind in centralKinds {
                let rig = try OwnershipRig()
                let (watch, silenced) = Self.watched(rig, timeout: .milliseconds(1000))
                let frozen = rig.open(frozenKind)
                let busy = rig.open(busyKind)
                let t0 = rig.loop.now
                rig.send([.enable(channel: 0, on: true), .servo(channel: 0, value: 1000)], from: frozen)
                // The review's case: a command every 300 ms from the other one.
                var last = t0
                for step in 1...10 {
                    rig.loop.advance(to: t0 + .milliseconds(300 * step))
                    rig.send(step == 1 ? [.enable(channel: 1, on: true)] : [.servo(channel: 1, value: UInt16(step * 50))], from: busy)
                    last = rig.loop.now
                }
                let label = "\(frozenKind) frozen, \(busyKind) busy"
                #expect(silenced().map(\.0) == [frozenKind], "\(label)")
                #expect(silenced().first?.1 == [.channel(0)], "\(label)")
                #expect(silenced().first?.2 == t0 + .milliseconds(1000), "at its own deadline (\(label))")
                #expect(rig.hub.sessions.count == 2, "its connection stays open (\(label))")
                rig.loop.advance(to: last + .milliseconds(999))
                #expect(silenced().count == 1, "\(label)")
                rig.loop.advance(to: last + .milliseconds(1000))
                #expect(silenced().map(\.0) == [frozenKind, busyKind], "\(label)")
                #expect(silenced().last?.1 == [.channel(1)], "\(label)")
                #expect(rig.loop.pendingTimers == 0, "nobody in control: no timer (\(label))")
                watch.cancel()
            }
        }
    }

    @Test("An observer's frames never end a failsafe; a command does, and its sender is then watched again")
    func observersEndNothing() throws {
        let rig = try OwnershipRig()
        let (_, silenced) = Self.watched(rig, timeout: .milliseconds(500))
        let observer = rig.open(.mqtt)
        let commander = rig.open(.ble)
        rig.send([.enable(channel: 4, on: true)], from: commander)
        #expect(rig.inControl == [.ble])
        rig.loop.advance(by: .milliseconds(500))
        #expect(silenced().map(\.0) == [.ble])
        // Text, CLEAR and INIT from anyone, the silenced commander included.
        rig.send([.lcdText(line: 0, text: Array("hi".utf8)), .lcdClear, .initialize], from: observer)
        rig.send([.initialize, .lcdText(line: 1, text: Array("me".utf8))], from: commander)
        #expect(rig.inControl == [.ble], "no observer's frame ended the failsafe")
        rig.send([.pwm(channel: 4, value: 100)], from: commander)
        #expect(rig.inControl == [.ble, .ble])
        rig.loop.advance(by: .milliseconds(500))
        #expect(silenced().map(\.0) == [.ble, .ble])
    }
}

/// A board with an HM-10 on a pseudo-terminal beside other transports.
private final class HM10Rig {
    let pty: PseudoTerminal
    let module: HM10Emulator
    let board: RunningBoard

    init(otherTransports: String) throws {
        pty = try PseudoTerminal()
        module = HM10Emulator(master: pty.master, answersAT: true)
        board = try RunningBoard(yaml: pwmBoard().replacingOccurrences(of: "transports:\n", with: """
        transports:
          serial:
            device: \(pty.slavePath)
            baud: 9600
            at_setup: true
        \(otherTransports)
        """))
        #expect(eventually { ((try? self.board.runtime.status().transports.serial) ?? "").contains("HM-10 set up, no central") })
    }

    deinit {
        board.runtime.stop()
        module.stop()
        pty.close()
    }
}

private extension RunningBoard {
    var failsafe: String? { (try? servo().failsafe) ?? nil }
    var mqttConnected: Bool { ((try? runtime.status().transports.mqtt) ?? "").hasPrefix("connected") }

    /// PWM 4 at 50 % from `central`, seen on the chip.
    func pwm4AtHalf(_ send: ([UInt8]) throws -> Void) throws {
        try send(FrameEncoder.encode(.enable(channel: 4, on: true)) + FrameEncoder.encode(.pwm(channel: 4, value: 500)))
        #expect(eventually { abs(self.duty(4) - 0.5) < 0.001 })
    }
}

/// The simulator board's channel 4 as shipped (PWM), with the test knobs.
private func pwmBoard() -> String {
    testBoard(silenceMs: 0).replacingOccurrences(of: escBoardChannel4, with: "- { channel: 4, output: 4, role: pwm }")
}

private let escBoardChannel4 = "- { channel: 4, output: 4, role: esc, min_us: 1000, max_us: 2000, failsafe: pulse, failsafe_us: 1000, failsafe_dwell_ms: 150 }"

@Suite("The failsafe follows the central in control, on real transports", .serialized)
struct FailsafeOwnershipTransportTests {
    @Test("MQTT connected and idle: a TCP central that ran PWM 4 at 50 % and leaves takes the failsafe with it")
    func mqttIdleTCPCommander() throws {
        try #require(MosquittoBroker.available, "needs Debian's mosquitto and libmosquitto1")
        let broker = try MosquittoBroker()
        let board = try RunningBoard(yaml: pwmBoard().replacingOccurrences(of: "transports:\n", with: "transports:\n" + broker.mqttSection()))
        #expect(eventually { board.mqttConnected })
        var central: LoopbackTCPClient? = try LoopbackTCPClient(port: board.port)
        try board.pwm4AtHalf { try central?.send($0) }
        central = nil
        #expect(eventually { board.failsafe?.hasPrefix("central left: tcp 127.0.0.1:") == true }, "\(board.failsafe ?? "no failsafe")")
        #expect(eventually { board.duty(4) == 0 }, "channel 4 off")
        #expect(board.mqttConnected, "the broker is still connected: it was only an observer")
        #expect(try board.servo().failsafes == 1)
    }

    @Test("MQTT connected and idle: an HM-10 central that ran PWM 4 at 50 % and is lost (OK+LOST) takes the failsafe with it")
    func mqttIdleHM10Commander() throws {
        try #require(MosquittoBroker.available, "needs Debian's mosquitto and libmosquitto1")
        let broker = try MosquittoBroker()
        let rig = try HM10Rig(otherTransports: broker.mqttSection())
        let board = rig.board
        #expect(eventually { board.mqttConnected })
        rig.module.connect()
        try board.pwm4AtHalf { rig.module.centralWrites($0) }
        rig.module.lose()
        #expect(eventually { board.failsafe?.hasPrefix("central left: serial") == true }, "\(board.failsafe ?? "no failsafe")")
        #expect(eventually { board.duty(4) == 0 })
    }

    @Test("The broker as the commander: losing it engages the failsafe though a TCP observer stays connected")
    func brokerCommanderTCPObserver() throws {
        try #require(MosquittoBroker.available, "needs Debian's mosquitto and libmosquitto1")
        let broker = try MosquittoBroker()
        let board = try RunningBoard(yaml: pwmBoard().replacingOccurrences(of: "transports:\n", with: "transports:\n" + broker.mqttSection()))
        #expect(eventually { board.mqttConnected })
        let observer = try LoopbackTCPClient(port: board.port)
        try observer.send(FrameEncoder.encode(.initialize))
        try broker.publish("blecontrol/simulator/enable/4/set", "ON")
        try broker.publish("blecontrol/simulator/pwm/4/set", "500")
        #expect(eventually { abs(board.duty(4) - 0.5) < 0.001 })
        broker.stop()
        #expect(eventually { board.failsafe?.hasPrefix("central left: mqtt") == true }, "\(board.failsafe ?? "no failsafe")")
        #expect(eventually { board.duty(4) == 0 })
        _ = observer
    }

    @Test("Two TCP centrals: the commander leaves, the observer stays → failsafe; the observer's first command clears it")
    func twoCentrals() throws {
        let board = try RunningBoard(yaml: pwmBoard())
        let observer = try LoopbackTCPClient(port: board.port)
        try observer.send(FrameEncoder.encode(.lcdText(line: 0, text: Array("watching".utf8))))
        var commander: LoopbackTCPClient? = try LoopbackTCPClient(port: board.port)
        try board.pwm4AtHalf { try commander?.send($0) }
        commander = nil
        #expect(eventually { board.failsafe?.hasPrefix("central left: tcp") == true }, "\(board.failsafe ?? "no failsafe")")
        #expect(eventually { board.duty(4) == 0 })
        try observer.send(FrameEncoder.encode(.pwm(channel: 4, value: 250)))
        #expect(eventually { board.failsafe == nil }, "the observer's first command ends the failsafe")
        #expect(eventually { abs(board.duty(4) - 0.25) < 0.001 })
    }

    @Test("An HM-10 observer stays connected: the TCP commander leaving still engages the failsafe")
    func hm10ObserverTCPCommander() throws {
        let rig = try HM10Rig(otherTransports: "")
        let board = rig.board
        rig.module.connect()
        rig.module.centralWrites(FrameEncoder.encode(.initialize))
        #expect(eventually { ((try? board.runtime.status().transports.serial) ?? "").contains("central connected") })
        var commander: LoopbackTCPClient? = try LoopbackTCPClient(port: board.port)
        try board.pwm4AtHalf { try commander?.send($0) }
        commander = nil
        #expect(eventually { board.failsafe?.hasPrefix("central left: tcp") == true }, "\(board.failsafe ?? "no failsafe")")
        #expect(eventually { board.duty(4) == 0 })
    }
}

@Suite("A central's ERROR replies, on virtual time")
struct ReplyBudgetTests {
    @Test("8000 bad frames in one write: a burst of 8 replies, the rest counted; the budget refills at 20 a second; the control socket gets every reply")
    func budget() throws {
        let board = try EmulatedBoard()
        let loop = ManualLoop()
        let hub = board.hub(on: loop, idleTimeout: nil)
        var replies: [UInt8] = []
        let central = hub.open(transport: .mqtt, peer: "flood") { replies += $0 }
        let garbage = (0..<16_000).map { UInt8($0 % 2 == 0 ? 0x09 : 0x00) }
        hub.receive(garbage, for: central)
        #expect(replies.count == 8 * 3)
        #expect(replies.prefix(3) == [0xFF, 0x01, 0x09])
        #expect(central.counters.errors == 8000)
        #expect(central.counters.repliesDropped == 8000 - 8)
        loop.advance(to: loop.now + .milliseconds(500))
        replies.removeAll()
        hub.receive(garbage, for: central)
        #expect(replies.count == 8 * 3, "half a second refilled 8 (20 a second, at most the burst)")

        var operatorReplies = 0
        let cli = hub.open(transport: .control, peer: "cli") { _ in operatorReplies += 1 }
        hub.receive(Array(garbage.prefix(200)), for: cli)
        #expect(operatorReplies == 100, "an operator's request is answered whole")
    }
}
