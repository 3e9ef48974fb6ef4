import BLEControlProtocol
import Control
import Firmware
import Logging
import Reactor
import SystemPackage

/// BLEControl frames over TCP: each connection is a session; ERROR replies
/// and other notifications go back on the same connection. Loopback by
/// default (board file), for the simulator, tests and LAN tools.
///
/// A connection becomes a session only once its first two bytes are the
/// head of a frame a central sends: a command 0…6 and a length valid for
/// it. Anything else is closed before a byte of it is decoded. That keeps
/// out every client that is not speaking BLEControl, and above all a web
/// page: a browser opens a connection only to send its own first bytes (an
/// HTTP request line, whose method is letters; TLS's handshake record,
/// 0x16; WebSocket's GET), so a page can never make a connection whose
/// first byte is 0…6, whatever path, headers or body it chooses.
public final class TCPTransport: @unchecked Sendable {
    // Loop-confined: used only on the event loop (other threads hop with
    // `loop.execute`), checked by the loop.
    private let loop: EventLoop
    private let hub: SessionHub
    private let logger: Logger
    private let maxConnections: Int
    private var listener: Listener?
    private var connections: [ObjectIdentifier: Peer] = [:]
    /// One line per 10 s for refused connections (a peer can make them at will).
    private let rejections = LogLimiter(burst: 1, window: .seconds(10))
    /// The most reply bytes kept for a peer that does not read them before
    /// it is dropped. A central's replies are 3-byte ERRORs, and the kernel's
    /// socket buffer (up to 4 MiB) takes them first: this is only what a
    /// peer that sends bad frames and never reads makes the board keep, once
    /// for each of its `maxConnections`.
    static let maxQueuedReplies = 64 << 10
    /// The port actually bound (differs from the configured one when that is 0).
    public private(set) var port: UInt16?
    /// How long a connection may stay without sending a frame's head
    /// before it is closed: a real central sends its first frame at once.
    public static let headDeadline = Duration.seconds(5)
    /// Slots only a connection that has shown a frame's head can hold:
    /// connections that have not yet are at most `maxConnections` less
    /// these, and the oldest of them makes way for a new one.
    static let reservedForCentrals = 8
    /// Connections closed for sending no frame's head in time, or evicted
    /// for a newer one while none had.
    public private(set) var silentConnectionsClosed = 0

    private struct Peer {
        let connection: StreamConnection
        let address: String
        let acceptedAt: ContinuousClock.Instant
        /// Nil until the first two bytes have shown a central.
        var session: Session?
        /// The first byte, while the second has not come.
        var head: [UInt8] = []
        /// Closes it if no frame's head came by ``headDeadline``.
        var deadline: LoopToken?
    }

    /// - Parameter maxConnections: connections open at once; more are
    ///   accepted and closed at once (counted), so a flood of clients cannot
    ///   take the descriptors the board's devices need.
    public init(loop: EventLoop, hub: SessionHub, maxConnections: Int, logger: Logger) {
        self.loop = loop
        self.hub = hub
        self.maxConnections = maxConnections
        self.logger = logger
    }

    /// Connections refused because `maxConnections` were open, and episodes
    /// of running out of descriptors.
    public var statistics: Listener.Statistics { listener?.statistics ?? Listener.Statistics() }

    /// Connections closed because their first bytes were not a frame.
    public private(set) var rejectedConnections = 0

    /// Binds and starts accepting (on the loop).
    public func start(host: String, port: UInt16) throws {
        let fd = try Sockets.listenTCP(host: host, port: port)
        listener = try Listener.start(fd: fd, loop: loop, maxConnections: maxConnections,
                                      onAccept: { [weak self] fd, peer in self?.accepted(fd, peer: peer) },
                                      onEvent: { [logger] event in logger.warning("TCP: \(event)") })
        self.port = Sockets.localPort(fd) ?? port
        logger.info("TCP transport listening on \(host):\(self.port ?? port)")
    }

    /// Stops accepting and closes every connection (their sessions end).
    public func stop() {
        listener?.stop()
        listener = nil
        for peer in connections.values { peer.connection.close() }
        connections.removeAll()
    }

