import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

// Benchmarks of the daemon as a process (issue #11): a flooding neighbour,
// a thousand connections, idle wake-ups, the cost of a status request,
// start-up time and memory. Each runs against the daemon binary given and,
// when a baseline binary is given (an older build), against that one too,
// side by side in the same run: these machines are shared and noisy, so
// only figures from one run compare.

/// A `blecontrold` started on the simulator board with a private control
/// socket and an ephemeral TCP port.
final class DaemonProcess {
    let binary: String
    let directory: String
    let socket: String
    let process = Process()
    private(set) var port: UInt16 = 0

    /// - Parameter logLevel: the daemon's; what it logs goes to
    ///   `directory/daemon.log` (``logBytes()``).
    /// - Parameter environment: variables set for the daemon on top of
    ///   this process's (`WATCHDOG_USEC`…); given `directory`, where the
    ///   daemon's files will be.
    init(binary: String, boardText: String? = nil, logLevel: String = "error", environment: ((String) -> [String: String])? = nil) throws {
        self.binary = binary
        directory = NSTemporaryDirectory() + "blecontrol-bench-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        socket = directory + "/control.sock"
        var arguments = ["--socket", socket, "--tcp", "127.0.0.1:0", "--log-level", logLevel]
        if let boardText {
            let path = directory + "/board.yaml"
            try boardText.write(toFile: path, atomically: true, encoding: .utf8)
            arguments += ["--board", path]
        }
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = arguments
        if let environment {
            process.environment = ProcessInfo.processInfo.environment.merging(environment(directory)) { $1 }
        }
        process.standardOutput = FileHandle.nullDevice
        _ = FileManager.default.createFile(atPath: directory + "/daemon.log", contents: nil)
        process.standardError = FileHandle(forWritingAtPath: directory + "/daemon.log") ?? FileHandle.nullDevice
        try process.run()
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            if let status = try? request(#"{"op":"status"}"#), let tcp = Self.tcpEndpoint(status), let port = UInt16(tcp.split(separator: ":").last ?? "") {
                self.port = port
                return
            }
            usleep(5_000)
        }
        throw BenchError("\(binary) did not come up")
    }

    deinit { stop() }

    var pid: Int32 { process.processIdentifier }

    /// The daemon as /proc shows it.
    var view: ProcessView { ProcessView(pid: pid) }

    /// Open descriptors and threads of the daemon, now.
    func descriptorsAndThreads() -> (descriptors: Int, threads: Int) {
        (view.descriptorCount, view.threadCount)
    }

    /// How much the daemon has logged so far.
    func logBytes() -> Int {
        ((try? FileManager.default.attributesOfItem(atPath: directory + "/daemon.log"))?[.size] as? Int) ?? 0
    }

    func stop() {
        if process.isRunning {
            process.terminate()
            process.waitUntilExit()
        }
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// The TCP endpoint from a status reply (old and new layouts alike).
    static func tcpEndpoint(_ reply: [String: Any]) -> String? {
        ((reply["status"] as? [String: Any])?["transports"] as? [String: Any])?["tcp"] as? String
    }

    /// One control request on a fresh connection.
    func request(_ line: String) throws -> [String: Any] {
        let client = try ControlLine(path: socket)
        return try client.request(line)
    }

    /// CPU time of every thread of the daemon, in ns.
    func cpuNanoseconds() -> Int64 { view.threads().reduce(0) { $0 + $1.cpuNanoseconds } }

    /// Context switches of every thread: each is a wake-up (or a preemption).
    func contextSwitches() -> Int { view.threads().reduce(0) { $0 + $1.contextSwitches } }

    /// VmRSS and RssAnon (private memory), in kB.
    func memory() -> (rss: Int, anonymous: Int) {
        let status = view.status(["VmRSS", "RssAnon"])
        return (status["VmRSS"] ?? 0, status["RssAnon"] ?? 0)
    }
}

struct BenchError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A control-socket connection speaking one JSON line each way.
final class ControlLine {
    let fd: Int32
    private var buffer: [UInt8] = []

    init(path: String) throws {
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        let status = withUnixAddress(path) { connect(fd, $0, $1) }
        guard status == 0 else {
            close(fd)
            throw BenchError("connect \(path): \(errno)")
        }
    }

    deinit { close(fd) }

