import Foundation
import Logging
import SystemPackage

/// The Unix socket the `blecontrol` CLI talks to. Each connection is also a
/// session (transport "control"), so `blecontrol send` exercises exactly the
/// path a central's bytes take.
public final class ControlServer: @unchecked Sendable {
    // Loop-confined: used only on the event loop thread (other threads hop
    // back with `loop.execute`), which makes the unchecked Sendable sound.
    private let loop: EventLoop
    private let hub: SessionHub
    private let dispatcher: Dispatcher
    /// Gathers the status report (on the loop thread). Set by the owner
    /// right after init, because the report needs the fully built runtime.
    var statusProvider: (() -> StatusReport)?
    private let logger: Logger
    private var listener: FileDescriptor?
    private var token: EventLoop.Token?
    private var path: String?
    private var clients: [ObjectIdentifier: Client] = [:]
    /// A request line longer than this is refused and the connection closed.
    private let maxLine = 64 * 1024

    // Loop-confined like its server.
    private final class Client: @unchecked Sendable {
        let connection: StreamConnection
        var session: Session?
        var buffer: [UInt8] = []
        var replies: [UInt8] = []
        init(connection: StreamConnection) { self.connection = connection }
    }

    public init(loop: EventLoop, hub: SessionHub, dispatcher: Dispatcher, logger: Logger) {
        self.loop = loop
        self.hub = hub
        self.dispatcher = dispatcher
        self.logger = logger
    }

    public func start(path: String) throws {
        let directory = (path as NSString).deletingLastPathComponent
        if !directory.isEmpty {
            try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        }
        let fd = try Sockets.listenUnix(path: path)
        listener = fd
        self.path = path
        token = loop.register(fd, interest: .readable) { [weak self] _ in self?.acceptPending() }
        logger.info("control socket at \(path)")
    }

    public func stop() {
        if let token { loop.unregister(token) }
        token = nil
        try? listener?.close()
        listener = nil
        if let path { unlink(path) }
        for client in clients.values { client.connection.close() }
        clients.removeAll()
    }

    private func acceptPending() {
        guard let listener else { return }
        while let (fd, _) = (try? Sockets.accept(listener)) ?? nil {
            let client = Client(connection: StreamConnection(fd: fd, loop: loop))
            let key = ObjectIdentifier(client)
            clients[key] = client
            client.connection.onData = { [weak self, weak client] bytes in
                guard let self, let client else { return }
                self.received(bytes, from: client)
            }
            client.connection.onClose = { [weak self] _ in
                guard let self, let client = self.clients.removeValue(forKey: key) else { return }
                if let session = client.session { self.hub.close(session) }
            }
            client.connection.start()
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
            client.connection.close(reason: "request too long")
        }
    }

    private func handle(_ line: [UInt8], from client: Client) {
        let request: ControlProtocol.Request
        do {
            request = try ControlProtocol.decoder().decode(ControlProtocol.Request.self, from: Data(line))
        } catch {
            return respond(ControlProtocol.Response(ok: false, error: "not a control request: \(error.localizedDescription)"), to: client)
        }
        switch request.op {
        case "status":
            guard let statusProvider else {
                return respond(ControlProtocol.Response(ok: false, error: "status is not available yet"), to: client)
            }
            respond(ControlProtocol.Response(ok: true, status: statusProvider()), to: client)
        case "send":
            guard let hex = request.hex, let bytes = ControlProtocol.bytes(fromHex: hex) else {
                return respond(ControlProtocol.Response(ok: false, error: "send needs \"hex\": an even number of hex digits"), to: client)
            }
            let session = client.session ?? hub.open(transport: "control", peer: "cli") { [weak client] frame in
                client?.replies.append(contentsOf: frame)
            }
            client.session = session
            hub.receive(bytes, for: session)
            // Answer like a write with response: once the hardware has it.
            dispatcher.whenApplied { [weak self, weak client] error in
                guard let server = self, let client else { return }
                server.loop.execute {
                    let replies = ControlProtocol.hex(client.replies)
                    client.replies.removeAll()
                    server.respond(ControlProtocol.Response(ok: error == nil, error: error, replies: replies), to: client)
                }
            }
        default:
            respond(ControlProtocol.Response(ok: false, error: "unknown op \"\(request.op)\" (status, send)"), to: client)
        }
    }

    private func respond(_ response: ControlProtocol.Response, to client: Client) {
        do {
            var data = try ControlProtocol.encoder().encode(response)
            data.append(UInt8(ascii: "\n"))
            client.connection.send(Array(data))
        } catch {
            logger.error("cannot encode control response: \(error)")
        }
    }
}
