import BLEControlProtocol
import Board
import DeviceEmulators
import Runtime
import Foundation
import LinuxHardware
import MQTT
import Reactor
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

// The flood of issue #28: the release daemon as a process, given the worst
// input one sender can make on each transport (MEGABYTES of `09 00`, an
// unknown command, so that every two bytes would draw an ERROR reply), while
// a TCP central beside it measures its own ERROR round trip, one at a time,
// 16 a second (within its reply budget).
// Printed per transport: the daemon's idle and peak resident memory (VmHWM,
// reset when the flood starts), the probe's round trips (p50, max), what the
// daemon sent back to the flooder, and what it logged. Figures, not checks;
// the goal is a peak within 16 MB of idle and no round trip over 100 ms.
// The BLE central's figures come from the BLE tier (Tests/BLE/run --bench).

/// A central that keeps asking for an ERROR and times each answer.
private final class RoundTripProbe: @unchecked Sendable {
    private let lock = NSLock()
    private var samples: [Double] = []
    private var running = true
    private var thread: Thread?
    private(set) var failure: String?

    init(port: UInt16) throws {
        nonisolated(unsafe) let central = try LoopbackTCPClient(port: port)
        // INIT: a TCP connection opens with a frame or is closed unread.
        try central.send([0x00, 0x00])
        let thread = Thread { [self] in
            while lock.withLock({ running }) {
                let start = ContinuousClock.now
                do {
                    try central.send([0x09, 0x00])
                } catch {
                    lock.withLock { failure = "\(error)" }
                    return
                }
                let reply = central.receive(count: 3, timeout: .seconds(120))
                let took = (ContinuousClock.now - start).inSeconds * 1000
                guard reply == [0xFF, 0x01, 0x09] else {
                    lock.withLock { failure = "the probe's ERROR did not come back: \(reply)" }
                    return
                }
                lock.withLock { samples.append(took) }
                // 16 a second: within a central's reply budget (20 a second
                // after a burst of 8), so every ERROR asked for comes back.
                usleep(60_000)
            }
        }
        self.thread = thread
        thread.start()
    }

    /// Round trips in ms since the last call.
    func take() -> [Double] {
        lock.withLock {
            defer { samples.removeAll() }
            return samples
        }
    }

    func stop() { lock.withLock { running = false } }
}

/// VmRSS and VmHWM of `pid`, in kB.
private func residentAndPeak(_ pid: Int32) -> (rss: Int, peak: Int) {
    let status = ProcessView(pid: pid).status(["VmRSS", "VmHWM"])
    return (status["VmRSS"] ?? 0, status["VmHWM"] ?? 0)
}

/// One transport's run: `flood` sends the bytes its way and returns a
/// word on what came back; the probe runs throughout.
private func floodRun(_ name: String, daemon: DaemonProcess, flood: () throws -> String) throws {
    let pid = daemon.pid
    usleep(300_000)
    let idle = residentAndPeak(pid).rss
    let logBefore = daemon.logBytes()
    let probe = try RoundTripProbe(port: daemon.port)
    defer { probe.stop() }
    usleep(300_000)
    let quiet = probe.take()
    ProcessView(pid: pid).resetPeak()
    let started = ContinuousClock.now
    let outcome = try flood()
    let elapsed = (ContinuousClock.now - started).inSeconds
    usleep(500_000)
    let during = probe.take()
    let peak = residentAndPeak(pid).peak
    let logged = daemon.logBytes() - logBefore
    let probeFailure = probe.failure.map { "; PROBE FAILED: \($0)" } ?? ""
    print("  \(name.padding(toLength: 8, withPad: " ", startingAt: 0)) idle \(idle / 1024) MiB, peak \(format(Double(peak) / 1024, 1)) MiB (+\(format(Double(peak - idle) / 1024, 1)));"
          + " probe ERROR round trip quiet p50 \(format(percentile(quiet, 0.5), 2)) ms, during p50 \(format(percentile(during, 0.5), 2)) p99 \(format(percentile(during, 0.99), 1)) max \(format(during.max() ?? .nan, 1)) ms (\(during.count) trips);"
          + " \(format(elapsed, 1)) s; \(outcome); logged \(logged) B\(probeFailure)")
}

/// A board file for the flood: the simulator's, named `name`, with `extra`
/// transports.
private func floodBoard(_ name: String, transports extra: String = "") -> String {
    EmbeddedBoards.simulator
        .board(replacing: "name: simulator", with: "name: \(name)")
        .board(replacing: "transports:\n", with: "transports:\n" + extra)
}

