import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Where the built executables are: scripts/test exports their paths; a
/// plain `swift test` after `swift build` finds them beside the test bundle.
enum Executables {
    static func path(_ name: String, environment variable: String) -> String {
        if let path = ProcessInfo.processInfo.environment[variable], !path.isEmpty { return path }
        // The test bundle lives in the same bin directory as the products.
        let bundle = Bundle.main.bundleURL.deletingLastPathComponent()
        for directory in [bundle, bundle.deletingLastPathComponent()] {
            let candidate = directory.appendingPathComponent(name).path
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return root.appendingPathComponent(".build/debug/\(name)").path
    }

    static var daemon: String { path("blecontrold", environment: "BLECONTROLD_BIN") }
    static var cli: String { path("blecontrol", environment: "BLECONTROL_BIN") }

    /// The daemons the signal tests run: the one built for the tests, and
    /// the release build when scripts/test names it (the optimiser once
    /// ended the signal sources' lifetime early in release builds only).
    static var daemons: [String] {
        var all = [daemon]
        if let release = ProcessInfo.processInfo.environment["BLECONTROLD_RELEASE_BIN"], !release.isEmpty, release != daemon { all.append(release) }
        return all
    }
}

struct HarnessError: Error, CustomStringConvertible {
    var description: String
}

/// The output of a finished process.
struct Finished {
    var status: Int32
    var stdout: String
    var stderr: String
}

/// Runs a program to completion (waiting as `eventually` does) and
/// collects its output.
func run(_ executable: String, _ arguments: [String]) throws -> Finished {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    let out = Pipe(), err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    // Read while it runs so a full pipe cannot block it.
    let outData = LockedData(), errData = LockedData()
    let group = DispatchGroup()
    for (pipe, sink) in [(out, outData), (err, errData)] {
        group.enter()
        DispatchQueue.global().async {
            sink.set(pipe.fileHandleForReading.readDataToEndOfFile())
            group.leave()
        }
    }
    guard eventually({ !process.isRunning }) else {
        process.terminate()
        throw HarnessError(description: "\(executable) \(arguments) did not finish")
    }
    group.wait()
    return Finished(status: process.terminationStatus, stdout: String(decoding: outData.get(), as: UTF8.self), stderr: String(decoding: errData.get(), as: UTF8.self))
}

final class LockedData: @unchecked Sendable {
    private let lock = NSLock()
    private var data = Data()
    func set(_ value: Data) { lock.withLock { data = value } }
    func get() -> Data { lock.withLock { data } }
}

/// A `blecontrold` on the simulator board, on a free TCP port and a private
/// control socket, stopped with SIGTERM when the test is done.
final class SimulatorDaemon {
    let process = Process()
    let directory: URL
    let socketPath: String
    private(set) var tcpPort: UInt16 = 0
    private let log: URL

    /// `user`: run it as this user (and its group, no others) through
    /// setpriv(1), the test being root; its directory is then that user's,
    /// and readiness is seen with a raw status request (`blecontrol`
    /// refuses a socket of another user's).
    /// `defaultSocket`: no --socket; the daemon makes its socket where the
    /// board file says, and this is where that is.
    /// `journal`: the daemon's stderr (the log file) passes for systemd's
    /// journal stream ($JOURNAL_STREAM), so it writes `<N>` priorities.
    init(extraArguments: [String] = [], environment: [String: String] = [:], binary: String = Executables.daemon,
         user: uid_t? = nil, defaultSocket: String? = nil, journal: Bool = false) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("blecontrol-e2e-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        socketPath = defaultSocket ?? directory.appendingPathComponent("control.sock").path
        log = directory.appendingPathComponent("daemon.log")
        _ = FileManager.default.createFile(atPath: log.path, contents: nil)
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = (defaultSocket == nil ? ["--socket", socketPath] : []) + ["--tcp", "127.0.0.1:0", "--log-level", "debug"] + extraArguments
        if let user {
            chown(directory.path, user, user)
            process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            process.arguments = ["--reuid=\(user)", "--regid=\(user)", "--clear-groups", binary] + (process.arguments ?? [])
        }
        var environment = environment
        if journal {
            var info = stat()
            guard stat(log.path, &info) == 0 else { throw HarnessError(description: "stat \(log.path)") }
            environment["JOURNAL_STREAM"] = "\(info.st_dev):\(info.st_ino)"
        }
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        }
        let handle = try FileHandle(forWritingTo: log)
        process.standardOutput = handle
        process.standardError = handle
        try process.run()

        // Ready when the control socket answers; the TCP port is in status.
        let ready = try eventuallyValue { () throws -> UInt16? in
            if !process.isRunning { throw HarnessError(description: "blecontrold exited (\(process.terminationStatus)):\n\(self.log(tail: 40))") }
            guard FileManager.default.fileExists(atPath: socketPath), let status = try? (user == nil ? status() : rawStatus()),
                  let tcp = (status["transports"] as? [String: Any])?["tcp"] as? String,
                  let port = tcp.split(separator: ":").last.flatMap({ UInt16($0) }), port != 0 else { return nil }
            return port
        }
        guard let ready else { throw HarnessError(description: "blecontrold did not become ready:\n\(self.log(tail: 40))") }
        tcpPort = ready
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(at: directory)
    }

