#if canImport(Glibc)
import Glibc
#endif
import Logging
import SystemPackage

/// BLEControl frames over TCP: each connection is a session; ERROR replies
/// and other notifications go back on the same connection. Loopback by
/// default (board file), for the simulator, tests and LAN tools.
public final class TCPTransport: @unchecked Sendable {
    // Loop-confined: used only on the event loop thread (other threads hop
    // back with `loop.execute`), which makes the unchecked Sendable sound.
    private let loop: EventLoop
    private let hub: SessionHub
    private let logger: Logger
    private var listener: FileDescriptor?
    private var token: EventLoop.Token?
    private var connections: [ObjectIdentifier: (StreamConnection, Session)] = [:]
    /// The port actually bound (differs from the configured one when that is 0).
    public private(set) var port: UInt16?

    public init(loop: EventLoop, hub: SessionHub, logger: Logger) {
        self.loop = loop
        self.hub = hub
        self.logger = logger
    }

    /// Binds and starts accepting (on the loop thread).
    public func start(host: String, port: UInt16) throws {
        let fd = try Sockets.listenTCP(host: host, port: port)
        listener = fd
        self.port = Sockets.localPort(fd) ?? port
        token = loop.register(fd, interest: .readable) { [weak self] _ in self?.acceptPending() }
        logger.info("TCP transport listening on \(host):\(self.port ?? port)")
    }

    /// Stops accepting and closes every connection (their sessions end).
    public func stop() {
        if let token { loop.unregister(token) }
        token = nil
        try? listener?.close()
        listener = nil
        for (connection, _) in connections.values { connection.close() }
        connections.removeAll()
    }

    private func acceptPending() {
        guard let listener else { return }
        while true {
            let accepted: (FileDescriptor, String)?
            do {
                accepted = try Sockets.accept(listener)
            } catch {
                // EMFILE and friends: log and let the loop come back later.
                logger.warning("TCP accept failed: \(error)")
                return
            }
            guard let (fd, peer) = accepted else { return }
            let connection = StreamConnection(fd: fd, loop: loop)
            let session = hub.open(transport: "tcp", peer: peer) { [weak connection] bytes in connection?.send(bytes) }
            let key = ObjectIdentifier(connection)
            connections[key] = (connection, session)
            connection.onData = { [weak self, weak session] bytes in
                guard let self, let session else { return }
                self.hub.receive(bytes, for: session)
            }
            connection.onClose = { [weak self] reason in
                guard let self, let entry = self.connections.removeValue(forKey: key) else { return }
                if let reason { self.logger.notice("TCP \(peer) dropped: \(reason)") }
                self.hub.close(entry.1)
            }
            connection.start()
        }
    }
}
