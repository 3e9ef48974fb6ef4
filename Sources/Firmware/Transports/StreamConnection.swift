#if canImport(Glibc)
import Glibc
#endif
import SystemPackage

/// A non-blocking stream socket on the event loop: reads hand bytes to
/// `onData`, writes are queued and drained as the socket accepts them.
/// A peer that stops reading while output piles up past `maxQueued` is
/// dropped rather than allowed to grow our memory.
final class StreamConnection: @unchecked Sendable {
    // Loop-confined: used only on the event loop thread (other threads hop
    // back with `loop.execute`), which makes the unchecked Sendable sound.
    let fd: FileDescriptor
    private let loop: EventLoop
    private var token: EventLoop.Token?
    private var outbound: [UInt8] = []
    private let maxQueued: Int
    private var readBuffer = [UInt8](repeating: 0, count: 4096)
    var onData: (ArraySlice<UInt8>) -> Void = { _ in }
    var onClose: (String?) -> Void = { _ in }
    private(set) var isClosed = false

    init(fd: FileDescriptor, loop: EventLoop, maxQueued: Int = 1 << 20) {
        self.fd = fd
        self.loop = loop
        self.maxQueued = maxQueued
    }

    func start() {
        token = loop.register(fd, interest: .readable) { [weak self] readiness in self?.handle(readiness) }
    }

    /// Queues bytes for the peer.
    func send(_ bytes: [UInt8]) {
        guard !isClosed else { return }
        outbound.append(contentsOf: bytes)
        if outbound.count > maxQueued {
            close(reason: "peer is not reading (\(outbound.count) bytes queued)")
            return
        }
        drain()
    }

    /// Closes once everything queued has been written (or at once on error).
    func close(reason: String? = nil) {
        guard !isClosed else { return }
        isClosed = true
        if let token { loop.unregister(token) }
        token = nil
        try? fd.close()  // close(2) errors after shutdown carry no information worth keeping
        onClose(reason)
    }

    private func handle(_ readiness: EventLoop.Readiness) {
        if readiness.contains(.writable) { drain() }
        if readiness.contains(.readable) || readiness.contains(.closed) { readAvailable() }
    }

    private func readAvailable() {
        while !isClosed {
            do {
                let count = try readBuffer.withUnsafeMutableBytes { try fd.read(into: $0) }
                if count == 0 {
                    close()
                    return
                }
                onData(readBuffer[0..<count])
                if count < readBuffer.count { return }
            } catch Errno.wouldBlock {
                return
            } catch {
                close(reason: "\(error)")
                return
            }
        }
    }

    private func drain() {
        while !outbound.isEmpty && !isClosed {
            do {
                let written = try outbound.withUnsafeBytes { try fd.write($0) }
                outbound.removeFirst(written)
            } catch Errno.wouldBlock {
                break
            } catch {
                close(reason: "\(error)")
                return
            }
        }
        if let token, !isClosed {
            loop.setInterest(token, outbound.isEmpty ? .readable : [.readable, .writable])
        }
    }
}
