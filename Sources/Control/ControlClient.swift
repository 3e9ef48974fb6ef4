#if canImport(Glibc)
import Glibc
#endif
import Reactor
import SystemPackage

/// A blocking client for the control socket, for the CLI and tests.
public final class ControlClient {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
        public init(description: String) { self.description = description }
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
        Sockets.setReceiveTimeout(fd, timeout)
    }

    deinit { try? fd.close() }

    /// Sends one request and waits for its response line.
    public func request(_ request: ControlProtocol.Request) throws -> ControlProtocol.Response {
        var line = try JSONEncoderLite().encode(request)
        line.append(UInt8(ascii: "\n"))
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
    public func send(_ bytes: [UInt8]) throws -> [UInt8] {
        let response = try request(ControlProtocol.Request(op: .send, hex: ControlProtocol.hex(bytes)))
        if let error = response.error, !response.ok { throw Failure(description: error) }
        return ControlProtocol.bytes(fromHex: response.replies ?? "") ?? []
    }

    /// Removes every BLE bond of the board; returns the addresses forgotten.
    public func forgetBonds() throws -> [String] {
        let response = try request(ControlProtocol.Request(op: .forgetBonds))
        guard response.ok else { throw Failure(description: response.error ?? "forget-bonds failed") }
        return response.forgotten ?? []
    }

    /// The default socket: `$BLECONTROL_SOCKET`, else the installed daemon's,
    /// else the simulator's.
    public static func defaultPath() -> String {
        if let path = Files.environment("BLECONTROL_SOCKET") { return path }
        let installed = "/run/blecontrol/control.sock"
        if Files.exists(installed) { return installed }
        return simulatorSocketPath
    }

    /// Where the simulator board puts its control socket.
    public static let simulatorSocketPath = "/tmp/blecontrol-simulator.sock"
}