    func request(_ line: String) throws -> [String: Any] {
        let bytes = Array((line + "\n").utf8)
        guard bytes.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) == bytes.count else { throw BenchError("write") }
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            if let newline = buffer.firstIndex(of: 10) {
                let reply = Data(buffer[..<newline])
                buffer.removeSubrange(...newline)
                return (try JSONSerialization.jsonObject(with: reply)) as? [String: Any] ?? [:]
            }
            let count = read(fd, &chunk, chunk.count)
            guard count > 0 else { throw BenchError("the daemon closed the control connection") }
            buffer += chunk[0..<count]
        }
    }
}

func withUnixAddress(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> Int32) -> Int32 {
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &address.sun_path) { raw in
        let bytes = Array(path.utf8)
        raw.copyBytes(from: bytes)
        raw[bytes.count] = 0
    }
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
}

/// Percentile of microsecond samples.
func percentile(_ samples: [Double], _ fraction: Double) -> Double {
    guard !samples.isEmpty else { return .nan }
    let sorted = samples.sorted()
    return sorted[min(sorted.count - 1, Int(Double(sorted.count - 1) * fraction + 0.5))]
}

/// Raises this process's descriptor limit (children inherit it).
func raiseDescriptorLimit(to wanted: rlim_t) {
    var limit = rlimit()
    getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    limit.rlim_cur = min(max(limit.rlim_cur, wanted), limit.rlim_max)
    setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
}

/// A central that writes `09 00` (unknown command: an ERROR reply each) as
/// fast as the daemon takes it and reads the replies, until told to stop.
final class Flooder: @unchecked Sendable {
    // `running` and `sent` are guarded by `lock`; the client is the worker's.
    private let lock = NSLock()
    private var running = true
    private var sent = 0
    private let client: LoopbackTCPClient

    init(port: UInt16) throws {
        client = try LoopbackTCPClient(port: port)
        // A connection that does not start with a frame is closed: INIT first.
        try client.send([0x00, 0x00])
        let fd = client.fd
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        let chunk = (0..<8192).map { $0 % 2 == 0 ? UInt8(0x09) : 0x00 }
        Thread { [self] in
            var scratch = [UInt8](repeating: 0, count: 65536)
            while lock.withLock({ running }) {
                let written = chunk.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
                if written > 0 { lock.withLock { sent += written / 2 } }
                while read(fd, &scratch, scratch.count) > 0 {}
                if written <= 0 {
                    var pollSet = pollfd(fd: fd, events: Int16(POLLIN | POLLOUT), revents: 0)
                    _ = poll(&pollSet, 1, 10)
                }
            }
        }.start()
    }

    /// Stops flooding; returns the frames sent.
    func stop() -> Int {
        lock.withLock {
            running = false
            return sent
        }
    }
}

struct DaemonFigures {
    var wakeupsPerSecond = Double.nan
    var statusRoundTripP50 = Double.nan
    var statusCPUMicroseconds = Double.nan
    var pollRoundTripP50 = Double.nan
    var pollCPUMicroseconds = Double.nan
    var roundTrip = (p50: Double.nan, p99: Double.nan)
    var roundTripFlood = (p50: Double.nan, p99: Double.nan)
    var servoLatency = (p50: Double.nan, p99: Double.nan)
    var servoLatencyFlood = (p50: Double.nan, p99: Double.nan)
    var newConnectionFlood = (p50: Double.nan, p99: Double.nan)
    var floodFrames = 0
    var connectionsAnswered = 0
    var connectionsSeconds = Double.nan
    var connectionsP99 = Double.nan
    var startupMilliseconds = Double.nan
    var rss = 0
    var anonymous = 0
}

/// Round trip of an ERROR-drawing frame on one central, `count` times (µs).
func errorRoundTrips(port: UInt16, count: Int) throws -> [Double] {
    let central = try LoopbackTCPClient(port: port)
    try central.send([0x00, 0x00])  // INIT: a connection starts with a frame
    var samples: [Double] = []
    for _ in 0..<count {
        let start = ContinuousClock.now
        try central.send([0x09, 0x00])
        let reply = central.receive(count: 3, timeout: .seconds(10))
        guard reply == [0xFF, 0x01, 0x09] else { throw BenchError("no ERROR reply (got \(reply))") }
        samples.append(start.duration(to: .now).inSeconds * 1e6)
    }
    return samples
}

