#if canImport(Glibc)
import Glibc
#endif
import BLEControlProtocol
import Board
import Control
import Firmware
import Logging
import Reactor
import SystemPackage

/// The Unix socket the `blecontrol` CLI talks to. Each connection that
/// sends frames is also a session (transport `control`), so `blecontrol
/// send` exercises exactly the path a central's bytes take.
public final class ControlServer: @unchecked Sendable {
    // Loop-confined: used only on the event loop (checked by the loop).
    private let loop: EventLoop
    private let hub: SessionHub
    private let dispatcher: Dispatcher
    /// Gathers the status report and the poll snapshot (on the loop). Set by
    /// the owner right after init, because they need the whole runtime.
    var statusProvider: (() -> StatusReport)?
    var pollProvider: (() -> PollReport)?
    /// The pairing passkey on display, if any: hidden from callers that are
    /// not trusted (``Client/trusted``).
    var secretProvider: (() -> String?)?
    /// Ends the failsafe on an operator's word (who, for the log); the
    /// reason it had, nil when none held.
    var failsafeClearer: ((String) -> String?)?
    /// The board's channels as they are now (`pulse` reads their calibration).
    var channelsProvider: (() -> [ChannelConfiguration])?
    /// Forgets the BLE bonds and completes (on any thread) with the
    /// addresses forgotten; nil when the board has no BLE.
    var bondsForgetter: ((@escaping @Sendable (Result<[String], any Error>) -> Void) -> Void)?
    private let logger: Logger
    private var listener: Listener?
    private var path: String?
    private var clients: [ObjectIdentifier: Client] = [:]
    /// A request line longer than this is refused and the connection closed.
    private let maxLine = 64 * 1024

    // Loop-confined like its server.
    private final class Client: @unchecked Sendable {
        let connection: StreamConnection
        /// Root, or the daemon's own user (who could read its memory
        /// anyway): may see a pairing passkey and forget bonds. Anyone else
        /// the socket lets in (group blecontrol) drives the outputs and
        /// reads the status without the passkey. From SO_PEERCRED, which
        /// the caller cannot choose.
        let trusted: Bool
        /// The caller's uid (SO_PEERCRED), for the log.
        let uid: uid_t?
        var session: Session?
        var buffer: [UInt8] = []
        var replies: [UInt8] = []
        let acceptedAt: ContinuousClock.Instant
        /// Closes it if no request came by ``ControlServer/requestDeadline``;
        /// nil once one did.
        var deadline: LoopToken?
        init(connection: StreamConnection, trusted: Bool, uid: uid_t?, acceptedAt: ContinuousClock.Instant) {
            self.connection = connection
            self.trusted = trusted
            self.uid = uid
            self.acceptedAt = acceptedAt
        }
    }

    /// How long a connection may stay without sending a whole request:
    /// `blecontrol` sends its first at once.
    public static let requestDeadline = Duration.seconds(10)
    private static let maxConnections = 64
    /// Slots only a connection that has sent a request can hold: silent
    /// connections never fill the socket (the oldest makes way).
    private static let reservedForRequests = 8

    public init(loop: EventLoop, hub: SessionHub, dispatcher: Dispatcher, logger: Logger) {
        self.loop = loop
        self.hub = hub
        self.dispatcher = dispatcher
        self.logger = logger
    }

    public func start(path: String) throws {
        let directory = Files.directory(of: path)
        if !directory.isEmpty { Files.makeDirectories(directory) }
        let fd = try Sockets.listenUnix(path: path)
        listener = try Listener.start(fd: fd, loop: loop, maxConnections: Self.maxConnections,
                                      onAccept: { [weak self] fd, _ in self?.accepted(fd) },
                                      onEvent: { [logger] event in logger.warning("control socket: \(event)") })
        self.path = path
        logger.info("control socket at \(path)")
    }

    public func stop() {
        listener?.stop()
        listener = nil
        if let path { unlink(path) }
        path = nil
        for client in clients.values { client.connection.close() }
        clients.removeAll()
    }

