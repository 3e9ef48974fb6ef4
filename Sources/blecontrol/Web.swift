#if canImport(Glibc)
import Glibc
#endif
import Arguments
import Control
import Reactor
import SystemPackage

/// `blecontrol web`: serves the control page (web/, compiled in by
/// scripts/embed-web) over HTTP, and bridges it to the daemon over a
/// WebSocket (``WebBridge``) for browsers without Web Bluetooth.
/// (A function, like `doctorCommand()`: a global `Command` would not be
/// Sendable.)
///
/// Deliberately small: GET and HEAD, one request per connection, nothing
/// read from the file system (so no path can reach outside the page),
/// requests bounded in size and time, on the project's event loop.
func webCommand() -> Command {
    Command(
        "web",
        abstract: "Serve the control page: over Bluetooth from the browser, or through this server to the daemon (Ctrl-C stops).",
        discussion: """
        Example: blecontrol web, then open the address it prints, the one that ends in ?token=…, in any browser on this \
        machine. The page is the original demo app's screen (4 servo sliders, 4 PWM sliders, 4 switches, 2 LCD lines, and \
        a log of every byte). It reaches the board one of two ways, and offers the one that works. Through this server: \
        the page opens a WebSocket to this command, which drives the daemon on this machine through its control socket as \
        a central (transport web, in status): any browser, an iPhone's Safari or Firefox included, the simulator too; the \
        page's controls follow what other centrals and the CLI do; closing the page is a central leaving, and the failsafe \
        acts. The bridge needs the token in the printed address (anyone who can load the page, another user of this \
        machine included, cannot drive the board without it); --token-file keeps one across restarts. Over Bluetooth: the \
        page talks to the board itself with Web Bluetooth, which browsers offer only to a secure context (Chrome or Edge; \
        Chromium on Linux only with chrome://flags, "Experimental Web Platform features"). http://localhost is one; plain \
        HTTP across the network is not. To serve the network: --listen 0.0.0.0:8000 (the page is then plain HTTP: anyone \
        on the path can read the token), best behind an HTTPS reverse proxy (a self-signed certificate works once the \
        browser's warning is accepted; name the proxy with --host). The labels carry the board file's names ("Channel 0 \
        · steering") when this command can reach the board's daemon: its control socket, found as for the other commands \
        (--socket, else $BLECONTROL_SOCKET, else the service's, else the simulator's; one of another user's is refused). \
        Over Bluetooth the page shows them only if the board it connected to calls itself by the same board name, so \
        another board in range never gets this one's names. /board.json holds only the board's name and its outputs' \
        names, to anyone who can load the page. On a Pi the blecontrol-web service serves the page to the network \
        (systemctl enable --now blecontrol-web; its address with the token: journalctl -u blecontrol-web).
        """,
        options: [
            Command.Option("listen", value: "HOST:PORT", help: "Where to serve (default 127.0.0.1:8000; [::1]:8000 for IPv6; port 0 picks a free one). Anything but loopback serves the page to the network, as plain HTTP."),
            Command.Option("host", value: "NAME[,NAME…]", help: "More names the page may be asked for by (the Host a browser sends): a DNS name of this machine, a reverse proxy's. Loopback, the --listen address and, when listening on every address, this machine's own addresses and host name are always allowed; any other Host is refused (421), so a DNS-rebinding page cannot read the server."),
            Command.Option("token-file", value: "PATH", help: "Keep the bridge's token in PATH (made, mode 0600, the first time), so the address stays the same across restarts; without it each run makes a new token."),
            socketOption,
        ]
    ) { arguments in
        let text = arguments.option("listen") ?? "127.0.0.1:8000"
        guard let endpoint = WebEndpoint(text) else {
            throw UsageError("--listen must be HOST:PORT (e.g. 127.0.0.1:8000 or [::1]:0), got \(text)")
        }
        let extra = (arguments.option("host") ?? "").split(separator: ",").map { String($0) }
        guard let hosts = WebHosts(endpoint: endpoint, extra: extra) else {
            throw UsageError("--host must be host names or addresses, separated by commas, got \(arguments.option("host") ?? "")")
        }
        let token = try WebAccessToken.load(arguments.option("token-file"))
        try WebServer.serve(endpoint, hosts: hosts, names: WebNameSource(socketPath: arguments.option("socket") ?? ControlClient.defaultPath()), token: token)
    }
}