/// SERVO_VAL at 200 frames/s on one central for `seconds`; the daemon's
/// own receive → bus-write-complete histogram gives the latency.
func servoLatency(daemon: DaemonProcess, seconds: Double) throws -> (p50: Double, p99: Double) {
    let central = try LoopbackTCPClient(port: daemon.port)
    try central.send([0x01, 0x02, 0x00, 0x01])
    let end = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
    var value: UInt16 = 0
    while ContinuousClock.now < end {
        value = (value + 7) % 1000
        try central.send([0x02, 0x03, 0x00, UInt8(value >> 8), UInt8(value & 0xFF)])
        usleep(5_000)
    }
    usleep(100_000)
    let status = try daemon.request(#"{"op":"status"}"#)
    let servo = (status["status"] as? [String: Any])?["servo"] as? [String: Any]
    return ((servo?["latency_p50_us"] as? Double) ?? .nan, (servo?["latency_p99_us"] as? Double) ?? .nan)
}

func measureDaemon(binary: String, label: String, capBoard: String?) throws -> DaemonFigures {
    var figures = DaemonFigures()

    // Start-up: exec to the TCP port accepting (best of 5).
    var best = Double.infinity
    for _ in 0..<5 {
        let start = ContinuousClock.now
        let daemon = try DaemonProcess(binary: binary)
        _ = try LoopbackTCPClient(port: daemon.port)
        best = min(best, start.duration(to: .now).inSeconds * 1000)
        daemon.stop()
    }
    figures.startupMilliseconds = best

    do {
        let daemon = try DaemonProcess(binary: binary)
        // Idle: no central. Every context switch of every thread is a wake-up.
        usleep(1_000_000)
        let before = daemon.contextSwitches()
        usleep(10_000_000)
        figures.wakeupsPerSecond = Double(daemon.contextSwitches() - before) / 10

        // Status and poll: round trip on one connection, CPU per request.
        let client = try ControlLine(path: daemon.socket)
        for (op, keyPath) in [("status", \DaemonFigures.statusRoundTripP50), ("poll", \DaemonFigures.pollRoundTripP50)] {
            var samples: [Double] = []
            let cpuBefore = daemon.cpuNanoseconds()
            let requests = 2000
            var supported = true
            for _ in 0..<requests {
                let start = ContinuousClock.now
                let reply = try client.request("{\"op\":\"\(op)\"}")
                if reply["ok"] as? Bool != true { supported = false; break }
                samples.append(start.duration(to: .now).inSeconds * 1e6)
            }
            guard supported else { continue }
            let cpu = Double(daemon.cpuNanoseconds() - cpuBefore) / 1000 / Double(requests)
            figures[keyPath: keyPath] = percentile(samples, 0.5)
            if op == "status" { figures.statusCPUMicroseconds = cpu } else { figures.pollCPUMicroseconds = cpu }
        }
        // Memory after a minute at 500 frames/s on 8 channels.
        let central = try LoopbackTCPClient(port: daemon.port)
        var setup: [UInt8] = []
        for channel in 0..<8 { setup += [0x01, 0x02, UInt8(channel), 0x01] }
        try central.send(setup)
        let end = ContinuousClock.now + .seconds(60)
        var next = ContinuousClock.now
        var index = 0
        while ContinuousClock.now < end {
            let value = UInt16((index * 13) % 1000)
            try central.send([0x02, 0x03, UInt8(index % 8), UInt8(value >> 8), UInt8(value & 0xFF)])
            index += 1
            next = next + .milliseconds(2)
            let wait = ContinuousClock.now.duration(to: next)
            if wait > .zero { usleep(useconds_t(wait.inSeconds * 1e6)) }
        }
        (figures.rss, figures.anonymous) = daemon.memory()
        daemon.stop()
    }

    // A quiet central's round trip and servo latency, alone and beside a flood.
    do {
        let daemon = try DaemonProcess(binary: binary)
        let alone = try errorRoundTrips(port: daemon.port, count: 500)
        figures.roundTrip = (percentile(alone, 0.5), percentile(alone, 0.99))
        figures.servoLatency = try servoLatency(daemon: daemon, seconds: 3)
        daemon.stop()
    }
    do {
        let daemon = try DaemonProcess(binary: binary)
        let flooder = try Flooder(port: daemon.port)
        usleep(300_000)
        let flooded = try errorRoundTrips(port: daemon.port, count: 500)
        figures.roundTripFlood = (percentile(flooded, 0.5), percentile(flooded, 0.99))
        var connects: [Double] = []
        for _ in 0..<50 {
            let start = ContinuousClock.now
            let client = try LoopbackTCPClient(port: daemon.port)
            try client.send([0x00, 0x00, 0x09, 0x00])
            if client.receive(count: 3, timeout: .seconds(30)) == [0xFF, 0x01, 0x09] {
                connects.append(start.duration(to: .now).inSeconds * 1e6)
            }
        }
        figures.newConnectionFlood = (percentile(connects, 0.5), percentile(connects, 0.99))
        figures.servoLatencyFlood = try servoLatency(daemon: daemon, seconds: 3)
        figures.floodFrames = flooder.stop()
        daemon.stop()
    }

    // A thousand connections at once, each asking for one reply.
    do {
        raiseDescriptorLimit(to: 8192)
        let daemon = try DaemonProcess(binary: binary, boardText: capBoard)
        var clients: [LoopbackTCPClient] = []
        let start = ContinuousClock.now
        var perConnection: [Double] = []
        for _ in 0..<1000 {
            let opened = ContinuousClock.now
            guard let client = try? LoopbackTCPClient(port: daemon.port) else { break }
            try? client.send([0x00, 0x00, 0x09, 0x00])
            clients.append(client)
            _ = opened
        }
        for client in clients {
            if client.receive(count: 3, timeout: .seconds(60)) == [0xFF, 0x01, 0x09] {
                figures.connectionsAnswered += 1
                perConnection.append(start.duration(to: .now).inSeconds * 1e6)
            }
        }
        figures.connectionsSeconds = start.duration(to: .now).inSeconds
        figures.connectionsP99 = percentile(perConnection, 0.99)
        clients.removeAll()
        daemon.stop()
    }
    return figures
}

func benchmarkDaemon(binary: String, baseline: String?) throws {
    print("the daemon as a process (simulator board; figures side by side from this run):")
    let capBoard = EmbeddedBoardsText.withConnectionCap(1100)
    var runs: [(String, DaemonFigures)] = [("this build", try measureDaemon(binary: binary, label: "this build", capBoard: capBoard))]
    if let baseline {
        runs.append(("baseline", try measureDaemon(binary: baseline, label: "baseline", capBoard: nil)))
    }
    func row(_ name: String, _ value: (DaemonFigures) -> String) {
        var line = "  " + name.padding(toLength: 58, withPad: " ", startingAt: 0)
        for (_, figures) in runs { line += value(figures).padding(toLength: 22, withPad: " ", startingAt: 0) }
        print(line)
    }
    row("", { _ in "" })
    var header = "  " + "".padding(toLength: 58, withPad: " ", startingAt: 0)
    for (label, _) in runs { header += label.padding(toLength: 22, withPad: " ", startingAt: 0) }
    print(header)
    func us(_ value: Double) -> String { value.isNaN ? "n/a" : String(format: "%.0f µs", value) }
    func pair(_ value: (p50: Double, p99: Double)) -> String { "\(us(value.p50)) / \(us(value.p99))" }
    row("idle wake-ups per second (all threads)") { String(format: "%.1f", $0.wakeupsPerSecond) }
    row("status round trip p50") { us($0.statusRoundTripP50) }
    row("status CPU per request") { us($0.statusCPUMicroseconds) }
    row("poll round trip p50") { us($0.pollRoundTripP50) }
    row("poll CPU per request") { us($0.pollCPUMicroseconds) }
    row("ERROR round trip p50 / p99, alone") { pair($0.roundTrip) }
    row("ERROR round trip p50 / p99, beside a flooding central") { pair($0.roundTripFlood) }
    row("new connection → first reply p50 / p99, during the flood") { pair($0.newConnectionFlood) }
    row("servo receive → bus p50 / p99, alone") { pair($0.servoLatency) }
    row("servo receive → bus p50 / p99, beside the flood") { pair($0.servoLatencyFlood) }
    row("flood frames the daemon took") { "\($0.floodFrames)" }
    row("1000 connections at once: answered") { "\($0.connectionsAnswered)" }
    row("  … all answered after, p99 per connection") { String(format: "%.2f s, %.0f ms", $0.connectionsSeconds, $0.connectionsP99 / 1000) }
    row("start-up, exec → TCP accepting (best of 5)") { String(format: "%.1f ms", $0.startupMilliseconds) }
    row("VmRSS / private after 60 s at 500 frames/s") { "\($0.rss / 1024).\(($0.rss % 1024) * 10 / 1024) MB / \($0.anonymous / 1024).\(($0.anonymous % 1024) * 10 / 1024) MB" }
}

/// The simulator board with a higher TCP connection cap (for the 1000
/// connections run).
enum EmbeddedBoardsText {
    static func withConnectionCap(_ cap: Int) -> String? {
        guard let text = try? String(contentsOfFile: FileManager.default.currentDirectoryPath + "/board/simulator.yaml", encoding: .utf8) else { return nil }
        return text.board(replacing: "    listen: 127.0.0.1:7171", with: "    listen: 127.0.0.1:7171\n    max_connections: \(cap)")
    }
}