    private func accepted(_ fd: FileDescriptor) {
        let uid = Sockets.peerUID(fd)
        let client = Client(connection: StreamConnection(fd: fd, loop: loop), trusted: uid == 0 || uid == getuid(), uid: uid, acceptedAt: loop.now)
        let key = ObjectIdentifier(client)
        let silent = clients.values.filter { $0.deadline != nil }
        if let oldest = ReservedSlots.evictee(waiting: silent, capacity: Self.maxConnections, reserved: Self.reservedForRequests, acceptedAt: \.acceptedAt) {
            oldest.connection.close(reason: "no request; making way for a new connection")
        }
        client.deadline = loop.schedule(after: Self.requestDeadline) { [weak client] in
            guard let client, client.deadline != nil else { return }
            client.deadline = nil
            client.connection.close(reason: "no request in \(Int(Self.requestDeadline.inSeconds)) s")
        }
        clients[key] = client
        listener?.openConnections = clients.count
        client.connection.onData = { [weak self, weak client] bytes in
            guard let self, let client else { return }
            self.received(bytes, from: client)
        }
        client.connection.onClose = { [weak self] _ in
            guard let self, let client = self.clients.removeValue(forKey: key) else { return }
            if let deadline = client.deadline { self.loop.cancel(deadline) }
            client.deadline = nil
            self.listener?.openConnections = self.clients.count
            if let session = client.session { self.hub.close(session) }
        }
        do {
            try client.connection.start()
        } catch {
            client.connection.close()
        }
    }

    private func received(_ bytes: ArraySlice<UInt8>, from client: Client) {
        client.buffer.append(contentsOf: bytes)
        while let newline = client.buffer.firstIndex(of: UInt8(ascii: "\n")) {
            let line = Array(client.buffer[..<newline])
            client.buffer.removeSubrange(...newline)
            handle(line, from: client)
        }
        if client.buffer.count > maxLine {
            respond(ControlProtocol.Response(ok: false, error: "request longer than \(maxLine) bytes"), to: client)
            // The error reply goes out before the connection closes.
            client.connection.finish(reason: "request too long")
        }
    }