/// The names the server answers to: the Host a browser sends must be one
/// of them. Without this check any web page could read the server by
/// DNS rebinding (its own name resolved to this machine): the browser
/// then sends the attacker's name as Host, and the server refuses it.
struct WebHosts: Equatable {
    /// Lowercased, without brackets or a trailing dot.
    private(set) var names: Set<String>

    /// Loopback, the listen address, `extra`, and for a wildcard listen
    /// address this machine's own addresses and host name. nil when an
    /// extra name is not a plausible host.
    init?(endpoint: WebEndpoint, extra: [String], machine: [String] = WebHosts.machineNames()) {
        names = ["localhost", "127.0.0.1", "::1"]
        names.insert(Self.normalised(endpoint.host))
        if endpoint.host == "0.0.0.0" || endpoint.host == "::" {
            for name in machine { names.insert(Self.normalised(name)) }
        }
        for name in extra {
            let trimmed = name.trimmed
            guard !trimmed.isEmpty, trimmed.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "/") && $0 != UInt8(ascii: "@") }) else { return nil }
            names.insert(Self.normalised(trimmed))
        }
    }

    /// "Board.Local." → "board.local"; "[::1]" → "::1".
    static func normalised(_ name: String) -> String {
        var text = name.lowercased()
        if text.hasPrefix("["), text.hasSuffix("]") { text = String(text.dropFirst().dropLast()) }
        while text.hasSuffix(".") { text.removeLast() }
        return text
    }

    /// The host part of a Host header ("name:port", "[v6]:port", "name").
    static func hostPart(_ header: String) -> String {
        let text = header.trimmed
        if text.hasPrefix("["), let close = text.firstIndex(of: "]") { return normalised(String(text[...close])) }
        if let colon = text.lastIndex(of: ":"), text.firstIndex(of: ":") == colon { return normalised(String(text[..<colon])) }
        return normalised(text)
    }

    /// Whether a request's Host names this server.
    func allows(host header: String) -> Bool { names.contains(Self.hostPart(header)) }

    /// Whether a request's Origin (scheme://host[:port], or "null") is a page
    /// of this server: a page elsewhere gets nothing from it.
    func allows(origin: String) -> Bool {
        let parts = origin.trimmed.split(separator: "/", omittingEmptySubsequences: false)
        // "http:", "", "host[:port]"
        guard parts.count == 3, parts[0].hasSuffix(":"), parts[1].isEmpty, !parts[2].isEmpty else { return false }
        let rest = String(parts[2])
        return names.contains(Self.hostPart(rest))
    }

    /// This machine's host name (and NAME.local, as mDNS answers) and the
    /// addresses of its interfaces.
    static func machineNames() -> [String] {
        var result: [String] = []
        var buffer = [CChar](repeating: 0, count: 256)
        if gethostname(&buffer, buffer.count - 1) == 0 {
            let name = String(nulTerminated: buffer)
            if !name.isEmpty { result += [name, name + ".local"] }
        }
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0, let first = list else { return result }
        defer { freeifaddrs(list) }
        var cursor: UnsafeMutablePointer<ifaddrs>? = first
        while let entry = cursor {
            defer { cursor = entry.pointee.ifa_next }
            guard let address = entry.pointee.ifa_addr else { continue }
            var text = [CChar](repeating: 0, count: Int(NI_MAXHOST))
            let family = Int32(address.pointee.sa_family)
            guard family == AF_INET || family == AF_INET6 else { continue }
            let length = socklen_t(family == AF_INET ? MemoryLayout<sockaddr_in>.size : MemoryLayout<sockaddr_in6>.size)
            if getnameinfo(address, length, &text, socklen_t(text.count), nil, 0, NI_NUMERICHOST) == 0 {
                // A link-local IPv6 address carries its zone ("fe80::1%eth0").
                result.append(String(String(nulTerminated: text).split(separator: "%").first ?? ""))
            }
        }
        return result
    }
}

/// A `--listen` address: `host:port`, or `[v6 literal]:port`.
struct WebEndpoint: Equatable {
    var host: String
    var port: UInt16

