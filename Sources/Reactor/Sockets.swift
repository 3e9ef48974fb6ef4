#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CReactor
import SystemPackage

/// Every socket syscall the daemon and its client make goes through here:
/// `EINTR` is retried, failures become `Errno` values with the call named,
/// and descriptors are close-on-exec (and non-blocking where a loop owns
/// them) from birth.
public enum Sockets {
    public struct Failure: Error, CustomStringConvertible {
        public var call: String
        public var errno: Errno
        public var description: String { "\(call): \(errno)" }
        public init(call: String, errno: Errno) {
            self.call = call
            self.errno = errno
        }
    }

    /// Runs a syscall that returns -1 on failure, retrying on EINTR.
    @discardableResult
    public static func check(_ call: @autoclosure () -> String, _ body: () -> Int32) throws(Failure) -> Int32 {
        while true {
            let result = body()
            if result >= 0 { return result }
            let code = Glibc.errno
            if code == EINTR { continue }
            throw Failure(call: call(), errno: Errno(rawValue: code))
        }
    }

    /// A listening TCP socket on host:port (IPv4 or IPv6 literal, or "localhost").
    public static func listenTCP(host: String, port: UInt16, backlog: Int32 = 128) throws -> FileDescriptor {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, String(port), &hints, &list)
        guard status == 0, let first = list else {
            throw Failure(call: "resolve \(host)", errno: Errno(rawValue: status == EAI_SYSTEM ? Glibc.errno : EINVAL))
        }
        defer { freeaddrinfo(list) }
        let fd = try check("socket") { socket(first.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) }
        do {
            var one: Int32 = 1
            try check("setsockopt SO_REUSEADDR") { setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size)) }
            try check("bind \(host):\(port)") { bind(fd, first.pointee.ai_addr, first.pointee.ai_addrlen) }
            try check("listen \(host):\(port)") { listen(fd, backlog) }
        } catch {
            close(fd)
            throw error
        }
        return FileDescriptor(rawValue: fd)
    }

    /// Whether a TCP connection to host:port is accepted within `timeout`
    /// (the doctor's probe of a broker): nil when it is, else why not.
    public static func probeTCP(host: String, port: UInt16, timeout: Duration) -> String? {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_NUMERICSERV
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, String(port), &hints, &list)
        guard status == 0, let first = list else { return "cannot resolve \(host): \(String(cString: gai_strerror(status)))" }
        defer { freeaddrinfo(list) }
        let fd = socket(first.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return String(cString: strerror(Glibc.errno)) }
        defer { close(fd) }
        if connect(fd, first.pointee.ai_addr, first.pointee.ai_addrlen) == 0 { return nil }
        guard Glibc.errno == EINPROGRESS else { return String(cString: strerror(Glibc.errno)) }
        var descriptor = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
        guard poll(&descriptor, 1, Int32(clamping: timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000)) == 1 else {
            return "no answer within \(timeout)"
        }
        var error: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length)
        return error == 0 ? nil : String(cString: strerror(error))
    }

    /// A listening Unix stream socket at `path`; a stale socket file left by
    /// a crashed daemon is replaced, a socket some live process still answers
    /// on (a second daemon) or anything else at that path is an error.
    public static func listenUnix(path: String, mode: mode_t = 0o660, backlog: Int32 = 64) throws -> FileDescriptor {
        var address = try unixAddress(path)
        var info = stat()
        if lstat(path, &info) == 0 {
            guard (info.st_mode & S_IFMT) == S_IFSOCK else {
                throw Failure(call: "bind \(path): exists and is not a socket", errno: .fileExists)
            }
            if let live = try? connectUnix(path: path) {
                try? live.close()
                throw Failure(call: "bind \(path): another process (a second blecontrold?) is listening there", errno: .addressInUse)
            }
            unlink(path)
        }
        let fd = try check("socket") { socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) }
        do {
            _ = try withUnsafePointer(to: &address) { pointer in
                try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                    try check("bind \(path)") { bind(fd, sa, socklen_t(MemoryLayout<sockaddr_un>.size)) }
                }
            }
            chmod(path, mode)
            try check("listen \(path)") { listen(fd, backlog) }
        } catch {
            close(fd)
            throw error
        }
        return FileDescriptor(rawValue: fd)
    }

    /// Connects (blocking) to a Unix stream socket.
    public static func connectUnix(path: String) throws -> FileDescriptor {
        var address = try unixAddress(path)
        let fd = try check("socket") { socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) }
        do {
            _ = try withUnsafePointer(to: &address) { pointer in
                try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                    try check("connect \(path)") { connect(fd, sa, socklen_t(MemoryLayout<sockaddr_un>.size)) }
                }
            }
        } catch {
            close(fd)
            throw error
        }
        return FileDescriptor(rawValue: fd)
    }

    /// The user id of the process at the other end of a connected Unix
    /// socket, as the kernel recorded it when that process called
    /// `listen` or `connect` (SO_PEERCRED, unix(7)); nil if it cannot say.
    public static func peerUID(_ fd: FileDescriptor) -> uid_t? {
        // struct ucred is pid_t, uid_t, gid_t: three 32-bit fields (the
        // struct itself is only declared under _GNU_SOURCE).
        var credentials: (Int32, UInt32, UInt32) = (0, 0, 0)
        var length = socklen_t(MemoryLayout.size(ofValue: credentials))
        guard getsockopt(fd.rawValue, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0,
              Int(length) == MemoryLayout.size(ofValue: credentials) else { return nil }
        return credentials.1
    }

    /// What accepting one connection gave.
    public enum Accepted {
        case connection(FileDescriptor, peer: String)
        /// Nothing pending.
        case none
        /// The process or the system is out of descriptors (EMFILE/ENFILE):
        /// the listener stays readable, so the caller must back off rather
        /// than poll it again at once.
        case outOfDescriptors(Errno)
    }

    /// Accepts one pending connection, non-blocking and close-on-exec.
    public static func accept(_ listener: FileDescriptor) throws -> Accepted {
        var storage = sockaddr_storage()
        while true {
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let fd = withUnsafeMutablePointer(to: &storage) { pointer in
                creactor_accept(listener.rawValue, pointer, &length)
            }
            if fd >= 0 {
                var one: Int32 = 1
                // Frames are tiny; Nagle would hold an ERROR reply back for an
                // ACK. (Fails harmlessly on Unix sockets.)
                setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
                return .connection(FileDescriptor(rawValue: fd), peer: describe(&storage))
            }
            let code = Glibc.errno
            switch code {
            case EINTR: continue
            case EAGAIN, EWOULDBLOCK: return .none
            // The peer went away between the SYN and our accept; not our problem.
            case ECONNABORTED, EPROTO: continue
            case EMFILE, ENFILE, ENOBUFS, ENOMEM: return .outOfDescriptors(Errno(rawValue: code))
            default: throw Failure(call: "accept", errno: Errno(rawValue: code))
            }
        }
    }

    /// The local port a listener ended up on (port 0 asks the kernel for one).
    public static func localPort(_ fd: FileDescriptor) -> UInt16? {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let status = withUnsafeMutablePointer(to: &storage) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd.rawValue, $0, &length) }
        }
        guard status == 0 else { return nil }
        switch Int32(storage.ss_family) {
        case AF_INET:
            return withUnsafePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin_port) } }
        case AF_INET6:
            return withUnsafePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin6_port) } }
        default:
            return nil
        }
    }

    /// A receive timeout on a blocking socket (the CLI's replies).
    /// How long a dead peer (its link gone without a FIN or RST: a LAN
    /// central that lost power or Wi-Fi) can stay an open connection: TCP
    /// keepalive probes after `idle` of silence, every `interval`, `count`
    /// unanswered ones closing it (tcp(7)), and TCP_USER_TIMEOUT closing one
    /// whose sent data stays unacknowledged for `userTimeout` (RFC 5482).
    public struct Liveness: Sendable, Equatable {
        public var idle: Int32 = 10
        public var interval: Int32 = 5
        public var count: Int32 = 3
        public var userTimeoutMs: UInt32 = 30_000
        public init() {}
        /// The longest a silent dead peer goes unnoticed: idle + count × interval.
        public var deadPeerSeconds: Int32 { idle + count * interval }
    }

    /// Turns ``Liveness`` on for a connected TCP socket. Returns what the
    /// kernel holds afterwards (read back), or nil when a call failed.
    @discardableResult
    public static func setLiveness(_ fd: FileDescriptor, _ liveness: Liveness = Liveness()) -> Liveness? {
        var one: Int32 = 1
        var idle = liveness.idle, interval = liveness.interval, count = liveness.count
        var userTimeout = liveness.userTimeoutMs
        let size = socklen_t(MemoryLayout<Int32>.size)
        guard setsockopt(fd.rawValue, SOL_SOCKET, SO_KEEPALIVE, &one, size) == 0,
              setsockopt(fd.rawValue, Int32(IPPROTO_TCP), TCP_KEEPIDLE, &idle, size) == 0,
              setsockopt(fd.rawValue, Int32(IPPROTO_TCP), TCP_KEEPINTVL, &interval, size) == 0,
              setsockopt(fd.rawValue, Int32(IPPROTO_TCP), TCP_KEEPCNT, &count, size) == 0,
              setsockopt(fd.rawValue, Int32(IPPROTO_TCP), TCP_USER_TIMEOUT, &userTimeout, socklen_t(MemoryLayout<UInt32>.size)) == 0 else { return nil }
        return Sockets.liveness(of: fd)
    }

    /// The keepalive settings a TCP socket has now (nil: keepalive off).
    public static func liveness(of fd: FileDescriptor) -> Liveness? {
        func option(_ level: Int32, _ name: Int32) -> Int32? {
            var value: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            return getsockopt(fd.rawValue, level, name, &value, &length) == 0 ? value : nil
        }
        guard option(SOL_SOCKET, SO_KEEPALIVE) == 1, let idle = option(Int32(IPPROTO_TCP), TCP_KEEPIDLE),
              let interval = option(Int32(IPPROTO_TCP), TCP_KEEPINTVL), let count = option(Int32(IPPROTO_TCP), TCP_KEEPCNT),
              let userTimeout = option(Int32(IPPROTO_TCP), TCP_USER_TIMEOUT) else { return nil }
        var result = Liveness()
        result.idle = idle
        result.interval = interval
        result.count = count
        result.userTimeoutMs = UInt32(userTimeout)
        return result
    }

    public static func setReceiveTimeout(_ fd: FileDescriptor, _ timeout: Duration) {
        let (seconds, attoseconds) = timeout.components
        var value = timeval(tv_sec: Int(seconds), tv_usec: Int(attoseconds / 1_000_000_000_000))
        setsockopt(fd.rawValue, SOL_SOCKET, SO_RCVTIMEO, &value, socklen_t(MemoryLayout<timeval>.size))
    }

    private static func unixAddress(_ path: String) throws(Failure) -> sockaddr_un {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard !bytes.isEmpty, bytes.count < capacity else {
            throw Failure(call: "socket path \(path): longer than \(capacity - 1) bytes", errno: .fileNameTooLong)
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        return address
    }

    private static func describe(_ storage: inout sockaddr_storage) -> String {
        var host = [CChar](repeating: 0, count: Int(NI_MAXHOST))
        var service = [CChar](repeating: 0, count: Int(NI_MAXSERV))
        let status = withUnsafePointer(to: &storage) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                getnameinfo($0, socklen_t(MemoryLayout<sockaddr_storage>.size), &host, socklen_t(host.count), &service, socklen_t(service.count), NI_NUMERICHOST | NI_NUMERICSERV)
            }
        }
        guard status == 0 else { return "unix" }
        let hostName = String(decoding: host.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let serviceName = String(decoding: service.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return hostName.contains(":") ? "[\(hostName)]:\(serviceName)" : "\(hostName):\(serviceName)"
    }
}
