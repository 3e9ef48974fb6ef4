#if canImport(Glibc)
import Glibc
#endif
import Control
import Reactor
import SystemPackage

/// One control page connected through `blecontrol web`: its WebSocket on
/// one side, a connection to the daemon's control socket on the other,
/// opened as a central (transport `web`), so the page drives the board as a
/// phone would and its going away is a central leaving (the failsafe acts).
///
/// The page sends binary messages: protocol frames, as it would write them
/// to FFE1. Each is answered, in order, by the board's replies (a binary
/// message, if there are any) and then `{"applied":true}` or
/// `{"applied":false,"error":"…"}`. Whenever the outputs change (whoever
/// changed them) the page gets a ``WebBridgeState``. Requests to the daemon
/// go one at a time (its answers carry no id), at most
/// ``maximumWaiting`` writes queued: a page that floods is closed.
final class WebBridge {
    // Loop-confined, like the server that owns it.

    /// Where the page opens it.
    static let path = "/bridge"
    /// How often the daemon is asked for the state while a page is open.
    static let statusInterval: Duration = .milliseconds(400)
    /// Writes the page may have waiting for the daemon; the page's own
    /// writer has one in flight at a time.
    static let maximumWaiting = 16
    /// A page that does not answer a ping in this time is gone (its
    /// tab frozen or its network dropped without a FIN).
    static let pingInterval: Duration = .seconds(10)

    private enum Request {
        case central
        case frames([UInt8])
        case status
    }

    private let loop: EventLoop
    private let browser: StreamConnection
    private var daemon: StreamConnection?
    private let peer: String
    private var decoder = WebSocket.Decoder()
    private var waiting: [Request] = []
    private var inFlight: Request?
    private var daemonBuffer: [UInt8] = []
    private var lastState: WebBridgeState?
    private var statusTimer: LoopToken?
    private var pingTimer: LoopToken?
    private var ponged = true
    private var closed = false
    private let onClose: (WebBridge, String) -> Void