    init?(_ text: String) {
        guard let colon = text.lastIndex(of: ":"), let port = UInt16(text[text.index(after: colon)...]) else { return nil }
        var host = String(text[..<colon])
        if host.hasPrefix("[") {
            guard host.hasSuffix("]"), host.count > 2 else { return nil }
            host = String(host.dropFirst().dropLast())
        } else if host.contains(":") {
            return nil  // an IPv6 literal needs its brackets
        }
        guard !host.isEmpty else { return nil }
        self.host = host
        self.port = port
    }

    /// The address as a URL's authority.
    func authority(port: UInt16) -> String {
        host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
    }

    /// Whether only this machine can reach it (what a browser counts as a
    /// secure context without HTTPS).
    var isLoopback: Bool {
        host == "localhost" || host == "::1" || host.hasPrefix("127.")
    }
}

/// One file the server can send.
struct WebAsset {
    var contentType: String
    var body: [UInt8]
}

/// The page's files by request path: exactly the embedded ones, nothing else.
struct WebSite {
    private var assets: [String: WebAsset] = [:]

    /// The files compiled in by scripts/embed-web.
    static let embedded = WebSite(files: EmbeddedWeb.files)

    init(files: [(path: String, text: String)]) {
        for file in files {
            assets["/" + file.path] = WebAsset(contentType: WebSite.contentType(of: file.path), body: Array(file.text.utf8))
        }
    }

    /// The asset for a request path ("/" is index.html); nil for anything
    /// else. Paths are compared as they are: there is no file system behind
    /// them, so "..", "%2e" and the like simply name nothing.
    func asset(for path: String) -> WebAsset? {
        assets[path == "/" ? "/index.html" : path]
    }

    static func contentType(of path: String) -> String {
        let name = path.split(separator: "/").last.map(String.init) ?? path
        let suffix = name.split(separator: ".").last.map { $0.lowercased() } ?? ""
        switch suffix {
        case "html": return "text/html; charset=utf-8"
        case "js": return "text/javascript; charset=utf-8"
        case "css": return "text/css; charset=utf-8"
        case "svg": return "image/svg+xml"
        case "json": return "application/json"
        case "txt": return "text/plain; charset=utf-8"
        default: return "application/octet-stream"
        }
    }
}

/// A request's line and the few headers the server reads.
struct WebRequest: Equatable {
    var method: String
    var path: String
    /// What follows "?" in the target ("" for none).
    var query: String = ""
    /// The Host and Origin headers' values, if sent (RFC 9110 §7.2,
    /// RFC 6454 §7): read, never believed until ``WebHosts`` allows them.
    var host: String?
    var origin: String?
    /// An opening WebSocket handshake (RFC 6455 §4.1): `Upgrade: websocket`
    /// and `Connection: Upgrade` both sent.
    var upgradesToWebSocket = false
    var webSocketKey: String?
    var webSocketVersion: String?

    /// A query parameter's value (the first), undecoded: the page's token
    /// is hex, and nothing else is read.
    func parameter(_ name: String) -> String? {
        for pair in query.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            if parts.count == 2, parts[0] == name { return String(parts[1]) }
        }
        return nil
    }
}

/// What a request head says, or why it cannot be served.
enum WebRequestHead: Equatable {
    /// More bytes are needed.
    case incomplete
    case complete(WebRequest)
    /// Answer with this status and close.
    case refused(WebStatus)
}

/// The statuses the server sends.
enum WebStatus: Int {
    case ok = 200
    case badRequest = 400
    case notFound = 404
    case switchingProtocols = 101
    case unauthorized = 401
    case forbidden = 403
    case methodNotAllowed = 405
    case requestTimeout = 408
    case misdirected = 421
    case upgradeRequired = 426
    case headTooLarge = 431
    case unavailable = 503
    case versionNotSupported = 505

    var reason: String {
        switch self {
        case .switchingProtocols: return "Switching Protocols"
        case .unauthorized: return "Unauthorized"
        case .upgradeRequired: return "Upgrade Required"
        case .unavailable: return "Service Unavailable"
        case .ok: return "OK"
        case .badRequest: return "Bad Request"
        case .notFound: return "Not Found"
        case .forbidden: return "Forbidden"
        case .misdirected: return "Misdirected Request"
        case .methodNotAllowed: return "Method Not Allowed"
        case .requestTimeout: return "Request Timeout"
        case .headTooLarge: return "Request Header Fields Too Large"
        case .versionNotSupported: return "HTTP Version Not Supported"
        }
    }
}