func benchmarkFlood(binary: String, megabytes: Int) throws {
    let garbage = (0..<(megabytes << 20)).map { UInt8($0 % 2 == 0 ? 0x09 : 0x00) }
    print("flood: \(megabytes) MiB of 09 00 (an unknown command: one ERROR per 2 bytes), one sender per transport, \(binary); a TCP central measures its own ERROR round trip meanwhile:")
    print("  (BLE: Tests/BLE/run --flood, on BlueZoo, with a BLE and a TCP central timing their round trips)")

    // MQTT: one message on …/frames.
    if MosquittoBroker.available {
        let broker = try MosquittoBroker()
        let daemon = try DaemonProcess(binary: binary, boardText: floodBoard("flood", transports: broker.mqttSection()), logLevel: "info")
        defer { daemon.stop() }
        guard spin(until: .now + .seconds(60), { (try? daemon.request(#"{"op":"status"}"#)).flatMap(mqttState)?.hasPrefix("connected") == true }) else {
            throw BenchError("the daemon did not connect to the broker")
        }
        let errors = try MosquittoSubscriber(broker, topics: ["blecontrol/flood/errors"])
        let (loop, publisher) = try operatorClient(broker, clientID: "bench-flooder")
        defer { loop.stop() }
        // One message of it all, then the same bytes cut into messages
        // just under the board's Maximum Packet Size (the most a broker
        // that honours it lets through).
        let piece = Int(MQTTTransport.maximumPacketSize) - 64
        for (name, messages) in [("MQTT 1", [garbage]), ("MQTT \(piece >> 10)K", stride(from: 0, to: garbage.count, by: piece).map { Array(garbage[$0..<min($0 + piece, garbage.count)]) })] {
            let value = UInt16(name.count * 37 % 1000)
            try floodRun(name, daemon: daemon) {
                // The flood, then a marker behind it on the same topic: once
                // the marker's servo value shows, the flood has been dealt with.
                let before = errors.payloads("blecontrol/flood/errors").count
                let marker = FrameEncoder.encode(.enable(channel: 1, on: true)) + FrameEncoder.encode(.servo(channel: 1, value: value))
                for message in messages {
                    guard try loop.submitAndWait({ publisher.publish("blecontrol/flood/frames", message) }) else { throw BenchError("publish failed") }
                }
                _ = try loop.submitAndWait { publisher.publish("blecontrol/flood/frames", marker) }
                let done = spin(until: .now + .seconds(600)) { daemon.pulse(channel: 1).map { abs($0 - 1000 - Double(value)) < 5 } ?? false }
                usleep(200_000)
                let replies = errors.payloads("blecontrol/flood/errors").count - before
                return "\(messages.count) message\(messages.count == 1 ? "" : "s"), \(done ? "marker applied" : "MARKER NOT APPLIED"), \(replies) messages on …/errors"
            }
        }
    } else {
        print("  MQTT   skipped (no \(MosquittoBroker.binary): scripts/install-deps unit installs it)")
    }

    // TCP: one connection writes the flood and never reads its replies.
    do {
        let daemon = try DaemonProcess(binary: binary, boardText: floodBoard("flood-tcp"), logLevel: "info")
        defer { daemon.stop() }
        try floodRun("TCP", daemon: daemon) {
            let flooder = try LoopbackTCPClient(port: daemon.port)
            // INIT first: a connection whose first bytes are not a frame is
            // closed unread (the TCP transport is no web endpoint), and the
            // flood is what a central that did connect can send.
            try flooder.send([0x00, 0x00])
            var sent = 0
            var ended = ""
            while sent < garbage.count {
                let end = min(sent + 65536, garbage.count)
                do { try flooder.send(Array(garbage[sent..<end])) } catch { ended = " (closed after \(sent >> 10) KiB: \(error))"; break }
                sent = end
            }
            return "sent \(sent >> 20) MiB\(ended)"
        }
    }

    // HM-10: the module's central writes the flood through the UART; the
    // module reads the replies as a real one would (it forwards them).
    do {
        let pty = try PseudoTerminal()
        let module = HM10Emulator(master: pty.master, answersAT: true)
        defer {
            module.stop()
            pty.close()
        }
        let daemon = try DaemonProcess(binary: binary, boardText: floodBoard("flood-serial", transports: "  serial: { device: \(pty.slavePath), baud: 115200 }\n"), logLevel: "info")
        defer { daemon.stop() }
        _ = spin(until: .now + .seconds(30)) { module.notificationsOn }
        module.connect()
        try floodRun("HM-10", daemon: daemon) {
            let marker = FrameEncoder.encode(.enable(channel: 1, on: true)) + FrameEncoder.encode(.servo(channel: 1, value: 777))
            module.centralWrites(garbage + marker)
            let done = spin(until: .now + .seconds(600)) { daemon.pulse(channel: 1).map { abs($0 - 1777) < 5 } ?? false }
            return done ? "marker applied" : "MARKER NOT APPLIED"
        }
    }
}

private func mqttState(_ reply: [String: Any]) -> String? {
    ((reply["status"] as? [String: Any])?["transports"] as? [String: Any])?["mqtt"] as? String
}

extension DaemonProcess {
    /// Channel `channel`'s pulse in µs from status, if it has one.
    func pulse(channel: Int) -> Double? {
        guard let reply = try? request(#"{"op":"status"}"#),
              let channels = (reply["status"] as? [String: Any])?["channels"] as? [[String: Any]],
              let entry = channels.first(where: { ($0["channel"] as? Int) == channel }) else { return nil }
        return (entry["pulse_us"] as? Double) ?? (entry["pulse_us"] as? Int).map(Double.init)
    }
}
