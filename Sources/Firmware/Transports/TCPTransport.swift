import Logging
import Reactor
import SystemPackage

/// BLEControl frames over TCP: each connection is a session; ERROR replies
/// and other notifications go back on the same connection. Loopback by
/// default (board file), for the simulator, tests and LAN tools.
public final class TCPTransport: @unchecked Sendable {
    // Loop-confined: used only on the event loop (other threads hop with
    // `loop.execute`), checked by the loop.
    private let loop: EventLoop
    private let hub: SessionHub
    private let logger: Logger
    private let maxConnections: Int
    private var listener: Listener?
    private var connections: [ObjectIdentifier: (StreamConnection, Session)] = [:]
    /// The port actually bound (differs from the configured one when that is 0).
    public private(set) var port: UInt16?

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
        for (connection, _) in connections.values { connection.close() }
        connections.removeAll()
    }

    private func accepted(_ fd: FileDescriptor, peer: String) {
        let connection = StreamConnection(fd: fd, loop: loop)
        let session = hub.open(transport: .tcp, peer: peer) { [weak connection] bytes in connection?.send(bytes) }
        let key = ObjectIdentifier(connection)
        connections[key] = (connection, session)
        listener?.openConnections = connections.count
        connection.onData = { [weak self, weak session] bytes in
            guard let self, let session else { return }
            self.hub.receive(bytes, for: session)
        }
        connection.onClose = { [weak self] reason in
            guard let self, let entry = self.connections.removeValue(forKey: key) else { return }
            self.listener?.openConnections = self.connections.count
            if let reason { self.logger.notice("TCP \(peer) dropped: \(reason)") }
            self.hub.close(entry.1)
        }
        do {
            try connection.start()
        } catch {
            logger.warning("TCP \(peer): \(error)")
            connection.close()
        }
    }
}