    /// SIGTERM and wait; returns the exit status.
    @discardableResult
    func stop() -> Int32 {
        if process.isRunning {
            process.terminate()
            if !eventually({ !process.isRunning }) { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
        return process.terminationStatus
    }

    var isRunning: Bool { process.isRunning }

    /// Sends `signal` and waits for the daemon to exit (as `eventually`
    /// does, so a daemon that ignores it fails the test instead of hanging
    /// it); nil if it did not.
    func exit(after signal: Int32) -> (status: Int32, reason: Process.TerminationReason)? {
        kill(process.processIdentifier, signal)
        guard eventually({ !process.isRunning }) else { return nil }
        return (process.terminationStatus, process.terminationReason)
    }

    /// The whole log.
    var logText: String { (try? String(contentsOf: log, encoding: .utf8)) ?? "" }

    func log(tail lines: Int) -> String {
        let text = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
        return text.split(separator: "\n", omittingEmptySubsequences: false).suffix(lines).joined(separator: "\n")
    }

    /// `blecontrol status --json`, parsed.
    func status() throws -> [String: Any] {
        let result = try cli(["status", "--json"])
        guard result.status == 0 else { throw HarnessError(description: "status failed (\(result.status)): \(result.stderr)") }
        guard let object = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any] else {
            throw HarnessError(description: "status --json is not an object: \(result.stdout)")
        }
        return object
    }

    /// Runs `blecontrol` against this daemon.
    func cli(_ arguments: [String]) throws -> Finished {
        try run(Executables.cli, arguments + ["--socket", socketPath])
    }

    /// Polls status until `condition` holds (outputs apply asynchronously),
    /// as `eventually` does; returns that status.
    func waitFor(_ what: String, _ condition: ([String: Any]) -> Bool) throws -> [String: Any] {
        var last: [String: Any] = [:]
        let seen = try eventuallyValue { () throws -> [String: Any]? in
            last = try status()
            return condition(last) ? last : nil
        }
        guard let seen else { throw HarnessError(description: "never saw \(what); last status: \(last)") }
        return seen
    }

    /// Waits until the PCA9685 and the LCD are online: their start-up writes
    /// (the LCD's power-on sequence) run on the bus after the socket answers.
    @discardableResult
    func waitForChipsOnline() throws -> [String: Any] {
        try waitFor("the PCA9685 and the LCD online") { status in
            ((status["servo"] as? [String: Any])?["online"] as? Bool) == true && ((status["lcd"] as? [String: Any])?["online"] as? Bool) == true
        }
    }
}

/// Status accessors.
extension Dictionary where Key == String, Value == Any {
    func channel(_ number: Int) -> [String: Any]? {
        (self["channels"] as? [[String: Any]])?.first { ($0["channel"] as? Int) == number }
    }
    func pulse(_ channel: Int) -> Double? { self.channel(channel)?["pulse_us"] as? Double }
    var lcdLines: [String] { ((self["lcd"] as? [String: Any])?["lines"] as? [String]) ?? [] }
    func duty(_ channel: Int) -> Double? { self.channel(channel)?["duty"] as? Double }
    /// Switch states in index order.
    var switchStates: [Bool] { ((self["switches"] as? [[String: Any]]) ?? []).compactMap { $0["on"] as? Bool } }
}

extension SimulatorDaemon {
    /// Writes raw bytes to the control socket and returns what comes back
    /// (the daemon answers each line with one JSON line) once `enough` holds
    /// for it (or the daemon closed the connection).
    func rawControl(_ bytes: [UInt8], until enough: (String) -> Bool) throws -> String {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw HarnessError(description: "socket: \(errno)") }
        defer { close(fd) }
        let connected = withUnixAddress(socketPath) { connect(fd, $0, $1) }
        guard connected == 0 else { throw HarnessError(description: "connect \(socketPath): \(errno)") }
        _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var received: [UInt8] = []
        receiveChunks(from: fd) { chunk in
            received += chunk
            return !enough(String(decoding: received, as: UTF8.self))
        }
        return String(decoding: received, as: UTF8.self)
    }

    /// The status, asked for on the control socket without `blecontrol`.
    func rawStatus() throws -> [String: Any] {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw HarnessError(description: "socket: \(errno)") }
        defer { close(fd) }
        guard withUnixAddress(socketPath, { connect(fd, $0, $1) }) == 0 else { throw HarnessError(description: "connect \(socketPath): \(errno)") }
        _ = Array(#"{"op":"status"}"#.utf8 + [0x0A]).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var received: [UInt8] = []
        receiveChunks(from: fd) { chunk in
            received += chunk
            return !received.contains(0x0A)
        }
        guard let reply = try JSONSerialization.jsonObject(with: Data(received)) as? [String: Any],
              let status = reply["status"] as? [String: Any] else {
            throw HarnessError(description: "no status in \(String(decoding: received, as: UTF8.self))")
        }
        return status
    }
}

/// A stand-in for systemd's notification socket: a datagram socket that
/// collects what the daemon sends to $NOTIFY_SOCKET.
final class NotifySocket {
    let path: String
    let fd: Int32

    init() throws {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("notify-\(UUID().uuidString.prefix(8)).sock").path
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        let bound = withUnixAddress(path) { bind(fd, $0, $1) }
        guard bound == 0 else { throw HarnessError(description: "bind \(path): \(errno)") }
    }

    deinit {
        close(fd)
        unlink(path)
    }

    /// The datagrams that arrive until `enough` holds for them (all of
    /// them since the last call).
    func messages(until enough: ([String]) -> Bool) -> [String] {
        var result: [String] = []
        receiveChunks(from: fd) { datagram in
            result.append(String(decoding: datagram, as: UTF8.self))
            return !enough(result)
        }
        return result
    }
}

/// Calls `body` with a `sockaddr_un` for `path` (bind, connect).
func withUnixAddress(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> Int32) -> Int32 {
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &address.sun_path) { raw in
        for (index, byte) in path.utf8.enumerated() where index < raw.count - 1 { raw[index] = byte }
    }
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
}