/// HTTP/1.x request heads and responses, without I/O (RFC 9112 §3, §2.2).
enum WebHTTP {
    /// The most bytes a request head may take; a browser's GET is well
    /// under 2 KiB. Anything longer is refused without reading further.
    static let maximumHeadBytes = 8192

    /// Parses the head at the start of `bytes` (request line and headers up
    /// to the empty line). Only the request line matters here; headers are
    /// read past, never interpreted.
    static func parseHead(_ bytes: [UInt8]) -> WebRequestHead {
        guard let end = headEnd(bytes) else {
            return bytes.count > maximumHeadBytes ? .refused(.headTooLarge) : .incomplete
        }
        if end > maximumHeadBytes { return .refused(.headTooLarge) }
        // A server should ignore empty lines before the request line (§2.2).
        var start = 0
        while start + 1 < end, bytes[start] == 0x0D || bytes[start] == 0x0A { start += 1 }
        guard let lineEnd = bytes[start..<end].firstIndex(where: { $0 == 0x0D || $0 == 0x0A }) else { return .refused(.badRequest) }
        let line = bytes[start..<lineEnd]
        // Request line: method SP request-target SP HTTP-version, nothing else.
        let parts = line.split(separator: 0x20, omittingEmptySubsequences: false)
        guard parts.count == 3, parts.allSatisfy({ !$0.isEmpty }),
              line.allSatisfy({ $0 > 0x20 && $0 < 0x7F || $0 == 0x20 }) else { return .refused(.badRequest) }
        let method = String(decoding: parts[0], as: UTF8.self)
        let target = String(decoding: parts[1], as: UTF8.self)
        let version = String(decoding: parts[2], as: UTF8.self)
        guard method.utf8.allSatisfy({ isTokenByte($0) }), version.hasPrefix("HTTP/") else { return .refused(.badRequest) }
        guard version == "HTTP/1.1" || version == "HTTP/1.0" else { return .refused(.versionNotSupported) }
        guard method == "GET" || method == "HEAD" else { return .refused(.methodNotAllowed) }
        // Origin form only ("/path?query"); the query and fragment select nothing.
        guard target.hasPrefix("/") else { return .refused(.badRequest) }
        let withoutFragment = target.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false)[0]
        let pathAndQuery = withoutFragment.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        var request = WebRequest(method: method, path: String(pathAndQuery[0]), query: pathAndQuery.count > 1 ? String(pathAndQuery[1]) : "")
        // Host twice is a bad request (RFC 9112 §3.2); so is a second
        // WebSocket key (RFC 6455 §4.2.1 names exactly one).
        var upgrade = false
        var connectionUpgrade = false
        let headerLines = bytes[lineEnd..<end].split(whereSeparator: { $0 == 0x0D || $0 == 0x0A })
        for line in headerLines {
            guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else { continue }
            let name = String(decoding: line[..<colon], as: UTF8.self).lowercased()
            let value = String(decoding: line[(colon + 1)...], as: UTF8.self).trimmed
            switch name {
            case "host":
                if request.host != nil { return .refused(.badRequest) }
                request.host = value
            case "origin":
                request.origin = value
            case "upgrade":
                upgrade = upgrade || listContains(value, "websocket")
            case "connection":
                connectionUpgrade = connectionUpgrade || listContains(value, "upgrade")
            case "sec-websocket-key":
                if request.webSocketKey != nil { return .refused(.badRequest) }
                request.webSocketKey = value
            case "sec-websocket-version":
                request.webSocketVersion = value
            default:
                continue
            }
        }
        request.upgradesToWebSocket = upgrade && connectionUpgrade
        // HTTP/1.1 requires Host (RFC 9112 §3.2); every browser sends it.
        if version == "HTTP/1.1", request.host == nil { return .refused(.badRequest) }
        return .complete(request)
    }

    /// Whether a comma-separated header value (RFC 9110 §5.6.1) holds
    /// `token`, compared without case.
    static func listContains(_ value: String, _ token: String) -> Bool {
        value.split(separator: ",").contains { String($0).trimmed.lowercased() == token }
    }

    /// The index just past the head's empty line (CRLF CRLF, or bare LF LF,
    /// which §2.2 lets a server accept), or nil if it has not arrived.
    static func headEnd(_ bytes: [UInt8]) -> Int? {
        var index = 0
        while index < bytes.count {
            if bytes[index] == 0x0A {
                if index + 1 < bytes.count, bytes[index + 1] == 0x0A { return index + 2 }
                if index + 2 < bytes.count, bytes[index + 1] == 0x0D, bytes[index + 2] == 0x0A { return index + 3 }
            }
            index += 1
        }
        return nil
    }

    private static func isTokenByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"): return true
        default: return "!#$%&'*+-.^_`|~".utf8.contains(byte)
        }
    }

    /// The answer to a parsed head: the asset, or a short plain-text error.
    static func response(to head: WebRequestHead, site: WebSite) -> [UInt8] {
        switch head {
        case .incomplete:
            // Only a timeout answers an incomplete head.
            return response(.requestTimeout, head: false)
        case .refused(let status):
            return response(status, head: false)
        case .complete(let request):
            let head = request.method == "HEAD"
            guard let asset = site.asset(for: request.path) else { return response(.notFound, head: head) }
            return response(.ok, contentType: asset.contentType, body: asset.body, head: head)
        }
    }

    /// A whole response. Every one closes the connection and forbids
    /// caching: after an upgrade the browser must not keep the old page.
    static func response(_ status: WebStatus, contentType: String = "text/plain; charset=utf-8", body: [UInt8]? = nil, head: Bool) -> [UInt8] {
        let content = body ?? Array("\(status.rawValue) \(status.reason)\n".utf8)
        var text = "HTTP/1.1 \(status.rawValue) \(status.reason)\r\n"
        text += "Content-Type: \(contentType)\r\n"
        text += "Content-Length: \(content.count)\r\n"
        text += "Cache-Control: no-store\r\n"
        text += "X-Content-Type-Options: nosniff\r\n"
        text += "Referrer-Policy: no-referrer\r\n"
        // The page loads only its own files and is framed by nobody.
        text += "Content-Security-Policy: default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\n"
        if status == .methodNotAllowed { text += "Allow: GET, HEAD\r\n" }
        text += "Connection: close\r\n\r\n"
        return Array(text.utf8) + (head ? [] : content)
    }
}

