import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

private let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// Signals every daemon build must survive or stop on cleanly (issue #12):
/// each test runs against the test build and, when scripts/test provides
/// it, the release build.
@Suite("Signals and reloads", .serialized)
struct SignalTests {
    @Test("Every signal that would end the process stops it through the all-off path (exit 0), release build too",
          arguments: Executables.daemons)
    func terminatingSignals(binary: String) throws {
        let rtmin = Int32(34)  // glibc's SIGRTMIN (after its two reserved signals)
        for signal in [SIGTERM, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGPWR, SIGXCPU, rtmin + 3] {
            let daemon = try SimulatorDaemon(binary: binary)
            guard let exit = daemon.exit(after: signal) else {
                Issue.record("\(binary): signal \(signal) ignored, the daemon still runs")
                daemon.stop()
                continue
            }
            #expect(exit.reason == .exit && exit.status == 0, "\(binary): signal \(signal) → \(exit)")
            #expect(daemon.logText.contains("stopped; every output off"), "\(binary) signal \(signal):\n\(daemon.log(tail: 5))")
        }
    }

    @Test("SIGTERM right after the TCP port opens is never lost (15 times)", arguments: Executables.daemons)
    func earlySigterm(binary: String) throws {
        for attempt in 0..<15 {
            let daemon = try SimulatorDaemon(binary: binary)
            guard let exit = daemon.exit(after: SIGTERM) else {
                Issue.record("\(binary): attempt \(attempt): SIGTERM lost")
                daemon.stop()
                continue
            }
            #expect(exit.reason == .exit && exit.status == 0, "attempt \(attempt): \(exit)")
        }
    }

    @Test("SIGHUP reloads the board file: changed channels start over, unchanged ones keep their output; a bad file is refused and the board runs on")
    func reload() throws {
        let simulator = try String(contentsOf: repositoryRoot.appendingPathComponent("board/simulator.yaml"), encoding: .utf8)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("blecontrol-reload-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let board = directory.appendingPathComponent("board.yaml")
        try simulator.write(to: board, atomically: true, encoding: .utf8)
        let daemon = try SimulatorDaemon(extraArguments: ["--board", board.path])
        let central = try LoopbackTCPClient(port: daemon.tcpPort)
        try central.send([0x01, 0x02, 0x00, 0x01, 0x02, 0x03, 0x00, 0x01, 0xF4, 0x01, 0x02, 0x01, 0x01, 0x02, 0x03, 0x01, 0x01, 0xF4])
        _ = try daemon.waitFor("channels 0 and 1 at 1500 µs") { abs(($0.pulse(0) ?? 0) - 1500) < 5 && abs(($0.pulse(1) ?? 0) - 1500) < 5 }

        // Channel 1's travel changes; channel 0 does not.
        let edited = simulator.replacingOccurrences(of: "{ channel: 1, output: 1, role: servo, min_us: 1000, max_us: 2000 }",
                                                    with: "{ channel: 1, output: 1, role: servo, min_us: 1100, max_us: 1900 }")
        try edited.write(to: board, atomically: true, encoding: .utf8)
        kill(daemon.process.processIdentifier, SIGHUP)
        let reloaded = try daemon.waitFor("the reload") { (($0["configuration"] as? [String: Any])?["reloads"] as? Int) == 1 }
        #expect(((reloaded["configuration"] as? [String: Any])?["last_reload"] as? String)?.hasPrefix("applied: channels 1") == true, "\(reloaded["configuration"] ?? "")")
        let after = try daemon.waitFor("channel 1 stopped") { $0.pulse(1) == 0 }
        #expect(abs((after.pulse(0) ?? 0) - 1500) < 5, "an unchanged channel keeps its output")
        #expect(daemon.isRunning)

        // A bad file: refused, logged, the running configuration kept.
        try "name: simulator\nbuses: [".write(to: board, atomically: true, encoding: .utf8)
        kill(daemon.process.processIdentifier, SIGHUP)
        let refused = try daemon.waitFor("the refused reload") { (($0["configuration"] as? [String: Any])?["reloads"] as? Int) == 2 }
        #expect(((refused["configuration"] as? [String: Any])?["last_reload"] as? String)?.hasPrefix("refused:") == true)
        #expect(abs((refused.pulse(0) ?? 0) - 1500) < 5)
        #expect(daemon.isRunning)
        #expect(daemon.logText.contains("reload refused, running configuration kept"))

        // A change a live board cannot make (the LCD) is refused whole.
        try simulator.replacingOccurrences(of: "  address: 0x27", with: "  address: 0x26").write(to: board, atomically: true, encoding: .utf8)
        kill(daemon.process.processIdentifier, SIGHUP)
        let whole = try daemon.waitFor("the third reload") { (($0["configuration"] as? [String: Any])?["reloads"] as? Int) == 3 }
        #expect(((whole["configuration"] as? [String: Any])?["last_reload"] as? String)?.contains("lcd") == true)
        #expect(daemon.stop() == 0)
    }
}
