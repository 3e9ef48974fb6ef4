#if canImport(Glibc)
import Glibc
#endif

/// A socket call that failed, with errno.
public struct TCPClientError: Error, CustomStringConvertible {
    public var description: String
}

/// A blocking TCP client with timeouts, speaking raw bytes.
public final class LoopbackTCPClient {
    public let fd: Int32

    /// Connects to 127.0.0.1:`port` with TCP_NODELAY (frames are tiny).
    public init(port: UInt16) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TCPClientError(description: "socket: \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard result == 0 else {
            close(fd)
            throw TCPClientError(description: "connect to 127.0.0.1:\(port): errno \(errno)")
        }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    }

    deinit { close(fd) }

    /// Writes all of `bytes`.
    public func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard written > 0 else { throw TCPClientError(description: "send: errno \(errno)") }
            offset += written
        }
    }

    /// Reads until `count` bytes arrived or `timeout` passed; returns what came.
    public func receive(count: Int, timeout: Duration = .seconds(3)) -> [UInt8] {
        var received: [UInt8] = []
        if count > 0 {
            receiveChunks(from: fd, until: .now + timeout) { chunk in
                received += chunk
                return received.count < count
            }
        }
        return received
    }

    /// True once the peer has closed the connection.
    public func isClosedByPeer(within timeout: Duration) -> Bool {
        var pollfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let milliseconds = Int32(timeout.components.seconds * 1000)
        guard poll(&pollfd, 1, milliseconds) > 0 else { return false }
        var byte: UInt8 = 0
        return recv(fd, &byte, 1, Int32(MSG_PEEK)) == 0
    }
}

/// Receives from `fd` until `deadline`, the peer closing, or an error:
/// each `recv` (a stream chunk or one datagram) goes to `body`, which
/// returns false once it has what it waited for.
public func receiveChunks(from fd: Int32, until deadline: ContinuousClock.Instant, _ body: ([UInt8]) -> Bool) {
    var buffer = [UInt8](repeating: 0, count: 4096)
    while true {
        let left = ContinuousClock.now.duration(to: deadline)
        if left <= .zero { return }
        var pollfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let milliseconds = Int32(left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000)
        guard poll(&pollfd, 1, max(1, milliseconds)) > 0 else { continue }
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if n <= 0 { return }
        if !body(Array(buffer[0..<n])) { return }
    }
}