/// The server: a listener and its connections, on one event loop.
final class WebServer: @unchecked Sendable {
    // Loop-confined: created on any thread, used only on `loop` (checked).
    static let maximumConnections = 64

    private let loop: EventLoop
    private let site: WebSite
    private let hosts: WebHosts
    private let names: WebNameSource
    private let token: String
    fileprivate var listener: Listener?
    private var connections: [ObjectIdentifier: WebConnection] = [:]
    private var bridges: [ObjectIdentifier: WebBridge] = [:]
    /// Pages driving the board through the server at once.
    static let maximumBridges = 8
    /// The daemon is asked on a thread of its own (ControlClient blocks), one
    /// request at a time; the connections waiting meanwhile share its answer.
    private var namesThread: OSThread?
    private var namesWaiting: [(WebBoardNames) -> Void] = []

    init(loop: EventLoop, site: WebSite, hosts: WebHosts, names: WebNameSource, token: String) {
        self.loop = loop
        self.site = site
        self.hosts = hosts
        self.names = names
        self.token = token
    }

    /// Serves `endpoint` until SIGINT, SIGTERM or SIGHUP; prints the URL
    /// first, then which board names the page gets.
    static func serve(_ endpoint: WebEndpoint, hosts: WebHosts, names: WebNameSource, token: String) throws {
        // A browser that goes away mid-response must cost a write error,
        // not the process.
        signal(SIGPIPE, SIG_IGN)
        // Blocked here, before the loop's thread exists, so that thread
        // inherits the mask and the signals arrive only through the loop.
        let signals = try SignalSource(signals: [SIGINT, SIGTERM, SIGHUP])
        // The descriptor's type is swift-system's, which this target does not
        // import; Result carries it without naming it.
        let listening = Result { try Sockets.listenTCP(host: endpoint.host, port: endpoint.port) }
        if case .failure(let error) = listening {
            throw ExitFailure("blecontrol web: cannot listen on \(endpoint.authority(port: endpoint.port)): \(error)")
        }
        let fd = try listening.get()
        let port = Sockets.localPort(fd) ?? endpoint.port
        let loop = try EventLoop(name: "blecontrol-web")
        loop.start()
        let server = WebServer(loop: loop, site: .embedded, hosts: hosts, names: names, token: token)
        let stop = Promise<Int32>()
        try loop.submitAndWait {
            server.listener = try Listener.start(
                fd: fd, loop: loop, maxConnections: WebServer.maximumConnections,
                onAccept: { [weak server] connection, peer in server?.accept(connection.rawValue, peer: peer) },
                onEvent: { event in printError("blecontrol web: \(event)") })
            try signals.attach(to: loop) { signal, _ in stop.fulfil(signal) }
        }
        let url = "http://\(endpoint.authority(port: port))/"
        print("serving the BLEControl page on \(url) (Ctrl-C stops)")
        print("to drive the board through this server (any browser, no Bluetooth needed), open \(url)?token=\(token)")
        if !endpoint.isLoopback {
            print("note: over the network this is plain HTTP: anyone on the path can read the token; put HTTPS in front (`blecontrol web --help`)")
        }
        fflush(nil)
        // Asked once now only to say what the page will get.
        _ = names.read()
        _ = stop.wait()
        try loop.submitAndWait {
            server.stop()
            signals.detach(from: loop)
        }
        loop.stop()
    }

