#if canImport(Glibc)
import Glibc
#endif
import Reactor
import SystemPackage

/// A blocking client for the control socket, for the CLI and tests.
public final class ControlClient {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
        /// The socket was refused: another user's (see ``init(path:timeout:)``).
        public var refused: Bool
        public init(description: String, refused: Bool = false) {
            self.description = description
            self.refused = refused
        }
    }

    private let fd: FileDescriptor
    private var buffer: [UInt8] = []

    /// Connects to the daemon's control socket; `timeout` bounds every reply.
    ///
    /// A socket that someone else may have made is refused before anything
    /// is sent: whoever serves it would read every request and write the
    /// answers this process prints. The socket file's owner, and the user
    /// of the process that listens on it (SO_PEERCRED), must each be root,
    /// this process's user or the service's (``serviceUser``).
    public init(path: String, timeout: Duration = .seconds(5)) throws {
        fd = try Self.connectTrusted(path: path)
        Sockets.setReceiveTimeout(fd, timeout)
    }

    /// Connects to the control socket at `path` (blocking), refusing one
    /// whose file or listening process belongs to a user this process must
    /// not trust (``trusts(owner:)``): the check every client makes.
    public static func connectTrusted(path: String) throws(Failure) -> FileDescriptor {
        var info = stat()
        if lstat(path, &info) == 0, let refusal = Self.refusal(path: path, owner: info.st_uid, what: "the socket file belongs to") {
            throw Failure(description: refusal, refused: true)
        }
        let fd: FileDescriptor
        do {
            fd = try Sockets.connectUnix(path: path)
        } catch {
            throw Failure(description: "cannot connect to \(path): \(error) — is blecontrold running? (--socket or BLECONTROL_SOCKET to choose another)")
        }
        guard let peer = Sockets.peerUID(fd) else {
            try? fd.close()
            throw Failure(description: "refusing \(path): the kernel does not say who serves it (SO_PEERCRED)", refused: true)
        }
        if let refusal = Self.refusal(path: path, owner: peer, what: "the process serving it runs as") {
            try? fd.close()
            throw Failure(description: refusal, refused: true)
        }
        return fd
    }

    /// The account the installed service runs as (its unit's User=):
    /// `/run/blecontrol/control.sock` is its socket.
    public static let serviceUser = "blecontrol"

    /// Whether a control socket of user `uid` may be trusted by this
    /// process: root's, its own user's, or the service account's (which
    /// only root can create).
    public static func trusts(owner uid: uid_t) -> Bool {
        if uid == 0 || uid == getuid() || uid == geteuid() { return true }
        guard let service = getpwnam(serviceUser) else { return false }
        return service.pointee.pw_uid == uid
    }

    private static func refusal(path: String, owner: uid_t, what: String) -> String? {
        guard !trusts(owner: owner) else { return nil }
        let you = getuid() == 0 ? "" : ", you (\(UserRuntime.userName(getuid())))"
        return "refusing the control socket \(path): \(what) \(UserRuntime.userName(owner)), "
            + "neither root\(you) nor the service user \(serviceUser); "
            + "it could read every request and forge the answers. Remove it, or name your daemon's socket with --socket"
    }

    deinit { try? fd.close() }

    /// The longest answer line read.
    public static let maximumReply = 1 << 20

    /// Sends one request and waits for its response line.
    public func request(_ request: ControlProtocol.Request) throws -> ControlProtocol.Response {
        let line = try ControlProtocol.line(request)
        do {
            _ = try line.withUnsafeBytes { try fd.writeAll($0) }
        } catch {
            throw Failure(description: "the daemon closed the connection (\(error))")
        }
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let reply = Array(buffer[..<newline])
                buffer.removeSubrange(...newline)
                return try JSONDecoderLite().decode(ControlProtocol.Response.self, from: reply)
            }
            let count: Int
            do {
                count = try chunk.withUnsafeMutableBytes { try fd.read(into: $0) }
            } catch Errno.wouldBlock {
                throw Failure(description: "the daemon did not answer in time")
            } catch {
                throw Failure(description: "reading the daemon's reply: \(error)")
            }
            guard count > 0 else { throw Failure(description: "the daemon closed the connection") }
            buffer.append(contentsOf: chunk[0..<count])
            // A status is a few kilobytes: whatever sends more is not a
            // daemon worth reading to the end.
            if buffer.count > Self.maximumReply { throw Failure(description: "the daemon's answer is longer than \(Self.maximumReply >> 20) MiB") }
        }
    }

    /// The daemon's status.
    public func status() throws -> StatusReport {
        let response = try request(ControlProtocol.Request(op: .status))
        guard response.ok, let status = response.status else {
            throw Failure(description: response.error ?? "no status in the reply")
        }
        return status
    }

    /// The small snapshot (frames, pulses, failsafe).
    public func poll() throws -> PollReport {
        let response = try request(ControlProtocol.Request(op: .poll))
        guard response.ok, let poll = response.poll else {
            throw Failure(description: response.error ?? "no poll in the reply")
        }
        return poll
    }

    /// Sends raw frame bytes as a session and returns the frames sent back.
    /// `over`: the servo and PWM values among them move there in that time,
    /// together (a timed move).
    public func send(_ bytes: [UInt8], over: Duration? = nil) throws -> [UInt8] {
        let response = try request(ControlProtocol.Request(op: .send, hex: ControlProtocol.hex(bytes), overMs: over.map(Self.milliseconds)))
        if let error = response.error, !response.ok { throw Failure(description: error) }
        return ControlProtocol.bytes(fromHex: response.replies ?? "") ?? []
    }

    /// Sets a servo or ESC channel's pulse in µs, within its calibration
    /// (the daemon refuses one outside it, with the range); returns the
    /// frames the board sent back, as ``send(_:)``.
    public func pulse(channel: Int, microseconds: Double, over: Duration? = nil) throws -> [UInt8] {
        let response = try request(ControlProtocol.Request(op: .pulse, channel: channel, us: microseconds, overMs: over.map(Self.milliseconds)))
        if let error = response.error, !response.ok { throw Failure(description: error) }
        return ControlProtocol.bytes(fromHex: response.replies ?? "") ?? []
    }

    private static func milliseconds(_ duration: Duration) -> Int {
        Int(duration.components.seconds) * 1000 + Int(duration.components.attoseconds / 1_000_000_000_000_000)
    }

    /// Removes every BLE bond of the board; returns the addresses forgotten.
    public func forgetBonds() throws -> [String] {
        let response = try request(ControlProtocol.Request(op: .forgetBonds))
        guard response.ok else { throw Failure(description: response.error ?? "forget-bonds failed") }
        return response.forgotten ?? []
    }

    /// Ends the failsafe (root, the daemon's own user); the reason it had,
    /// nil when none held.
    public func clearFailsafe() throws -> String? {
        let response = try request(ControlProtocol.Request(op: .clearFailsafe))
        guard response.ok else { throw Failure(description: response.error ?? "clear-failsafe failed") }
        return response.cleared
    }

    /// The default socket: `$BLECONTROL_SOCKET`, else the installed daemon's,
    /// else the simulator's of this user (``UserRuntime/simulatorSocketPath(runtimeDirectory:uid:)``).
    public static func defaultPath() -> String {
        if let path = Files.environment("BLECONTROL_SOCKET") { return path }
        let installed = "/run/blecontrol/control.sock"
        if Files.exists(installed) { return installed }
        return UserRuntime.simulatorSocketPath()
    }
}
