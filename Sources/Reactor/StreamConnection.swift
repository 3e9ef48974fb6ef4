#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import SystemPackage

/// A non-blocking byte stream (socket, pseudo-terminal, serial line) on an
/// ``EventLoop``: reads hand bytes to `onData`, writes are queued and drained
/// as the descriptor accepts them.
///
/// Fairness: each readiness event reads at most `readBudget` bytes, then
/// returns to the loop; the registration is level-triggered, so a peer that
/// sent more is served again next round, after every other ready peer. A
/// flood from one central therefore costs the others at most one budget's
/// worth of decoding per round.
///
/// A peer that stops reading while output piles up past `maxQueued` is
/// dropped rather than allowed to grow our memory.
public final class StreamConnection: @unchecked Sendable {
    // Loop-confined: every method is for the loop's thread (checked).
    public let fd: FileDescriptor
    private let loop: EventLoop
    private var token: LoopToken?
    private var outbound: [UInt8] = []
    /// Bytes of `outbound` already written (compacted when it passes half).
    private var written = 0
    private let maxQueued: Int
    private var readBuffer: [UInt8]
    /// Set by ``finish(reason:)``: no more reads; close once drained.
    private var finishing: String??
    /// True while `onData` runs: what it sends is written once it returns,
    /// in one write, not one write per reply (a flood of bad frames would
    /// otherwise cost a system call per ERROR).
    private var delivering = false
    public var onData: (ArraySlice<UInt8>) -> Void = { _ in }
    /// Called once, when the connection closes (nil reason: the peer closed).
    public var onClose: (String?) -> Void = { _ in }
    public private(set) var isClosed = false

    /// - Parameters:
    ///   - readBudget: the most bytes read per loop round.
    ///   - maxQueued: the most unsent bytes kept before the peer is dropped.
    public init(fd: FileDescriptor, loop: EventLoop, readBudget: Int = 4096, maxQueued: Int = 1 << 20) {
        self.fd = fd
        self.loop = loop
        self.maxQueued = maxQueued
        readBuffer = [UInt8](repeating: 0, count: max(1, readBudget))
    }

    /// Starts reading (on the loop).
    public func start() throws {
        token = try loop.register(fd.rawValue, interest: .readable) { [weak self] readiness in self?.handle(readiness) }
    }

    /// Bytes still queued for the peer.
    public var queuedBytes: Int { outbound.count - written }

    /// Queues bytes for the peer.
    public func send<C: Collection>(_ bytes: C) where C.Element == UInt8 {
        loop.assertInLoop()
        guard !isClosed else { return }
        outbound.append(contentsOf: bytes)
        if queuedBytes > maxQueued {
            close(reason: "peer is not reading (\(queuedBytes) bytes queued)")
            return
        }
        if !delivering { drain() }
    }

    /// Stops reading and closes once everything queued has been written
    /// (a reply sent just before is not lost), or at once if nothing is.
    public func finish(reason: String? = nil) {
        loop.assertInLoop()
        guard !isClosed, finishing == nil else { return }
        finishing = .some(reason)
        if queuedBytes == 0 { return close(reason: reason) }
        if let token { loop.setInterest(token, .writable) }
    }

    /// Closes at once, dropping anything unsent.
    public func close(reason: String? = nil) {
        loop.assertInLoop()
        guard !isClosed else { return }
        isClosed = true
        if let token { loop.unregister(token) }
        token = nil
        try? fd.close()  // close(2) errors after a shutdown carry nothing worth keeping
        outbound = []
        onClose(reason)
    }

    private func handle(_ readiness: EventLoop.Readiness) {
        if readiness.contains(.writable) { drain() }
        if isClosed { return }
        if finishing != nil {
            if readiness.contains(.closed) { close(reason: finishing ?? nil) }
            return
        }
        if readiness.contains(.readable) || readiness.contains(.closed) { readOnce() }
    }

    private func readOnce() {
        do {
            let count = try readBuffer.withUnsafeMutableBytes { try fd.read(into: $0) }
            if count == 0 { return close() }
            delivering = true
            onData(readBuffer[0..<count])
            delivering = false
            if queuedBytes > 0, !isClosed { drain() }
        } catch Errno.wouldBlock {
            return
        } catch Errno.interrupted {
            return  // level-triggered: the next round reads again
        } catch {
            close(reason: "\(error)")
        }
    }

    private func drain() {
        while queuedBytes > 0 && !isClosed {
            do {
                let count = try outbound.withUnsafeBytes { raw in
                    try fd.write(UnsafeRawBufferPointer(rebasing: raw[written...]))
                }
                written += count
            } catch Errno.wouldBlock {
                break
            } catch Errno.interrupted {
                continue
            } catch {
                close(reason: "\(error)")
                return
            }
        }
        if queuedBytes == 0 {
            outbound.removeAll(keepingCapacity: outbound.capacity <= 65536)
            written = 0
            if let reason = finishing { return close(reason: reason) }
        } else if written > outbound.count / 2 {
            outbound.removeFirst(written)
            written = 0
        }
        if let token, !isClosed {
            let reading: EventLoop.Interest = finishing == nil ? .readable : .none
            loop.setInterest(token, queuedBytes == 0 ? reading : reading.union(.writable))
        }
    }
}