    /// Calls `deliver` on the loop with the daemon's names as they are now.
    fileprivate func boardNames(_ deliver: @escaping (WebBoardNames) -> Void) {
        loop.assertInLoop()
        namesWaiting.append(deliver)
        guard namesThread == nil else { return }
        let thread = OSThread(name: "blecontrol-names")
        namesThread = thread
        thread.start { [names, loop] in
            let found = names.read()
            loop.execute { [weak self] in self?.namesRead(found) }
        }
    }

    private func namesRead(_ found: WebBoardNames) {
        namesThread?.join()
        namesThread = nil
        let waiting = namesWaiting
        namesWaiting = []
        for deliver in waiting { deliver(found) }
    }

    /// Slots only a connection that has sent its request can hold:
    /// connections still reading a head never fill the server (the oldest
    /// makes way), so silent ones cannot lock a browser out.
    static let reservedForRequests = 8

    /// Whether a request may open the bridge: the `Sec-WebSocket-Accept`
    /// to answer with, or the refusal.
    private func checkBridge(_ request: WebRequest) -> Result<String, WebBridgeRefusal> {
        if let refusal = WebBridgeRefusal.check(request, token: token) { return .failure(refusal) }
        guard bridges.count < WebServer.maximumBridges else {
            return .failure(WebBridgeRefusal(.unavailable, "\(WebServer.maximumBridges) pages already drive the board through this server"))
        }
        return .success(WebSocket.accept(key: request.webSocketKey ?? ""))
    }

    private func openBridge(_ fd: FileDescriptor, peer: String, accept: String) {
        let bridge = WebBridge(fd: fd, peer: peer, accept: accept, loop: loop) { [weak self] closed, reason in
            guard let self, self.bridges.removeValue(forKey: ObjectIdentifier(closed)) != nil else { return }
            print("page \(peer.printable) left: \(reason.printable)")
            fflush(nil)
        }
        bridges[ObjectIdentifier(bridge)] = bridge
        print("page \(peer.printable) drives the board through the daemon's control socket \(names.socketPath.printable)")
        fflush(nil)
        bridge.start(socketPath: names.socketPath)
    }

    fileprivate func accept(_ fd: CInt, peer: String) {
        let waiting = connections.values.filter(\.isReadingHead)
        if let oldest = ReservedSlots.evictee(waiting: waiting, capacity: WebServer.maximumConnections, reserved: WebServer.reservedForRequests,
                                              acceptedAt: \.acceptedAt) {
            oldest.close()
        }
        let gate = WebBridgeGate(
            check: { [weak self] request in self?.checkBridge(request) ?? .failure(WebBridgeRefusal(.unavailable, "the server is stopping")) },
            open: { [weak self] fd, accept in self?.openBridge(fd, peer: peer, accept: accept) })
        let connection = WebConnection(fd: fd, loop: loop, site: site, hosts: hosts, names: { [weak self] deliver in self?.boardNames(deliver) },
                                       bridge: gate) { [weak self] closed in
            guard let self else { return }
            self.connections[ObjectIdentifier(closed)] = nil
            self.listener?.openConnections = self.connections.count
        }
        connections[ObjectIdentifier(connection)] = connection
        listener?.openConnections = connections.count
        connection.start()
    }

