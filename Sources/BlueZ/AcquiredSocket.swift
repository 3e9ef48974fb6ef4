#if canImport(Glibc)
import Glibc
#endif
import Reactor

/// Our end of a `SOCK_SEQPACKET` socketpair whose other end went to BlueZ
/// through `AcquireWrite` or `AcquireNotify` (org.bluez.GattCharacteristic1
/// in BlueZ's doc/org.bluez.GattCharacteristic.rst): one datagram per ATT
/// write or notification, no D-Bus round trip per packet.
///
/// A registration on the D-Bus loop, not a thread: each readable event
/// reads one datagram (one ATT write) and the loop moves on, so an acquired
/// socket is served in turn with the bus. It ends at EOF (BlueZ closed its
/// end: the central went away, unsubscribed, or BlueZ replaced the socket)
/// or on ``close()``.
final class AcquiredSocket: @unchecked Sendable {
    // Loop-confined: every method runs on the D-Bus loop.
    /// The BlueZ device path the socket was acquired for.
    let central: String
    /// The ATT MTU BlueZ reported; a notification carries at most `mtu - 3` bytes.
    let mtu: Int
    private let fd: Int32
    private let loop: EventLoop
    private var token: LoopToken?
    private var open = true
    // An ATT write carries at most 512 bytes of value (Core 5.3 Vol 3 Part F 3.2.9).
    private var buffer = [UInt8](repeating: 0, count: 1024)

    private init(fd: Int32, central: String, mtu: Int, loop: EventLoop) {
        self.fd = fd
        self.central = central
        self.mtu = mtu
        self.loop = loop
    }

    /// A new pair: our end, and BlueZ's end (the caller passes it in the
    /// D-Bus reply — libdbus duplicates it while marshalling — and closes it).
    static func pair(central: String, mtu: Int, loop: EventLoop) -> (socket: AcquiredSocket, remote: Int32)? {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, &fds) == 0 else { return nil }
        return (AcquiredSocket(fd: fds[0], central: central, mtu: mtu, loop: loop), fds[1])
    }

    /// Starts reading: `received` gets each datagram in order, then `ended` once.
    func start(received: @escaping ([UInt8]) -> Void, ended: @escaping () -> Void) throws {
        self.received = received
        self.ended = ended
        token = try loop.register(fd, interest: .readable) { [weak self] _ in self?.readOne() }
    }

    private var received: (([UInt8]) -> Void)?
    private var ended: (() -> Void)?

    /// Reads one datagram; false when there was none (or the socket ended).
    @discardableResult
    private func readOne() -> Bool {
        guard open else { return false }
        let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        if count > 0 {
            received?(Array(buffer[0..<count]))
            return true
        } else if count < 0, errno == EAGAIN || errno == EINTR {
            return false
        }
        close()
        ended?()
        return false
    }

    /// Delivers every datagram already queued, now, in order (the socket
    /// stays open): BlueZ acquired again and the new socket's datagrams
    /// must not overtake these. Bounded by what the socket buffer holds.
    func drainQueued() {
        while readOne() {}
    }

    /// Sends one datagram without blocking; false when the socket is gone
    /// or full (a notification is dropped rather than stalling the loop).
    @discardableResult
    func send(_ bytes: [UInt8]) -> Bool {
        guard open else { return false }
        return bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT) | Int32(MSG_NOSIGNAL)) } == bytes.count
    }

    /// Ends the socket at once.
    func close() {
        guard open else { return }
        open = false
        if let token { loop.unregister(token) }
        token = nil
        Glibc.close(fd)
    }

    deinit { if open { Glibc.close(fd) } }
}

/// The sockets bluetoothd acquired, by central: one AcquireWrite and one
/// AcquireNotify each at most. A new acquisition for the same central
/// replaces the old socket (BlueZ acquires again after a reconnect or an
/// MTU change). Loop-confined, as the sockets are.
struct AcquiredSockets {
    /// AcquireWrite sockets by central.
    private(set) var write: [String: AcquiredSocket] = [:]
    /// AcquireNotify sockets by central.
    private(set) var notify: [String: AcquiredSocket] = [:]
    /// Write sockets a new acquisition replaced, read until BlueZ closes them.
    private var replacedWrite: [ObjectIdentifier: AcquiredSocket] = [:]

    /// Takes `socket` as its central's. A replaced notify socket is closed.
    /// A replaced write socket is kept until BlueZ closes its end and
    /// returned: what BlueZ wrote to it is still the central's (BlueZoo
    /// acquires again when it has not yet seen WriteAcquired change), and
    /// the caller delivers it first, in order (``AcquiredSocket/drainQueued()``,
    /// called after this returns: reading may find BlueZ's end closed, and
    /// that ends the old socket here, in ``ended(_:notify:)``). `first`:
    /// none of its kind was acquired before (WriteAcquired or
    /// NotifyAcquired changes).
    mutating func add(_ socket: AcquiredSocket, notify isNotify: Bool) -> (first: Bool, replacedWrite: AcquiredSocket?) {
        let first = isNotify ? notify.isEmpty : write.isEmpty
        if isNotify {
            notify.updateValue(socket, forKey: socket.central)?.close()
            return (first, nil)
        }
        guard let old = write.updateValue(socket, forKey: socket.central) else { return (first, nil) }
        replacedWrite[ObjectIdentifier(old)] = old
        return (first, old)
    }

    /// What BlueZ closing its end of a socket meant.
    enum Ending {
        /// A socket already replaced or closed: nothing changes.
        case stale
        /// The central's acquisition ended; `last`: no other central has
        /// one of its kind (the property changes).
        case released(last: Bool)
    }

    /// BlueZ closed its end of `socket`: the acquisition ends, not the
    /// session (that ends on Device1 Connected=false).
    mutating func ended(_ socket: AcquiredSocket, notify isNotify: Bool) -> Ending {
        if replacedWrite.removeValue(forKey: ObjectIdentifier(socket)) != nil { return .stale }
        if isNotify {
            guard notify[socket.central] === socket else { return .stale }
            notify[socket.central] = nil
            return .released(last: notify.isEmpty)
        }
        guard write[socket.central] === socket else { return .stale }
        write[socket.central] = nil
        return .released(last: write.isEmpty)
    }

    /// Closes the sockets of `central` (nil: all); returns the acquisitions
    /// released (not the replaced sockets'), write before notify.
    mutating func close(for central: String?) -> [(central: String, notify: Bool)] {
        var released: [(central: String, notify: Bool)] = []
        for (key, socket) in replacedWrite where central == nil || socket.central == central {
            socket.close()
            replacedWrite[key] = nil
        }
        for (key, socket) in write.sorted(by: { $0.key < $1.key }) where central == nil || key == central {
            socket.close()
            write[key] = nil
            released.append((key, false))
        }
        for (key, socket) in notify.sorted(by: { $0.key < $1.key }) where central == nil || key == central {
            socket.close()
            notify[key] = nil
            released.append((key, true))
        }
        return released
    }
}