    /// Whether a stream whose first two bytes are `code` and `length` is a
    /// central's: a command a central sends, with a length valid for it.
    static func startsFrame(code: UInt8, length: UInt8) -> Bool {
        guard let command = Command(rawValue: code), command != .error else { return false }
        return command.validLengths.contains(length)
    }

    private func accepted(_ fd: FileDescriptor, peer address: String) {
        // A LAN central whose link dies without a word is seen to leave
        // (and its failsafe taken) within Liveness.deadPeerSeconds.
        Sockets.setLiveness(fd)
        let connection = StreamConnection(fd: fd, loop: loop, maxQueued: Self.maxQueuedReplies)
        let key = ObjectIdentifier(connection)
        makeRoomForOneMoreWithoutHead()
        let deadline = loop.schedule(after: Self.headDeadline) { [weak self] in self?.closeIfNoHead(key) }
        connections[key] = Peer(connection: connection, address: address, acceptedAt: loop.now, deadline: deadline)
        listener?.openConnections = connections.count
        connection.onData = { [weak self] bytes in self?.received(bytes, from: key) }
        connection.onClose = { [weak self] reason in
            guard let self, let peer = self.connections.removeValue(forKey: key) else { return }
            if let deadline = peer.deadline { self.loop.cancel(deadline) }
            self.listener?.openConnections = self.connections.count
            if let reason { self.logger.notice("TCP \(address) dropped: \(reason)") }
            if let session = peer.session { self.hub.close(session) }
        }
        do {
            try connection.start()
        } catch {
            logger.warning("TCP \(address): \(error)")
            connection.close()
        }
    }

    private func received(_ bytes: ArraySlice<UInt8>, from key: ObjectIdentifier) {
        guard var peer = connections[key] else { return }
        if let session = peer.session { return hub.receive(bytes, for: session) }
        // The first bytes, a few more than the two that decide, for the log.
        let start = peer.head + bytes.prefix(8 - peer.head.count)
        guard start.count >= 2 else {
            peer.head = start
            connections[key] = peer
            return
        }
        guard Self.startsFrame(code: start[0], length: start[1]) else { return reject(peer, start: start) }
        if let deadline = peer.deadline { loop.cancel(deadline) }
        peer.deadline = nil
        let session = hub.open(transport: .tcp, peer: peer.address) { [weak connection = peer.connection] bytes in connection?.send(bytes) }
        peer.session = session
        let held = peer.head
        peer.head = []
        connections[key] = peer
        hub.receive(held + bytes, for: session)
    }

    /// Connections that have not shown a frame's head may not fill the
    /// slots kept for centrals: the oldest of them goes for the new one.
    private func makeRoomForOneMoreWithoutHead() {
        let waiting = connections.values.filter { $0.session == nil }
        guard let oldest = ReservedSlots.evictee(waiting: waiting, capacity: maxConnections, reserved: Self.reservedForCentrals, acceptedAt: \.acceptedAt) else { return }
        closeSilent(oldest, why: "evicted: \(waiting.count) connections without a frame")
    }

    private func closeIfNoHead(_ key: ObjectIdentifier) {
        guard var peer = connections[key], peer.session == nil else { return }
        peer.deadline = nil
        connections[key] = peer
        closeSilent(peer, why: "no frame in \(Int(Self.headDeadline.inSeconds)) s")
    }

    private func closeSilent(_ peer: Peer, why: String) {
        silentConnectionsClosed += 1
        if case .log(let heldBack) = rejections.admit("", at: loop.now) {
            logger.notice("TCP \(peer.address): \(why); closed\(LogLimiter.more(heldBack))")
        }
        peer.connection.close()
    }

    private func reject(_ peer: Peer, start: [UInt8]) {
        rejectedConnections += 1
        if case .log(let heldBack) = rejections.admit("", at: loop.now) {
            logger.notice("TCP \(peer.address): not a BLEControl central (first bytes \(ControlProtocol.hex(start))); closed\(LogLimiter.more(heldBack))")
        }
        peer.connection.close()
    }
}