    private func stop() {
        loop.assertInLoop()
        listener?.stop()
        listener = nil
        for connection in Array(connections.values) { connection.close() }
        for bridge in Array(bridges.values) { bridge.close("the server stopped", code: 1001) }
    }
}

/// What a connection asking for the bridge needs from its server.
struct WebBridgeGate {
    /// The handshake's accept key, or why not.
    var check: (WebRequest) -> Result<String, WebBridgeRefusal>
    /// Hands the connection's descriptor to a new bridge, which answers
    /// the handshake with the key.
    var open: (FileDescriptor, String) -> Void
}

/// Why a request cannot open the bridge: an HTTP answer with a reason.
struct WebBridgeRefusal: Error, Equatable {
    var status: WebStatus
    var message: String

    init(_ status: WebStatus, _ message: String) {
        self.status = status
        self.message = message
    }

    var response: [UInt8] { WebHTTP.response(status, body: Array("\(status.rawValue) \(status.reason): \(message)\n".utf8), head: false) }

    /// The refusal for a request that is not a WebSocket handshake a page
    /// of this server made with the right token; nil when it is one. The
    /// Host and Origin were checked before (``WebHosts``); here the Origin
    /// must also be present, as every browser sends it on a WebSocket (RFC
    /// 6455 §4.1), so a page elsewhere cannot borrow a tab's token.
    static func check(_ request: WebRequest, token: String) -> WebBridgeRefusal? {
        guard request.method == "GET", request.upgradesToWebSocket else {
            return WebBridgeRefusal(.upgradeRequired, "the bridge speaks WebSocket only")
        }
        guard request.webSocketVersion?.trimmed == "13" else {
            return WebBridgeRefusal(.upgradeRequired, "the bridge speaks WebSocket version 13 only")
        }
        guard let key = request.webSocketKey, WebSocket.isValid(key: key) else {
            return WebBridgeRefusal(.badRequest, "Sec-WebSocket-Key must be 16 bytes in base64")
        }
        guard let origin = request.origin, origin != "null" else {
            return WebBridgeRefusal(.forbidden, "the bridge answers this server's pages only (no Origin)")
        }
        guard let given = request.parameter("token"), WebAccessToken.matches(given, token) else {
            return WebBridgeRefusal(.unauthorized, "the bridge needs the token: open the address `blecontrol web` printed (…/?token=…)")
        }
        return nil
    }
}

/// One browser connection: read a head, write one response, close gently.
final class WebConnection {
    // Loop-confined, like its server.
    private enum Phase {
        case reading
        /// The head read, the answer being looked up (the board's names):
        /// nothing more is read until it is sent.
        case waiting
        case writing
        /// Response sent and our side shut down: reading what the peer
        /// still sends until it closes, so closing cannot reset the
        /// connection before the response is read (RFC 9112 §9.6).
        case lingering
    }

    /// How long a browser gets to send its request head, to read the
    /// response, and to close after it.
    static let headTimeout: Duration = .seconds(10)
    static let writeTimeout: Duration = .seconds(30)
    static let lingerTimeout: Duration = .seconds(2)
    /// How long the board's names may take before the page gets none
    /// (the daemon's own bound, WebNameSource.timeout, is shorter; this one
    /// also covers a connect that hangs).
    static let namesTimeout: Duration = .seconds(10)
    /// The most bytes read and dropped while lingering.
    static let maximumLingerBytes = 65536

    private let fd: CInt
    private let loop: EventLoop
    private let site: WebSite
    private let hosts: WebHosts
    private let names: (@escaping (WebBoardNames) -> Void) -> Void
    private let bridge: WebBridgeGate
    private let onClose: (WebConnection) -> Void
    private var token: LoopToken?
    private var timer: LoopToken?
    private var phase = Phase.reading
    /// When it was accepted: the oldest still reading its head makes way.
    let acceptedAt = ContinuousClock.now
    /// Still waiting for a whole request head.
    var isReadingHead: Bool { phase == .reading && !closed }
    private var received: [UInt8] = []
    private var outbound: [UInt8] = []
    private var written = 0
    private var discarded = 0
    private var closed = false

    init(fd: CInt, loop: EventLoop, site: WebSite, hosts: WebHosts, names: @escaping (@escaping (WebBoardNames) -> Void) -> Void, bridge: WebBridgeGate,
         onClose: @escaping (WebConnection) -> Void) {
        self.fd = fd
        self.loop = loop
        self.site = site
        self.hosts = hosts
        self.names = names
        self.bridge = bridge
        self.onClose = onClose
    }