    /// Takes over `fd` (the browser's connection, its handshake read) and
    /// answers the handshake with `accept`.
    init(fd: FileDescriptor, peer: String, accept: String, loop: EventLoop, onClose: @escaping (WebBridge, String) -> Void) {
        self.loop = loop
        self.peer = peer
        self.onClose = onClose
        browser = StreamConnection(fd: fd, loop: loop, maxQueued: 256 * 1024)
        browser.send(Array(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Accept: \(accept)\r\n\r\n").utf8))
    }

    /// Connects to the daemon (the socket checked as every client checks
    /// it) and starts; a daemon that cannot be reached closes the page's
    /// socket with the reason.
    func start(socketPath: String) {
        browser.onData = { [weak self] bytes in self?.fromBrowser(bytes) }
        browser.onClose = { [weak self] reason in self?.close(reason ?? "the page closed the connection") }
        do {
            try browser.start()
        } catch {
            return close("cannot watch the page's connection: \(error)")
        }
        _ = Sockets.setLiveness(browser.fd)
        let fd: FileDescriptor
        do {
            fd = try ControlClient.connectTrusted(path: socketPath)
        } catch {
            return close("no daemon: \(error)", code: 1011)
        }
        _ = fcntl(fd.rawValue, F_SETFL, fcntl(fd.rawValue, F_GETFL) | O_NONBLOCK)
        let daemon = StreamConnection(fd: fd, loop: loop)
        daemon.onData = { [weak self] bytes in self?.fromDaemon(bytes) }
        daemon.onClose = { [weak self] reason in self?.close("the daemon closed the connection" + (reason.map { ": \($0)" } ?? ""), code: 1011) }
        self.daemon = daemon
        do {
            try daemon.start()
        } catch {
            return close("cannot watch the daemon's connection: \(error)", code: 1011)
        }
        ask(.central)
        ask(.status)
        schedulePing()
    }

    /// Ends both connections (the daemon's first: the central leaves).
    func close(_ reason: String, code: UInt16 = 1000) {
        guard !closed else { return }
        closed = true
        if let statusTimer { loop.cancel(statusTimer) }
        if let pingTimer { loop.cancel(pingTimer) }
        statusTimer = nil
        pingTimer = nil
        daemon?.close()
        daemon = nil
        browser.send(WebSocket.closeFrame(code))
        browser.finish()
        onClose(self, reason)
    }

    // MARK: the page

    private func fromBrowser(_ bytes: ArraySlice<UInt8>) {
        let events: [WebSocket.Event]
        switch decoder.feed(bytes) {
        case .success(let decoded): events = decoded
        case .failure(let violation): return close("the page broke the WebSocket protocol: \(violation)", code: violation.code)
        }
        for event in events where !closed {
            switch event {
            case .binary(let frames):
                guard waiting.count < Self.maximumWaiting else {
                    return close("the page sent more than \(Self.maximumWaiting) writes without waiting for their answers", code: 1008)
                }
                if !frames.isEmpty { ask(.frames(frames)) }
            case .text:
                return close("the page sent text: the bridge takes protocol frames as binary messages", code: 1003)
            case .ping(let payload):
                browser.send(WebSocket.frame(.pong, payload))
            case .pong:
                ponged = true
            case .close:
                return close("the page closed")
            }
        }
    }

    private func sendText(_ value: JSONValue) {
        browser.send(WebSocket.frame(.text, value.serialized()))
    }

    /// Pings the page every ``pingInterval``; one unanswered ping closes it.
    private func schedulePing() {
        pingTimer = loop.schedule(after: Self.pingInterval, leeway: .seconds(1)) { [weak self] in
            guard let self, !self.closed else { return }
            guard self.ponged else { return self.close("the page did not answer a ping in \(Self.pingInterval.components.seconds) s", code: 1001) }
            self.ponged = false
            self.browser.send(WebSocket.frame(.ping, []))
            self.schedulePing()
        }
    }

    // MARK: the daemon

    private func ask(_ request: Request) {
        waiting.append(request)
        sendNext()
    }

    private func sendNext() {
        guard inFlight == nil, !waiting.isEmpty, let daemon, !closed else { return }
        let request = waiting.removeFirst()
        inFlight = request
        let line: ControlProtocol.Request
        switch request {
        case .central: line = ControlProtocol.Request(op: .central, peer: peer)
        case .frames(let bytes): line = ControlProtocol.Request(op: .send, hex: ControlProtocol.hex(bytes))
        case .status: line = ControlProtocol.Request(op: .status)
        }
        guard let bytes = try? ControlProtocol.line(line) else { return close("cannot encode a request", code: 1011) }
        daemon.send(bytes)
    }

    private func fromDaemon(_ bytes: ArraySlice<UInt8>) {
        daemonBuffer.append(contentsOf: bytes)
        while let newline = daemonBuffer.firstIndex(of: UInt8(ascii: "\n")), !closed {
            let line = Array(daemonBuffer[..<newline])
            daemonBuffer.removeSubrange(...newline)
            guard let request = inFlight, let response = try? JSONDecoderLite().decode(ControlProtocol.Response.self, from: line) else {
                return close("the daemon answered what was not asked", code: 1011)
            }
            inFlight = nil
            answered(request, response)
            sendNext()
        }
        if daemonBuffer.count > ControlClient.maximumReply { close("the daemon's answer is too long", code: 1011) }
    }

    private func answered(_ request: Request, _ response: ControlProtocol.Response) {
        switch request {
        case .central:
            guard response.ok else { return close("the daemon refused the page as a central: \(response.error ?? "no reason")", code: 1011) }
        case .frames:
            if let hex = response.replies, let replies = ControlProtocol.bytes(fromHex: hex), !replies.isEmpty {
                browser.send(WebSocket.frame(.binary, replies))
            }
            var answer: [(String, JSONValue)] = [("applied", .bool(response.ok))]
            if let error = response.error { answer.append(("error", .string(error))) }
            sendText(.object(answer))
            // What the write changed, at once rather than at the next poll.
            pollSoon(after: .zero)
        case .status:
            if let status = response.status {
                let state = WebBridgeState(status)
                if state != lastState {
                    lastState = state
                    browser.send(WebSocket.frame(.text, state.message))
                }
            }
            pollSoon(after: Self.statusInterval)
        }
    }

    /// Asks for the state after `delay`, unless a request for it is already
    /// waiting or due sooner.
    private func pollSoon(after delay: Duration) {
        if waiting.contains(where: { if case .status = $0 { return true } else { return false } }) { return }
        if case .status? = inFlight { return }
        if delay == .zero {
            if let statusTimer { loop.cancel(statusTimer) }
            statusTimer = nil
            return ask(.status)
        }
        guard statusTimer == nil else { return }
        statusTimer = loop.schedule(after: delay, leeway: .milliseconds(50)) { [weak self] in
            self?.statusTimer = nil
            self?.ask(.status)
        }
    }
}
