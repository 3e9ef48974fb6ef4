import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A publisher on the broker who wants the board down, or its log full of
/// lies: the daemon as a process on a real Mosquitto (docs/protocol.md,
/// "Limits").
@Suite("A hostile publisher: bounded cost, a log no sender can forge or flood", .serialized,
       .enabled(if: MosquittoBroker.available, "needs Debian's mosquitto and libmosquitto1 for this architecture (scripts/install-deps unit)"))
struct HostileSenderTests {
    private static let frames = "blecontrol/simulator/frames"

    /// The simulator daemon on `broker`, its log as the journal would get it.
    private func daemon(_ broker: MosquittoBroker, journal: Bool = false) throws -> SimulatorDaemon {
        let board = try MQTTFleetTests.board("simulator", broker)
        let daemon = try SimulatorDaemon(extraArguments: ["--board", board, "--log-level", "info"], journal: journal)
        #expect(eventually { broker.retained("blecontrol/simulator/availability") == "online" })
        return daemon
    }

    /// Publishes SERVO_VAL `value` on channel 1 behind whatever went before,
    /// and waits until it is on the chip: the broker delivers one
    /// publisher's messages in order, so everything before it has been
    /// dealt with.
    private func marker(_ value: Int, _ broker: MosquittoBroker, _ daemon: SimulatorDaemon) throws {
        try broker.publish(Self.frames, [0x01, 0x02, 0x01, 0x01, 0x02, 0x03, 0x01, UInt8(value >> 8), UInt8(value & 0xFF)])
        _ = try daemon.waitFor("channel 1 at \(1000 + value) µs") { abs(($0.pulse(1) ?? 0) - Double(1000 + value)) < 5 }
    }

    private func session(_ status: [String: Any]) -> [String: Any]? {
        (status["sessions"] as? [[String: Any]])?.first { $0["transport"] as? String == "mqtt" }
    }

    @Test("A 1 MiB message of bad frames: the broker drops it for the board (its Maximum Packet Size); nothing of it is decoded or answered")
    func oversizeDroppedByTheBroker() throws {
        let broker = try MosquittoBroker()
        let daemon = try self.daemon(broker)
        let errors = try MosquittoSubscriber(broker, topics: ["blecontrol/simulator/errors"])
        let before = try daemon.status()
        try broker.publish(Self.frames, (0..<(1 << 20)).map { UInt8($0 % 2 == 0 ? 0x09 : 0x00) })
        try marker(500, broker, daemon)
        let after = try daemon.status()
        let frames = { (status: [String: Any]) in ((status["counters"] as? [String: Any])?["frames"] as? Int) ?? -1 }
        #expect(frames(after) - frames(before) == 2, "only the marker's two frames were decoded")
        #expect(broker.log.contains("Dropping too large outgoing PUBLISH"), "the broker knew the board's limit: \(broker.log.suffix(500))")
        #expect(errors.payloads("blecontrol/simulator/errors").isEmpty, "\(errors.lines)")
    }

    @Test("A message of bad frames within the limit draws a burst of ERROR replies, not one per frame; the rest are counted")
    func errorRepliesBounded() throws {
        let broker = try MosquittoBroker()
        let daemon = try self.daemon(broker)
        let errors = try MosquittoSubscriber(broker, topics: ["blecontrol/simulator/errors"])
        let badFrames = 8000
        try broker.publish(Self.frames, (0..<(2 * badFrames)).map { UInt8($0 % 2 == 0 ? 0x09 : 0x00) })
        try marker(300, broker, daemon)
        let status = try daemon.status()
        let session = try #require(self.session(status))
        #expect((session["errors"] as? Int) == badFrames)
        let dropped = try #require(session["replies_dropped"] as? Int)
        // Replies are published before the marker is applied, and the
        // subscriber sees them in order: wait until it has as many as were sent.
        let sent = badFrames - dropped
        #expect(sent <= 8 + 2, "a burst of 8 and what the budget refilled meanwhile, not \(sent)")
        #expect(eventually { errors.payloads("blecontrol/simulator/errors").count == sent }, "\(errors.lines.count) of \(sent)")
        #expect(errors.payloads("blecontrol/simulator/errors").allSatisfy { $0 == "ff0109" })
    }

    @Test("A payload with a newline and a priority in it is one escaped line at warning; 2000 bad messages log at most a burst (LogLimiterTests: the next line says how many more)")
    func logNotForgedNorFlooded() throws {
        let broker = try MosquittoBroker()
        let daemon = try self.daemon(broker, journal: true)
        let topic = "blecontrol/simulator/servo/0/set"
        try broker.publish(topic, "7\n<2>blecontrold: forged\u{1b}[2J")
        try marker(100, broker, daemon)
        let forged = daemon.logText.split(separator: "\n").filter { $0.contains("forged") }
        #expect(forged.count == 1, "\(forged)")
        #expect(forged.first?.hasPrefix("<4>") == true, "warning priority, the sender's <2> inside the line: \(forged)")
        #expect(forged.first?.contains(#"\n<2>blecontrold: forged\x1b[2J"#) == true, "\(forged)")
        #expect(!daemon.logText.contains("\u{1b}"))

        try broker.publish(topic, lines: (0..<2000).map { "bad \($0)" })
        try marker(200, broker, daemon)
        let refusals = daemon.logText.split(separator: "\n").filter { $0.contains("is not a value 0…1000") }
        #expect(refusals.count <= 20, "\(refusals.count) lines for 2001 refusals")
        #expect(refusals.count >= 19, "the first ones are all there")
        #expect(self.session(try daemon.status())?["errors"] as? Int == 2001)
    }
}

@Suite("The TCP transport stays on loopback unless the board file says otherwise")
struct TCPLoopbackTests {
    @Test("--tcp cannot take a loopback board's TCP transport onto the network; a loopback override is fine")
    func overrideStaysOnLoopback() throws {
        let refused = try run(Executables.daemon, ["--tcp", "0.0.0.0:0", "--check-board"])
        #expect(refused.status == 0, "--check-board checks the file alone: \(refused.stderr)")
        let started = try run(Executables.daemon, ["--tcp", "0.0.0.0:0", "--socket", "/nonexistent/none.sock"])
        #expect(started.status == 2, "\(started.stdout) \(started.stderr)")
        #expect(started.stderr.contains("--tcp 0.0.0.0:0 is not a loopback address"), "\(started.stderr)")
        let daemon = try SimulatorDaemon(extraArguments: ["--tcp", "127.0.0.2:0"])
        #expect(daemon.tcpPort != 0)
    }
}
