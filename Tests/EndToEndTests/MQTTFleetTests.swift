import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Two daemons (boards alpha and beta) on one broker, driven by
/// `blecontrol --mqtt` and listed by `blecontrol fleet`.
@Suite("The fleet on one broker, from the command line", .serialized,
       .enabled(if: MosquittoBroker.available, "needs Debian's mosquitto and libmosquitto1 for this architecture (scripts/install-deps unit)"))
struct MQTTFleetTests {
    /// The simulator board named `name`, on `broker`.
    static func board(_ name: String, _ broker: MosquittoBroker) throws -> String {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let simulator = try String(contentsOf: root.appendingPathComponent("board/simulator.yaml"), encoding: .utf8)
        let text = simulator
            .replacingOccurrences(of: "\nname: simulator", with: "\nname: \(name)")
            .replacingOccurrences(of: "transports:\n", with: "transports:\n" + broker.mqttSection())
        let path = "\(broker.directory)/\(name).yaml"
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// The operator's credentials for the CLI.
    static func access(_ broker: MosquittoBroker) throws -> [String] {
        let file = "\(broker.directory)/operator.password"
        try "operator-secret\n".write(toFile: file, atomically: true, encoding: .utf8)
        return ["--mqtt-user", "operator", "--mqtt-password-file", file]
    }

    @Test("fleet lists both boards; --mqtt NAME@BROKER drives one and reads its status and replies; a board killed without a word shows offline (its will)")
    func fleet() throws {
        let broker = try MosquittoBroker()
        let alpha = try SimulatorDaemon(extraArguments: ["--board", try Self.board("alpha", broker)])
        let beta = try SimulatorDaemon(extraArguments: ["--board", try Self.board("beta", broker)])
        let access = try Self.access(broker)
        let address = "127.0.0.1:\(broker.port)"
        for board in ["alpha", "beta"] {
            #expect(eventually { broker.retained("blecontrol/\(board)/availability") == "online" })
        }

        let listed = try run(Executables.cli, ["fleet", "--mqtt", address] + access)
        #expect(listed.status == 0, "\(listed.stderr)")
        let lines = listed.stdout.split(separator: "\n").map { $0.split(separator: " ", omittingEmptySubsequences: true).map(String.init) }
        #expect(lines.first?.first == "BOARD")
        #expect(lines.dropFirst().map { Array($0.prefix(2)) } == [["alpha", "online"], ["beta", "online"]], "\(listed.stdout)")

        // Frames to alpha through the broker; beta does not move.
        for command in [["enable", "0", "on"], ["servo", "0", "500"]] {
            let sent = try run(Executables.cli, command + ["--mqtt", "alpha@\(address)", "--sync"] + access)
            #expect(sent.status == 0, "\(command): \(sent.stdout) \(sent.stderr)")
        }
        // --sync: every reply has arrived, so alpha has taken the frames; its
        // servo thread puts them out when it gets to them.
        _ = try alpha.waitFor("channel 0 at 1500 µs on alpha") { abs(($0.pulse(0) ?? 0) - 1500) < 5 }
        #expect(((try beta.status()).pulse(0) ?? 0) == 0)
        // A pulse in µs through …/pulse/N/set; a PWM channel's refusal comes back in words.
        let pulse = try run(Executables.cli, ["pulse", "0", "1750", "--mqtt", "alpha@\(address)", "--sync"] + access)
        #expect(pulse.status == 0, "\(pulse.stdout) \(pulse.stderr)")
        _ = try alpha.waitFor("channel 0 at 1750 µs on alpha") { abs(($0.pulse(0) ?? 0) - 1750) < 5 }
        let pwmPulse = try run(Executables.cli, ["pulse", "4", "1500", "--mqtt", "alpha@\(address)", "--sync"] + access)
        #expect(pwmPulse.status == 1 && (pwmPulse.stdout + pwmPulse.stderr).contains("channel 4 is a PWM channel"), "\(pwmPulse.stdout) \(pwmPulse.stderr)")
        let refused = try run(Executables.cli, ["send", "09", "00", "--mqtt", "alpha@\(address)", "--sync"] + access)
        #expect(refused.status == 1 && refused.stdout.contains("board replied ERROR for command 9 (ff0109)"), "\(refused.stdout) \(refused.stderr)")

        // beta's status, from its retained topic.
        let status = try run(Executables.cli, ["status", "--json", "--mqtt", "beta@\(address)"] + access)
        #expect(status.status == 0 && status.stdout.contains("\"board\" : \"beta\"") || status.stdout.contains("\"board\": \"beta\""), "\(status.stdout) \(status.stderr)")

        // A board that is not there, and a broker that is not there: said, exit 1.
        let missing = try run(Executables.cli, ["servo", "0", "1", "--mqtt", "gamma@\(address)"] + access)
        #expect(missing.status == 1 && missing.stderr.contains("no board gamma"), "\(missing.stderr)")

        // alpha vanishes (SIGKILL: no DISCONNECT, no offline of its own):
        // the broker gives up after 1.5 × its 5 s keepalive and says offline.
        _ = alpha.exit(after: SIGKILL)
        #expect(eventually { broker.retained("blecontrol/alpha/availability") == "offline" })
        let after = try run(Executables.cli, ["fleet", "--mqtt", address, "--json"] + access)
        #expect(after.stdout.contains("\"availability\": \"offline\"") || after.stdout.contains("\"availability\" : \"offline\""), "\(after.stdout)")
        let toOffline = try run(Executables.cli, ["servo", "0", "1", "--mqtt", "alpha@\(address)"] + access)
        #expect(toOffline.status == 1 && toOffline.stderr.contains("is offline"), "\(toOffline.stderr)")
    }
}
