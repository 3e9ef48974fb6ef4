#if canImport(Glibc)
import Glibc
#endif
import Reactor
import Synchronization

/// sd_notify(3) without libsystemd: datagrams to `$NOTIFY_SOCKET` (a path,
/// or an abstract socket when it starts with "@"). Silent when the daemon
/// does not run under systemd.
public final class SystemdNotifier: Sendable {
    private let fd: Int32
    private let address: sockaddr_un
    private let addressLength: socklen_t
    /// Half of `$WATCHDOG_USEC` (the interval systemd documents for pings),
    /// nil when the unit has no watchdog.
    public let watchdogInterval: Duration?
    private let lastPing = Mutex<ContinuousClock.Instant?>(nil)

    /// Reads `NOTIFY_SOCKET` and `WATCHDOG_USEC` (and `WATCHDOG_PID`, which
    /// must be ours when set) from the environment.
    public init(environment: [String: String] = SystemdNotifier.processEnvironment(["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"])) {
        var socketFD: Int32 = -1
        var address = sockaddr_un()
        var addressLength = socklen_t(0)
        if let path = environment["NOTIFY_SOCKET"], !path.isEmpty, path.utf8.count < MemoryLayout.size(ofValue: address.sun_path) {
            socketFD = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            address.sun_family = sa_family_t(AF_UNIX)
            var bytes = Array(path.utf8)
            if bytes.first == UInt8(ascii: "@") { bytes[0] = 0 }  // abstract namespace
            withUnsafeMutableBytes(of: &address.sun_path) { raw in
                for (index, byte) in bytes.enumerated() { raw[index] = byte }
            }
            addressLength = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count)
        }
        fd = socketFD
        self.address = address
        self.addressLength = addressLength
        let pidMatches = environment["WATCHDOG_PID"].map { Int32($0) == getpid() } ?? true
        if pidMatches, let usec = environment["WATCHDOG_USEC"].flatMap({ Int64($0) }), usec > 0 {
            watchdogInterval = .microseconds(usec / 2)
        } else {
            watchdogInterval = nil
        }
    }

    deinit { if fd >= 0 { close(fd) } }

    /// The variables among `names` that are set.
    public static func processEnvironment(_ names: [String]) -> [String: String] {
        var values: [String: String] = [:]
        for name in names { values[name] = Files.environment(name) }
        return values
    }

    /// True when systemd listens.
    public var isActive: Bool { fd >= 0 }

    /// Sends `state` lines such as "READY=1" or "STATUS=…".
    /// - Parameter wait: block while systemd's socket is full; a ping does
    ///   not (``watchdogPing(at:)``).
    public func notify(_ state: String, wait: Bool = true) {
        guard fd >= 0 else { return }
        let bytes = Array(state.utf8)
        var address = self.address
        let flags = Int32(MSG_NOSIGNAL) | (wait ? 0 : Int32(MSG_DONTWAIT))
        _ = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                bytes.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, flags, sa, addressLength) }
            }
        }
    }

    /// WATCHDOG=1, at most once per `watchdogInterval` (callers may ping
    /// from a hot loop).
    public func watchdogPing(at now: ContinuousClock.Instant = .now) {
        guard let interval = watchdogInterval, fd >= 0 else { return }
        let due = lastPing.withLock { last -> Bool in
            if let previous = last, now < previous + interval / 2 { return false }
            last = now
            return true
        }
        // From the servo thread, which must never block on a socket: a ping
        // that does not fit now is dropped, and the next one (a quarter of
        // the watchdog's timeout later) goes.
        if due { notify("WATCHDOG=1", wait: false) }
    }
}
