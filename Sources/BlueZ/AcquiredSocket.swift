#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// Our end of a `SOCK_SEQPACKET` socketpair whose other end went to BlueZ
/// through `AcquireWrite` or `AcquireNotify` (org.bluez.GattCharacteristic1
/// in BlueZ's doc/org.bluez.GattCharacteristic.rst): one datagram per ATT
/// write or notification, no D-Bus round trip per packet.
///
/// A thread of its own blocks in `read(2)`, so the D-Bus thread's poll loop
/// stays libdbus's alone; it ends at EOF (BlueZ closed its end: the central
/// went away, unsubscribed, or BlueZ replaced the socket) or on ``close()``.
final class AcquiredSocket: @unchecked Sendable {
    // `fd` is immutable; `state` is under `lock`, which makes the unchecked
    // Sendable sound: send/shutdown/close of the descriptor never race, and
    // the descriptor is closed once, by the reader, after its last read.
    private enum State { case open, shuttingDown, closed }

    /// The BlueZ device path the socket was acquired for.
    let central: String
    /// The ATT MTU BlueZ reported; a notification carries at most `mtu - 3` bytes.
    let mtu: Int
    private let fd: Int32
    private let lock = NSLock()
    private var state = State.open

    private init(fd: Int32, central: String, mtu: Int) {
        self.fd = fd
        self.central = central
        self.mtu = mtu
    }

    /// A new pair: our end, and BlueZ's end (the caller passes it in the
    /// D-Bus reply — libdbus duplicates it while marshalling — and closes it).
    static func pair(central: String, mtu: Int) -> (socket: AcquiredSocket, remote: Int32)? {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0 else { return nil }
        return (AcquiredSocket(fd: fds[0], central: central, mtu: mtu), fds[1])
    }

    /// Starts the reader thread: `received` gets each datagram in order,
    /// then `ended` once.
    func start(name: String, received: @escaping @Sendable ([UInt8]) -> Void, ended: @escaping @Sendable () -> Void) {
        let thread = Thread { [self] in
            // An ATT write carries at most 512 bytes of value (Core 5.3 Vol 3 Part F 3.2.9).
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if count > 0 {
                    received(Array(buffer[0..<count]))
                } else if count < 0, errno == EINTR {
                    continue
                } else {
                    break
                }
            }
            lock.withLock {
                state = .closed
                Glibc.close(fd)
            }
            ended()
        }
        thread.name = name
        thread.start()
    }

    /// Sends one datagram without blocking; false when the socket is gone
    /// or full (a notification is dropped rather than stalling the caller).
    @discardableResult
    func send(_ bytes: [UInt8]) -> Bool {
        lock.withLock {
            guard state == .open else { return false }
            return bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT) | Int32(MSG_NOSIGNAL)) } == bytes.count
        }
    }

    /// Ends the socket: the reader drains what is queued, then sees EOF.
    func close() {
        lock.withLock {
            guard state == .open else { return }
            state = .shuttingDown
            _ = shutdown(fd, Int32(SHUT_RDWR))
        }
    }
}