/// The slots of a listener that silent connections may hold: the ones
/// that have not yet said anything (no frame, no request) never take the
/// last `reserved` of `capacity`, so they cannot lock out a client that
/// talks. When a new connection comes and they already hold their share,
/// the oldest of them makes way.
public enum ReservedSlots {
    /// The waiting connection to close so one more may wait beside the
    /// others (the oldest), or nil while they hold fewer than
    /// `capacity - reserved` (at least one) slots.
    public static func evictee<C: Collection>(waiting: C, capacity: Int, reserved: Int,
                                              acceptedAt: (C.Element) -> ContinuousClock.Instant) -> C.Element? {
        guard waiting.count >= max(1, capacity - reserved) else { return nil }
        return waiting.min { acceptedAt($0) < acceptedAt($1) }
    }
}

/// Accepts connections on a listening socket, fairly and safely:
/// - at most `acceptsPerRound` per loop round, so a connection storm does
///   not starve the peers already connected;
/// - when the process runs out of descriptors (EMFILE/ENFILE), accepting
///   pauses with a growing back-off instead of spinning on a listener that
///   stays readable, and the episode is logged once, not once per try;
/// - beyond `maxConnections` open at once, new connections are accepted and
///   closed at once (counted in ``refused``), so a flood cannot take the
///   descriptors the daemon needs for its devices.
public final class Listener: @unchecked Sendable {
    // Loop-confined.
    public struct Statistics: Sendable, Equatable {
        public var accepted = 0
        /// Connections closed at once because `maxConnections` were open.
        public var refused = 0
        /// Episodes of running out of descriptors.
        public var descriptorShortages = 0
        public init() {}
    }

    private let loop: EventLoop
    public let fd: FileDescriptor
    private var token: LoopToken?
    private var backoff: Duration?
    private var resumeTimer: LoopToken?
    public var maxConnections: Int
    public let acceptsPerRound: Int
    /// Connections open now, as the owner counts them (it reports closes).
    public var openConnections = 0
    public private(set) var statistics = Statistics()
    /// A new connection (the owner wraps it and counts it open).
    public var onAccept: (FileDescriptor, String) -> Void = { fd, _ in try? fd.close() }
    /// Something worth one log line: a shortage starting or ending.
    public var onEvent: (String) -> Void = { _ in }

    public init(fd: FileDescriptor, loop: EventLoop, maxConnections: Int, acceptsPerRound: Int = 32) {
        self.fd = fd
        self.loop = loop
        self.maxConnections = maxConnections
        self.acceptsPerRound = acceptsPerRound
    }

    public func start() throws {
        token = try loop.register(fd.rawValue, interest: .readable) { [weak self] _ in self?.acceptRound() }
    }

    /// A started listener on `fd` (closed if it cannot start), reporting
    /// accepted connections and events to the owner (call on the loop).
    public static func start(fd: FileDescriptor, loop: EventLoop, maxConnections: Int,
                             onAccept: @escaping (FileDescriptor, String) -> Void, onEvent: @escaping (String) -> Void) throws -> Listener {
        let listener = Listener(fd: fd, loop: loop, maxConnections: maxConnections)
        listener.onAccept = onAccept
        listener.onEvent = onEvent
        do {
            try listener.start()
        } catch {
            try? fd.close()
            throw error
        }
        return listener
    }

    /// Stops accepting and closes the listening socket.
    public func stop() {
        if let token { loop.unregister(token) }
        if let resumeTimer { loop.cancel(resumeTimer) }
        token = nil
        resumeTimer = nil
        try? fd.close()
    }

    private func acceptRound() {
        for _ in 0..<acceptsPerRound {
            let accepted: Sockets.Accepted
            do {
                accepted = try Sockets.accept(fd)
            } catch {
                onEvent("accept failed: \(error)")
                return pause()
            }
            switch accepted {
            case .none:
                return
            case .outOfDescriptors(let error):
                if backoff == nil {
                    statistics.descriptorShortages += 1
                    onEvent("accept: \(error); pausing new connections until descriptors free up")
                }
                return pause()
            case .connection(let connection, let peer):
                if backoff != nil {
                    backoff = nil
                    onEvent("accepting connections again")
                }
                if openConnections >= maxConnections {
                    statistics.refused += 1
                    try? connection.close()
                    continue
                }
                statistics.accepted += 1
                onAccept(connection, peer)
            }
        }
    }

    /// Stops watching the listener for a while: 10 ms, doubling to 1 s.
    private func pause() {
        guard let token else { return }
        let delay = min((backoff ?? .milliseconds(5)) * 2, .seconds(1))
        backoff = delay
        loop.setInterest(token, .none)
        resumeTimer = loop.schedule(after: delay) { [weak self] in
            guard let self, let token = self.token else { return }
            self.resumeTimer = nil
            self.loop.setInterest(token, .readable)
        }
    }
}