    func start() {
        do {
            token = try loop.register(fd, interest: .readable) { [weak self] readiness in self?.handle(readiness) }
        } catch {
            return close()
        }
        arm(WebConnection.headTimeout) { [weak self] in
            // No whole head in time: say so, then close.
            self?.respond(WebHTTP.response(.requestTimeout, head: false))
        }
    }

    func close() {
        if release() { Glibc.close(fd) }
    }

    /// Stops watching the descriptor and leaves the server, without closing
    /// it (the bridge takes it over after a handshake); false when it was
    /// released already.
    private func release() -> Bool {
        guard !closed else { return false }
        closed = true
        if let token { loop.unregister(token) }
        if let timer { loop.cancel(timer) }
        token = nil
        timer = nil
        onClose(self)
        return true
    }

    private func arm(_ delay: Duration, _ work: @escaping () -> Void) {
        if let timer { loop.cancel(timer) }
        timer = loop.schedule(after: delay) { [weak self] in
            self?.timer = nil
            work()
        }
    }

    private func handle(_ readiness: EventLoop.Readiness) {
        switch phase {
        case .reading:
            readHead()
        case .waiting:
            break  // not watched meanwhile: its timer bounds it
        case .writing:
            if readiness.contains(.writable) { drain() }
            // A peer that hung up cannot read the rest.
            else if readiness.contains(.closed) { close() }
        case .lingering:
            readAndDiscard()
        }
    }

    private func readHead() {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if count < 0 {
            if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { return }
            return close()
        }
        if count == 0 { return close() }  // gone before asking anything
        received += buffer[0..<count]
        let head = WebHTTP.parseHead(received)
        if head == .incomplete { return }
        guard case .complete(let request) = head else { return respond(WebHTTP.response(to: head, site: site)) }
        // Only its own names (DNS rebinding), and only its own pages.
        if let host = request.host, !hosts.allows(host: host) { return respond(WebHTTP.response(.misdirected, head: false)) }
        if let origin = request.origin, origin != "null", !hosts.allows(origin: origin) { return respond(WebHTTP.response(.forbidden, head: false)) }
        switch request.path {
        case WebBoardNames.path:
            answerWithNames(head: request.method == "HEAD")
        case WebBridge.path:
            switch bridge.check(request) {
            case .failure(let refusal):
                respond(refusal.response)
            case .success(let accept):
                // The bridge takes the descriptor over.
                if release() { bridge.open(FileDescriptor(rawValue: fd), accept) }
            }
        default:
            respond(WebHTTP.response(to: head, site: site))
        }
    }

    private func answerWithNames(head: Bool) {
        phase = .waiting
        received = []
        if let token { loop.setInterest(token, .none) }
        let answer = { [weak self] (found: WebBoardNames) -> Void in
            self?.respond(WebHTTP.response(.ok, contentType: "application/json", body: found.json, head: head))
        }
        arm(WebConnection.namesTimeout) { answer(WebBoardNames()) }
        names(answer)
    }

    private func respond(_ response: [UInt8]) {
        guard !closed, phase == .reading || phase == .waiting else { return }
        phase = .writing
        received = []
        outbound = response
        written = 0
        arm(WebConnection.writeTimeout) { [weak self] in self?.close() }
        drain()
    }

    private func drain() {
        while written < outbound.count {
            let count = outbound.withUnsafeBytes { raw in
                Glibc.send(fd, raw.baseAddress! + written, raw.count - written, Int32(MSG_NOSIGNAL))
            }
            if count < 0 {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK {
                    if let token { loop.setInterest(token, .writable) }
                    return
                }
                return close()
            }
            written += count
        }
        // All sent: half-close, then wait (briefly) for the browser to close.
        shutdown(fd, Int32(SHUT_WR))
        phase = .lingering
        outbound = []
        if let token { loop.setInterest(token, .readable) }
        arm(WebConnection.lingerTimeout) { [weak self] in self?.close() }
    }

    private func readAndDiscard() {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if count < 0, errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { return }
        if count <= 0 { return close() }
        discarded += count
        if discarded > WebConnection.maximumLingerBytes { close() }
    }
}