    private func handle(_ line: [UInt8], from client: Client) {
        if let deadline = client.deadline {
            loop.cancel(deadline)
            client.deadline = nil
        }
        let request: ControlProtocol.Request
        do {
            request = try ControlProtocol.request(from: line)
        } catch {
            return respond(ControlProtocol.Response(ok: false, error: "\(error)"), to: client)
        }
        if let over = request.overMs, !(1...600_000).contains(over) {
            return respond(ControlProtocol.Response(ok: false, error: "over_ms must be 1…600000 (a move's time in ms), got \(over)"), to: client)
        }
        let over = request.overMs.map { Duration.milliseconds($0) }
        switch request.op {
        case .status:
            guard let statusProvider else {
                return respond(ControlProtocol.Response(ok: false, error: "status is not available yet"), to: client)
            }
            let status = statusProvider()
            respond(ControlProtocol.Response(ok: true, status: client.trusted ? status : status.hiding(secretProvider?())), to: client)
        case .poll:
            guard let pollProvider else {
                return respond(ControlProtocol.Response(ok: false, error: "poll is not available yet"), to: client)
            }
            respond(ControlProtocol.Response(ok: true, poll: pollProvider()), to: client)
        case .clearFailsafe:
            // The operator at the board: root, or the daemon's own user (the
            // simulator's owner). Group blecontrol drives outputs, but ending
            // a failsafe is a decision about safety, not a command.
            guard client.trusted else {
                return respond(ControlProtocol.Response(ok: false, error: "only root or the daemon's own user may end a failsafe: sudo blecontrol failsafe clear"), to: client)
            }
            guard let failsafeClearer else {
                return respond(ControlProtocol.Response(ok: false, error: "this board has no servo path: no failsafe"), to: client)
            }
            let who = client.uid.map { "\(UserRuntime.userName($0)) through the control socket" } ?? "the control socket"
            respond(ControlProtocol.Response(ok: true, cleared: failsafeClearer(who)), to: client)
        case .forgetBonds:
            // Every bond of the adapter goes (the phones of other programs
            // too): root's decision, not any member of group blecontrol's.
            guard client.trusted else {
                return respond(ControlProtocol.Response(ok: false, error: "forget-bonds removes every bond of the adapter: run it as root (sudo blecontrol forget-bonds)"), to: client)
            }
            guard let bondsForgetter else {
                return respond(ControlProtocol.Response(ok: false, error: "BLE is not enabled on this board: no bonds to forget"), to: client)
            }
            bondsForgetter { [weak self, weak client] result in
                guard let server = self, let client else { return }
                server.loop.execute {
                    switch result {
                    case .success(let forgotten): server.respond(ControlProtocol.Response(ok: true, forgotten: forgotten), to: client)
                    case .failure(let failure): server.respond(ControlProtocol.Response(ok: false, error: "\(failure)"), to: client)
                    }
                }
            }
        case .central:
            // Named by the bridge, shown in status and the log: printable
            // and short, whatever a browser's address looks like.
            guard let peer = request.peer, !peer.isEmpty, peer.count <= ControlProtocol.maximumPeerLength,
                  peer.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7F }) else {
                return respond(ControlProtocol.Response(ok: false, error: "central needs \"peer\": 1…\(ControlProtocol.maximumPeerLength) printable ASCII characters"), to: client)
            }
            guard client.session == nil else {
                return respond(ControlProtocol.Response(ok: false, error: "central must be this connection's first frames' request: it has sent frames already"), to: client)
            }
            _ = session(of: client, transport: .web, peer: peer)
            respond(ControlProtocol.Response(ok: true), to: client)
        case .send:
            guard let hex = request.hex, let bytes = ControlProtocol.bytes(fromHex: hex) else {
                return respond(ControlProtocol.Response(ok: false, error: "send needs \"hex\": an even number of hex digits"), to: client)
            }
            apply(bytes, from: client, over: over)
        case .pulse:
            guard let channel = request.channel, let microseconds = request.us, microseconds.isFinite, (0...255).contains(channel) else {
                return respond(ControlProtocol.Response(ok: false, error: "pulse needs \"channel\" (0…255) and \"us\" (a pulse width in µs)"), to: client)
            }
            switch PulseRequest.servoValue(microseconds, channel: channel, of: channelsProvider?() ?? [], clamp: false) {
            case .success(let value):
                apply(FrameEncoder.encode(.servo(channel: UInt8(channel), value: value)), from: client, over: over)
            case .failure(let refusal):
                respond(ControlProtocol.Response(ok: false, error: "\(refusal)"), to: client)
            }
        }
    }

    /// Frames from `client`, as its central's session would send them; the
    /// reply once the hardware has them, as a write with response.
    /// `over`: the values among them move there in that time, together.
    private func apply(_ bytes: [UInt8], from client: Client, over: Duration? = nil) {
        let session = session(of: client, transport: .control, peer: "cli")
        let mark = dispatcher.mark
        // The frames are dispatched within this call, on this loop.
        session.moveDuration = over
        hub.receive(bytes, for: session)
        session.moveDuration = nil
        dispatcher.whenApplied(since: mark) { [weak self, weak client] error in
            guard let server = self, let client else { return }
            server.loop.execute {
                let replies = ControlProtocol.hex(client.replies)
                client.replies.removeAll()
                server.respond(ControlProtocol.Response(ok: error == nil, error: error, replies: replies), to: client)
            }
        }
    }

    /// The client's session, opened as `transport` if it has none yet; the
    /// board's replies gather until its request is answered.
    private func session(of client: Client, transport: TransportKind, peer: String) -> Session {
        if let session = client.session { return session }
        let session = hub.open(transport: transport, peer: peer) { [weak client] frame in
            client?.replies.append(contentsOf: frame)
        }
        client.session = session
        return session
    }

    private func respond(_ response: ControlProtocol.Response, to client: Client) {
        do {
            client.connection.send(try ControlProtocol.line(response))
        } catch {
            logger.error("cannot encode control response: \(error)")
        }
    }
}
