import BLEControlProtocol
import Board
import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

// What a board says on its broker (issue #30): every message the release
// daemon publishes, counted with their bytes by a subscriber to its topics
// and Home Assistant's, while the board is idle (no central, nothing
// changing but the LED's heartbeat and the clock) and while a central
// streams the original demo app's traffic (20 writes a second, four
// servos). Printed per hour; figures, not checks.

func benchmarkChatter(binary: String, seconds: Double) throws {
    guard MosquittoBroker.available else {
        print("chatter: skipped (no \(MosquittoBroker.binary): scripts/install-deps unit installs it)")
        return
    }
    let broker = try MosquittoBroker()
    // The board as a user has it: status_interval_ms at its default (the
    // test rig's section asks for 100).
    let section = broker.mqttSection().split(separator: "\n", omittingEmptySubsequences: false).filter { !$0.contains("status_interval_ms") }.joined(separator: "\n")
    let board = EmbeddedBoards.simulator.board(replacing: "transports:\n", with: "transports:\n" + section)
    let daemon = try DaemonProcess(binary: binary, boardText: board, logLevel: "error")
    defer { daemon.stop() }
    let heard = try MosquittoSubscriber(broker, topics: ["blecontrol/#", "homeassistant/#"])
    guard spin(until: .now + .seconds(60), { broker.retained("blecontrol/simulator/availability") == "online" }) else {
        throw BenchError("the daemon did not come online on the broker")
    }
    print("chatter: what \(binary) publishes on its broker, \(Int(seconds)) s per phase (status_interval_ms at its default, 1000):")
    /// Messages and payload bytes heard during `body`, per hour.
    func phase(_ name: String, _ body: () throws -> Void) rethrows {
        usleep(2_000_000)  // what the phase before set off has settled
        let before = heard.lines
        let start = ContinuousClock.now
        try body()
        let elapsed = (ContinuousClock.now - start).inSeconds
        let lines = heard.lines.dropFirst(before.count)
        let bytes = lines.reduce(0) { $0 + (($1.split(separator: " ", maxSplits: 1).last?.count ?? 0) / 2) }
        let topics = Dictionary(grouping: lines) { String($0.split(separator: " ").first ?? "") }.mapValues(\.count)
        let perHour = 3600 / elapsed
        print("  \(name.padding(toLength: 24, withPad: " ", startingAt: 0)) \(lines.count) messages, \(bytes) B in \(format(elapsed, 0)) s:"
              + " \(format(Double(lines.count) * perHour, 0)) messages/h, \(format(Double(bytes) * perHour / 1e6, 2)) MB/h"
              + (topics.isEmpty ? "" : " (" + topics.sorted { $0.key < $1.key }.map { "\($0.key.split(separator: "/").last ?? "") \($0.value)" }.joined(separator: ", ") + ")"))
    }
    phase("idle") { usleep(UInt32(seconds * 1_000_000)) }
    try phase("the demo app's traffic") {
        let central = try LoopbackTCPClient(port: daemon.port)
        try central.send(DemoAppTraffic.enable)
        var traffic = DemoAppTraffic()
        let start = ContinuousClock.now
        while (ContinuousClock.now - start).inSeconds < seconds {
            try central.send(traffic.next(at: (ContinuousClock.now - start).inSeconds))
            usleep(DemoAppTraffic.period)
        }
    }
}
