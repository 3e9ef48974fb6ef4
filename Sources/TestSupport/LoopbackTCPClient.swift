#if canImport(Glibc)
import Glibc
#endif

/// A socket call that failed, with errno.
public struct TCPClientError: Error, CustomStringConvertible {
    public var description: String
}

/// A TCP client speaking raw bytes; its reads wait as ``eventually`` does.
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

    /// Ends the connection now (the board reads its end), whenever ARC
    /// releases this client.
    public func disconnect() { shutdown(fd, Int32(SHUT_RDWR)) }

    /// Writes all of `bytes`.
    public func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard written > 0 else { throw TCPClientError(description: "send: errno \(errno)") }
            offset += written
        }
    }

    /// Reads until `count` bytes arrived (or the peer closed, or the wait
    /// ran out of tries: ``Patience``); returns what came.
    public func receive(count: Int) -> [UInt8] {
        var received: [UInt8] = []
        if count > 0 {
            receiveChunks(from: fd) { chunk in
                received += chunk
                return received.count < count
            }
        }
        return received
    }

    /// Reads until `count` bytes arrived or `timeout` passed; returns what
    /// came. For the benchmarks, which time things; a test waits with
    /// ``receive(count:)``.
    public func receive(count: Int, timeout: Duration) -> [UInt8] {
        var received: [UInt8] = []
        let deadline = ContinuousClock.now + timeout
        while received.count < count {
            let left = ContinuousClock.now.duration(to: deadline)
            guard left > .zero else { break }
            var pollfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            _ = poll(&pollfd, 1, Int32(clamping: left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000 + 1))
            guard drain(fd, { chunk in
                received += chunk
                return received.count < count
            }) == .more else { break }
        }
        return received
    }

    /// True once the peer has closed the connection (waiting for that as
    /// ``eventually`` does); bytes still unread are read and dropped.
    public var isClosedByPeer: Bool {
        var closed = false
        receiveChunks(from: fd, whenClosed: { closed = true }) { _ in true }
        return closed
    }
}

/// Receives from `fd` (a socket or a pipe) until the peer closes (then
/// `whenClosed`), an error, or `body` has what it waited for: each read (a
/// stream chunk or one datagram) goes to `body`, which returns false then.
/// Bounded as ``eventually`` is, by tries: a try reads what has arrived.
public func receiveChunks(from fd: Int32, whenClosed: () -> Void = {}, _ body: ([UInt8]) -> Bool) {
    _ = eventually {
        switch drain(fd, body) {
        case .more: return false
        case .done: return true
        case .closed:
            whenClosed()
            return true
        }
    }
}

private enum Drained { case more, done, closed }

/// Reads what has arrived on `fd` (a socket or a pipe) without waiting, a
/// read at a time (a stream chunk or one datagram), into `body` (false: it
/// has what it wanted). `.closed` at the end of the stream or on an error.
private func drain(_ fd: Int32, _ body: ([UInt8]) -> Bool) -> Drained {
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        var ready = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let polled = poll(&ready, 1, 0)
        if polled == 0 || (polled < 0 && errno == EINTR) { return .more }
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n > 0 {
            if !body(Array(buffer[0..<n])) { return .done }
            continue
        }
        if n < 0 && (errno == EAGAIN || errno == EINTR) { return .more }
        return .closed
    }
}
