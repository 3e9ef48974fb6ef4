#if canImport(Glibc)
import Glibc
#endif
import Foundation
import SystemPackage

/// A blocking client for the control socket, for the CLI and tests.
public final class ControlClient {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    private let fd: FileDescriptor
    private var buffer: [UInt8] = []

    /// Connects to the daemon's control socket; `timeout` bounds every reply.
    public init(path: String, timeout: Duration = .seconds(5)) throws {
        do {
            fd = try Sockets.connectUnix(path: path)
        } catch {
            throw Failure(description: "cannot connect to \(path): \(error) — is blecontrold running? (--socket or BLECONTROL_SOCKET to choose another)")
        }
        let (seconds, attoseconds) = timeout.components
        var value = timeval(tv_sec: Int(seconds), tv_usec: Int(attoseconds / 1_000_000_000_000))
        setsockopt(fd.rawValue, SOL_SOCKET, SO_RCVTIMEO, &value, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { try? fd.close() }

    /// Sends one request and waits for its response line.
    public func request(_ request: ControlProtocol.Request) throws -> ControlProtocol.Response {
        var line = try ControlProtocol.encoder().encode(request)
        line.append(UInt8(ascii: "\n"))
        try line.withUnsafeBytes { _ = try fd.writeAll($0) }
        while true {
            if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let reply = Data(buffer[..<newline])
                buffer.removeSubrange(...newline)
                return try ControlProtocol.decoder().decode(ControlProtocol.Response.self, from: reply)
            }
            var chunk = [UInt8](repeating: 0, count: 65536)
            let count: Int
            do {
                count = try chunk.withUnsafeMutableBytes { try fd.read(into: $0) }
            } catch Errno.wouldBlock {
                throw Failure(description: "the daemon did not answer in time")
            }
            guard count > 0 else { throw Failure(description: "the daemon closed the connection") }
            buffer.append(contentsOf: chunk[0..<count])
        }
    }

    /// The daemon's status.
    public func status() throws -> StatusReport {
        let response = try request(ControlProtocol.Request(op: "status"))
        guard response.ok, let status = response.status else {
            throw Failure(description: response.error ?? "no status in the reply")
        }
        return status
    }

    /// Sends raw frame bytes as a session and returns the frames sent back.
    public func send(_ bytes: [UInt8]) throws -> [UInt8] {
        let response = try request(ControlProtocol.Request(op: "send", hex: ControlProtocol.hex(bytes)))
        if let error = response.error, !response.ok { throw Failure(description: error) }
        return ControlProtocol.bytes(fromHex: response.replies ?? "") ?? []
    }

    /// The default socket: `$BLECONTROL_SOCKET`, else the installed daemon's,
    /// else the simulator's.
    public static func defaultPath(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let path = environment["BLECONTROL_SOCKET"], !path.isEmpty { return path }
        let installed = "/run/blecontrol/control.sock"
        if FileManager.default.fileExists(atPath: installed) { return installed }
        return simulatorSocketPath
    }

    /// Where the simulator board puts its control socket.
    public static let simulatorSocketPath = "/tmp/blecontrol-simulator.sock"
}
