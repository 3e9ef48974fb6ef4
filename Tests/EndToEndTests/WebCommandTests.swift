import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The checkout's root, for web/.
private let repositoryRoot = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// No daemon there: the socket `blecontrol web` asks for board names unless
/// a test gives one.
private let absentSocket = "/nonexistent/blecontrol-web-test/control.sock"

/// `blecontrol web --listen 127.0.0.1:0`, stopped with SIGTERM when done.
private final class WebServerProcess {
    let process = Process()
    private(set) var port: UInt16 = 0
    /// What it printed so far.
    private(set) var output = ""
    private let pipe = Pipe()

    init(arguments: [String] = ["--listen", "127.0.0.1:0"], socket: String = absentSocket) throws {
        process.executableURL = URL(fileURLWithPath: Executables.cli)
        process.arguments = ["web"] + arguments + ["--socket", socket]
        process.standardOutput = pipe
        process.standardError = FileHandle.nullDevice
        try process.run()
        // Ready once it prints its URL (it listens before printing) and
        // then which board names it serves.
        read(until: { $0.contains("board names") && $0.hasSuffix("\n") })
        if let range = output.range(of: "http://127.0.0.1:"), let end = output[range.upperBound...].firstIndex(of: "/") {
            port = UInt16(output[range.upperBound..<end]) ?? 0
        }
        if port == 0 { throw HarnessError(description: "no URL from blecontrol web: \(output)") }
    }

    /// Reads its output until `enough` holds for all of it (or it closes).
    func read(until enough: (String) -> Bool) {
        guard !enough(output) else { return }
        receiveChunks(from: pipe.fileHandleForReading.fileDescriptor) { chunk in
            output += String(decoding: chunk, as: UTF8.self)
            return !enough(output)
        }
    }

    deinit { _ = stop() }

    /// SIGTERM and wait; the exit status, nil if it did not stop.
    func stop(signal: Int32 = SIGTERM) -> Int32? {
        guard process.isRunning else { return process.terminationStatus }
        kill(process.processIdentifier, signal)
        if !eventually({ !process.isRunning }) {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            return nil
        }
        return process.terminationStatus
    }
}

/// One HTTP response, as read from the socket until the server closed it.
private struct Response {
    var statusLine: String
    var headers: [String: String]
    var body: [UInt8]
    var status: Int { Int(statusLine.split(separator: " ").dropFirst().first ?? "") ?? 0 }
}

/// Sends `request` as is (possibly malformed) and reads the whole answer.
private func exchange(_ port: UInt16, _ request: [UInt8]) throws -> Response {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw HarnessError(description: "socket: \(errno)") }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard connected == 0 else { throw HarnessError(description: "connect: \(errno)") }
    var sent = 0
    while sent < request.count {
        let count = request[sent...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        // The server may answer (431) and stop reading before all of an
        // oversized request is sent; what it answered is what counts.
        if count <= 0 { break }
        sent += count
    }
    // Until the server closes the connection (it always does).
    var received: [UInt8] = []
    receiveChunks(from: fd) { chunk in
        received += chunk
        return true
    }
    guard let split = received.indices.first(where: { received[$0...].starts(with: [0x0D, 0x0A, 0x0D, 0x0A]) }) else {
        throw HarnessError(description: "no complete response head: \(String(decoding: received, as: UTF8.self))")
    }
    let lines = String(decoding: received[..<split], as: UTF8.self).components(separatedBy: "\r\n")
    var headers: [String: String] = [:]
    for line in lines.dropFirst() {
        guard let colon = line.firstIndex(of: ":") else { continue }
        headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
    }
    return Response(statusLine: lines[0], headers: headers, body: Array(received[(split + 4)...]))
}

private func get(_ port: UInt16, _ path: String, method: String = "GET") throws -> Response {
    try exchange(port, Array("\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: test\r\n\r\n".utf8))
}

/// Every file under web/, by path relative to it.
private func webFiles() throws -> [String: Data] {
    let web = repositoryRoot.appendingPathComponent("web")
    var files: [String: Data] = [:]
    let enumerator = try #require(FileManager.default.enumerator(at: web, includingPropertiesForKeys: [.isRegularFileKey]))
    for case let url as URL in enumerator where (try url.resourceValues(forKeys: [.isRegularFileKey])).isRegularFile == true {
        guard !url.lastPathComponent.hasPrefix(".") else { continue }
        let relative = String(url.standardizedFileURL.path.dropFirst(web.standardizedFileURL.path.count + 1))
        files[relative] = try Data(contentsOf: url)
    }
    return files
}

@Suite("blecontrol web: the control page's server", .serialized)
struct WebCommandTests {
    @Test("Serves every file of web/ byte for byte (the embedded copy is current: scripts/embed-web), / is index.html")
    func servesTheEmbeddedPage() throws {
        let server = try WebServerProcess()
        let files = try webFiles()
        #expect(files.keys.contains("index.html") && files.keys.contains("app.js") && files.keys.contains("protocol.js") && files.keys.contains("style.css"))
        let types = ["html": "text/html; charset=utf-8", "js": "text/javascript; charset=utf-8", "css": "text/css; charset=utf-8", "svg": "image/svg+xml"]
        for (path, contents) in files.sorted(by: { $0.key < $1.key }) {
            let response = try get(server.port, "/" + path)
            #expect(response.status == 200, "\(path): \(response.statusLine)")
            #expect(response.body == Array(contents), "\(path): the binary's copy differs from web/\(path); run scripts/embed-web")
            #expect(response.headers["content-length"] == String(contents.count), "\(path)")
            #expect(response.headers["content-type"] == types[String(path.split(separator: ".").last ?? "")], "\(path): \(response.headers["content-type"] ?? "none")")
            #expect(response.headers["cache-control"] == "no-store", "\(path)")
            #expect(response.headers["connection"] == "close", "\(path)")
        }
        let index = Array(try #require(files["index.html"]))
        let app = Array(try #require(files["app.js"]))
        let root = try get(server.port, "/")
        #expect(root.status == 200 && root.body == index)
        let query = try get(server.port, "/app.js?v=2#top")
        #expect(query.status == 200 && query.body == app, "a query string selects nothing")
        #expect(server.stop() == 0)
    }

    @Test("HEAD: the GET's headers, no body")
    func head() throws {
        let server = try WebServerProcess()
        let full = try get(server.port, "/style.css")
        let head = try get(server.port, "/style.css", method: "HEAD")
        #expect(head.status == 200)
        #expect(head.body.isEmpty)
        #expect(head.headers["content-length"] == full.headers["content-length"] && !full.body.isEmpty)
        #expect(head.headers["content-type"] == "text/css; charset=utf-8")
        let missing = try get(server.port, "/nope", method: "HEAD")
        #expect(missing.status == 404 && missing.body.isEmpty)
    }

    @Test("Nothing but the page: 404 for other paths, traversal included; no file system behind it")
    func notFound() throws {
        let server = try WebServerProcess()
        for path in ["/nope", "/../Package.swift", "/..%2fPackage.swift", "/%2e%2e/%2e%2e/etc/passwd", "/web/index.html", "//etc/passwd",
                     "/index.html/", "/./index.html", "/Sources/blecontrol/Web.swift", "/.git/config", "/INDEX.HTML"] {
            let response = try get(server.port, path)
            #expect(response.status == 404, "\(path): \(response.statusLine)")
            #expect(response.headers["cache-control"] == "no-store")
            #expect(String(decoding: response.body, as: UTF8.self) == "404 Not Found\n", "\(path)")
        }
    }

    @Test("Malformed and unsupported requests: 400, 405 (with Allow), 505, and 431 past 8 KiB")
    func refused() throws {
        let server = try WebServerProcess()
        let post = try exchange(server.port, Array("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc".utf8))
        #expect(post.status == 405)
        #expect(post.headers["allow"] == "GET, HEAD")
        #expect(try exchange(server.port, Array("GARBAGE\r\n\r\n".utf8)).status == 400)
        #expect(try exchange(server.port, Array("GET  / HTTP/1.1\r\n\r\n".utf8)).status == 400)
        #expect(try exchange(server.port, Array("GET index.html HTTP/1.1\r\n\r\n".utf8)).status == 400)
        #expect(try exchange(server.port, Array("GET http://example.test/ HTTP/1.1\r\n\r\n".utf8)).status == 400)
        #expect(try exchange(server.port, Array("GET / HTTP/2.0\r\n\r\n".utf8)).status == 505)
        #expect(try exchange(server.port, Array("GET /\u{1}x HTTP/1.1\r\n\r\n".utf8)).status == 400)
        // A head that never ends within the bound: refused without waiting for the end.
        let long = Array("GET / HTTP/1.1\r\nX-Filler: ".utf8) + [UInt8](repeating: UInt8(ascii: "a"), count: 20_000)
        #expect(try exchange(server.port, long).status == 431)
        let longLine = Array("GET /\(String(repeating: "a", count: 9000)) HTTP/1.1\r\n\r\n".utf8)
        #expect(try exchange(server.port, longLine).status == 431)
        // HTTP/1.0 and bare LF line ends are served.
        #expect(try exchange(server.port, Array("GET / HTTP/1.0\n\n".utf8)).status == 200)
        // Still serving after all that.
        #expect(try get(server.port, "/index.html").status == 200)
        #expect(server.stop(signal: SIGINT) == 0)
    }

    @Test("Silent connections cannot lock a browser out: the page is served beside 64 of them")
    func silentConnections() throws {
        let server = try WebServerProcess()
        let silent = try (0..<64).map { _ in try LoopbackTCPClient(port: server.port) }
        #expect(try get(server.port, "/index.html").status == 200)
        // The ones that never asked are all closed in the end (the oldest
        // made way; the rest answered 408 at their deadline).
        let closed = silent.filter { $0.isClosedByPeer }.count
        #expect(closed == silent.count)
        #expect(server.stop() == 0)
    }

    @Test("Only its own Host names: a DNS-rebinding page's Host is refused (421), a foreign Origin too (403); --host adds names")
    func hostAndOrigin() throws {
        let server = try WebServerProcess(arguments: ["--listen", "127.0.0.1:0", "--host", "board.lan,Pi.Example."])
        func ask(_ path: String, _ headers: String) throws -> Int {
            try exchange(server.port, Array("GET \(path) HTTP/1.1\r\n\(headers)\r\n".utf8)).status
        }
        for path in ["/board.json", "/", "/app.js"] {
            #expect(try ask(path, "Host: attacker.example:\(server.port)\r\n") == 421, "\(path)")
            #expect(try ask(path, "Host: 127.0.0.1.attacker.example\r\n") == 421, "\(path)")
        }
        for host in ["127.0.0.1:\(server.port)", "localhost:\(server.port)", "LOCALHOST", "[::1]:\(server.port)", "board.lan", "pi.example:8000", "pi.example."] {
            #expect(try ask("/board.json", "Host: \(host)\r\n") == 200, "\(host)")
        }
        #expect(try ask("/board.json", "") == 400, "HTTP/1.1 without Host")
        #expect(try ask("/board.json", "Host: a\r\nHost: 127.0.0.1\r\n") == 400, "Host twice")
        #expect(try ask("/board.json", "Host: 127.0.0.1\r\nOrigin: http://attacker.example\r\n") == 403)
        #expect(try ask("/board.json", "Host: 127.0.0.1\r\nOrigin: http://127.0.0.1:\(server.port)\r\n") == 200)
        #expect(try ask("/board.json", "Host: 127.0.0.1\r\nOrigin: null\r\n") == 200)
        #expect(server.stop() == 0)
        let bad = try run(Executables.cli, ["web", "--listen", "127.0.0.1:0", "--host", "a b"])
        #expect(bad.status == 2, "\(bad.stderr)")
    }

    @Test("The page's response headers: no-store, nosniff, a same-origin content security policy")
    func headers() throws {
        let server = try WebServerProcess()
        let response = try get(server.port, "/")
        #expect(response.headers["x-content-type-options"] == "nosniff")
        #expect(response.headers["referrer-policy"] == "no-referrer")
        #expect(response.headers["content-security-policy"]?.hasPrefix("default-src 'self'") == true)
    }

    @Test("The page refers to nothing outside itself: no URL but this machine's http://localhost in any file")
    func selfContained() throws {
        for (path, contents) in try webFiles() {
            // (An SVG's namespace name is an identifier, not a link.)
            let text = String(decoding: contents, as: UTF8.self).replacingOccurrences(of: "http://localhost", with: "")
                .replacingOccurrences(of: "xmlns=\"http://www.w3.org/2000/svg\"", with: "")
            #expect(!text.contains("http://") && !text.contains("https://") && !text.contains("src=\"//") && !text.contains("href=\"//"), "\(path)")
        }
    }

    @Test("--listen: bad addresses are usage errors (exit 2); a port in use is a clear failure (exit 1)")
    func listenOption() throws {
        for bad in ["nonsense", "127.0.0.1", "127.0.0.1:99999", "::1:8000", ":8000", "[::1:8000"] {
            let result = try run(Executables.cli, ["web", "--listen", bad])
            #expect(result.status == 2, "\(bad): \(result.status) \(result.stderr)")
            #expect(result.stderr.contains("--listen"), "\(bad): \(result.stderr)")
        }
        let server = try WebServerProcess()
        let second = try run(Executables.cli, ["web", "--listen", "127.0.0.1:\(server.port)"])
        #expect(second.status == 1)
        #expect(second.stderr.contains("cannot listen on 127.0.0.1:\(server.port)"), "\(second.stderr)")
        #expect(try get(server.port, "/").status == 200, "the first server is unaffected")
    }
}

/// What /board.json says with no daemon to ask.
private let noNames = #"{"board":null,"channels":[],"switches":[],"lcd_lines":[]}"#

/// board/simulator.yaml with names for channels 0, 1, 4, 5 and 6, switches
/// 0 and 2 and both LCD lines: text that JSON must escape, markup, a
/// right-to-left override and a name of one character that is 161 bytes
/// (all of which the board file accepts).
private func namedBoard(steering: String = "steering") throws -> String {
    var text = try String(contentsOf: repositoryRoot.appendingPathComponent("board/simulator.yaml"), encoding: .utf8)
    for (from, to) in [
        ("{ channel: 0, output: 0, role: servo, min_us: 1000, max_us: 2000 }", "{ channel: 0, output: 0, role: servo, min_us: 1000, max_us: 2000, name: \(steering) }"),
        ("{ channel: 1, output: 1, role: servo, min_us: 1000, max_us: 2000 }", #"{ channel: 1, output: 1, role: servo, min_us: 1000, max_us: 2000, name: 'Arm "left" <b>&</b> \ end' }"#),
        ("{ channel: 4, output: 4, role: pwm }", "{ channel: 4, output: 4, role: pwm, name: \"Lüfter ⚙\" }"),
        ("- { switch: 0, emulated: true }", "- { switch: 0, emulated: true, name: headlights }"),
        ("- { switch: 2, emulated: true }", "- { switch: 2, emulated: true, name: \"Tür </script>\" }"),
        ("  rows: 2\n", "  rows: 2\n  line_names: [Speed, \"Status: ok\"]\n"),
    ] {
        guard text.contains(from) else { throw HarnessError(description: "board/simulator.yaml has no \(from)") }
        text = text.replacingOccurrences(of: from, with: to)
    }
    return text
}

/// A control socket served by this test process (so its owner is trusted):
/// it answers each status request with `reply`, or, with none, reads the
/// request and never answers.
private final class FakeDaemon: @unchecked Sendable {
    let directory: URL
    let path: String
    private let listener: Int32
    private let lock = NSLock()
    private var reply: [UInt8]?
    private var held: [Int32] = []
    private var count = 0

    init(reply status: [String: Any]?) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("blecontrol-fake-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        path = directory.appendingPathComponent("control.sock").path
        listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard withUnixAddress(path, { bind(listener, $0, $1) }) == 0, listen(listener, 16) == 0 else {
            throw HarnessError(description: "bind/listen \(path): \(errno)")
        }
        try answer(status)
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    /// Status requests read so far.
    var requests: Int { lock.withLock { count } }

    /// What later requests get.
    func answer(_ status: [String: Any]?) throws {
        let line = try status.map { Array(try JSONSerialization.data(withJSONObject: ["ok": true, "status": $0])) + [0x0A] }
        lock.withLock { reply = line }
    }

    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        lock.withLock {
            for fd in held { close(fd) }
            held = []
        }
        try? FileManager.default.removeItem(at: directory)
    }

    private func acceptLoop() {
        while true {
            let fd = accept(listener, nil, nil)
            if fd < 0 {
                if errno == EINTR { continue }
                return  // stopped
            }
            Thread.detachNewThread { [self] in serve(fd) }
        }
    }

    private func serve(_ fd: Int32) {
        var line: [UInt8] = []
        var byte: UInt8 = 0
        while !line.contains(0x0A), read(fd, &byte, 1) == 1 { line.append(byte) }
        let answer = lock.withLock { () -> [UInt8]? in
            count += 1
            if reply == nil { held.append(fd) }
            return reply
        }
        guard let answer else { return }
        _ = answer.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        close(fd)
    }
}

/// A status as a daemon sends it, with these names (nil: unnamed).
private func status(board: String, channels: [(Int, String?)], switches: [(Int, String?)], lineNames: [String]) -> [String: Any] {
    [
        "board": board, "version": "test", "uptime_seconds": 1, "simulated": true,
        "channels": channels.map { number, name -> [String: Any] in
            var channel: [String: Any] = ["channel": number, "output": 0, "role": "servo", "enabled": false, "pulse_us": 0, "duty": 0, "latched": false]
            channel["name"] = name
            return channel
        },
        "switches": switches.map { number, name -> [String: Any] in
            var item: [String: Any] = ["switch": number, "on": false, "output": "emulated"]
            item["name"] = name
            return item
        },
        "lcd": ["online": true, "columns": 16, "rows": 4, "lines": ["", "", "", ""], "bus_writes": 0, "line_names": lineNames] as [String: Any],
        "sessions": [] as [Any],
        "counters": ["frames": 0, "errors": 0, "discarded_partials": 0, "sessions_total": 0, "refused_connections": 0],
        "transports": [:] as [String: Any],
    ]
}

/// /board.json parsed: the board's name and number → name per kind.
private struct Names: Equatable {
    var board: String?
    var channels: [Int: String]
    var switches: [Int: String]
    var lines: [Int: String]

    init(board: String?, channels: [Int: String] = [:], switches: [Int: String] = [:], lines: [Int: String] = [:]) {
        self.board = board
        self.channels = channels
        self.switches = switches
        self.lines = lines
    }

    init(_ body: [UInt8]) throws {
        let object = try #require(try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any])
        func list(_ key: String, _ number: String) throws -> [Int: String] {
            let entries = try #require(object[key] as? [[String: Any]], "\(key)")
            var result: [Int: String] = [:]
            for entry in entries {
                let index = try #require(entry[number] as? Int)
                #expect(result[index] == nil, "\(key): \(index) twice")
                result[index] = try #require(entry["name"] as? String)
            }
            #expect(entries.map { $0[number] as? Int } == result.keys.sorted(), "\(key) in number order")
            return result
        }
        board = object["board"] as? String
        channels = try list("channels", "channel")
        switches = try list("switches", "switch")
        lines = try list("lcd_lines", "line")
    }
}

@Suite("blecontrol web: the board's names for the page (/board.json)", .serialized)
struct WebBoardNamesTests {
    @Test("A daemon's names, escaped as JSON text; asked again per request (a reload shows); HEAD the same headers")
    func fromTheDaemon() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("blecontrol-web-names-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let board = directory.appendingPathComponent("board.yaml")
        try namedBoard().write(to: board, atomically: true, encoding: .utf8)
        let daemon = try SimulatorDaemon(extraArguments: ["--board", board.path])

        let server = try WebServerProcess(socket: daemon.socketPath)
        #expect(server.output.contains("board names from the daemon at \(daemon.socketPath): board simulator, 3 channels, 2 switches and 2 LCD lines named"), "\(server.output)")
        let response = try get(server.port, "/board.json")
        #expect(response.status == 200)
        #expect(response.headers["content-type"] == "application/json")
        #expect(response.headers["cache-control"] == "no-store")
        #expect(response.headers["x-content-type-options"] == "nosniff")
        #expect(response.headers["content-security-policy"]?.hasPrefix("default-src 'self'") == true)
        let expected = #"{"board":"simulator","channels":[{"channel":0,"name":"steering"},{"channel":1,"name":"Arm \"left\" <b>&</b> \\ end"},"#
            + #"{"channel":4,"name":"Lüfter ⚙"}],"switches":[{"switch":0,"name":"headlights"},{"switch":2,"name":"Tür </script>"}],"#
            + #""lcd_lines":[{"line":0,"name":"Speed"},{"line":1,"name":"Status: ok"}]}"#
        #expect(String(decoding: response.body, as: UTF8.self) == expected)
        #expect(try Names(response.body) == Names(board: "simulator", channels: [0: "steering", 1: #"Arm "left" <b>&</b> \ end"#, 4: "Lüfter ⚙"],
                                                  switches: [0: "headlights", 2: "Tür </script>"], lines: [0: "Speed", 1: "Status: ok"]))
        let head = try get(server.port, "/board.json", method: "HEAD")
        #expect(head.status == 200 && head.body.isEmpty && head.headers["content-length"] == String(response.body.count))

        // Renamed in the board file and reloaded: the next request has it.
        try namedBoard(steering: "wheel").write(to: board, atomically: true, encoding: .utf8)
        kill(daemon.process.processIdentifier, SIGHUP)
        _ = try daemon.waitFor("channel 0 renamed") { $0.channel(0)?["name"] as? String == "wheel" }
        #expect(try Names(try get(server.port, "/board.json").body).channels[0] == "wheel")
        #expect(server.stop() == 0)
    }

    @Test("No daemon: an empty document (200, so the page's console stays quiet), and the server says why")
    func noDaemon() throws {
        let server = try WebServerProcess()
        #expect(server.output.contains("board names: none, the page labels outputs by number (cannot connect to \(absentSocket)"), "\(server.output)")
        let response = try get(server.port, "/board.json")
        #expect(response.status == 200 && response.headers["content-type"] == "application/json")
        #expect(String(decoding: response.body, as: UTF8.self) == noNames)
    }

    @Test("A daemon's status with hostile names: out-of-range numbers, duplicates, controls, overrides, megabytes; the document stays small and clean")
    func hostileStatus() throws {
        // The most a status can fill: every channel and switch the protocol
        // addresses named with 40 characters of 160 bytes, each a quote
        // that JSON escapes (and some more that are not allowed).
        let widest = String(repeating: "\"\u{301}\u{301}", count: 32)
        #expect(widest.count == 32 && widest.utf8.count == 160)
        var channels: [(Int, String?)] = [(-1, "minus"), (0, String(repeating: "a", count: 600_000)), (1, "bell\u{7}"), (2, "\u{202E}evil"),
                                          (3, "   "), (4, "</script><script>alert(1)</script>"), (4, "second four"), (5, "line\u{2028}break"),
                                          (6, "c1\u{85}"), (7, nil), (8, String(repeating: "x", count: 41))]
        channels += (9...300).map { ($0, widest) }
        let switches: [(Int, String?)] = (0...255).map { ($0, widest) } + [(256, "too far"), (100_000, "far")]
        let fake = try FakeDaemon(reply: status(board: "bench", channels: channels, switches: switches, lineNames: ["one", "two", "three", "four", "five", "six"]))
        defer { fake.stop() }
        let server = try WebServerProcess(socket: fake.path)
        let response = try get(server.port, "/board.json")
        #expect(response.status == 200)
        #expect(response.body.count <= 128 * 1024, "\(response.body.count) bytes")
        let names = try Names(response.body)
        #expect(names.board == "bench")
        #expect(names.channels.keys.sorted() == [4] + Array(9...255))
        #expect(names.channels[4] == "</script><script>alert(1)</script>")
        #expect(names.channels.filter { $0.key != 4 }.allSatisfy { $0.value == widest })
        #expect(names.switches.keys.sorted() == Array(0...255) && names.switches.values.allSatisfy { $0 == widest })
        #expect(names.lines == [0: "one", 1: "two", 2: "three", 3: "four"])

        // A board name that is not plain text: no names at all (the page
        // could never match it).
        try fake.answer(status(board: "bad\u{1B}[31m", channels: [(0, "steering")], switches: [], lineNames: []))
        #expect(String(decoding: try get(server.port, "/board.json").body, as: UTF8.self) == noNames)

        // An answer past the client's bound (1 MiB) is not read at all.
        try fake.answer(status(board: "bench", channels: [(0, String(repeating: "a", count: 2_000_000))], switches: [], lineNames: []))
        #expect(String(decoding: try get(server.port, "/board.json").body, as: UTF8.self) == noNames)
    }

    @Test("A daemon that does not answer: the page's files are served meanwhile; /board.json then comes empty")
    func silentDaemon() throws {
        let fake = try FakeDaemon(reply: nil)
        defer { fake.stop() }
        let server = try WebServerProcess(socket: fake.path)
        #expect(server.output.contains("board names: none, the page labels outputs by number (the daemon did not answer in time)"), "\(server.output)")
        let asked = fake.requests
        let names = LockedData()
        let done = DispatchSemaphore(value: 0)
        let port = server.port
        DispatchQueue.global().async {
            if let response = try? get(port, "/board.json") { names.set(Data(response.body)) }
            done.signal()
        }
        // The daemon has the request and is sitting on it: the page still loads.
        #expect(eventually { fake.requests > asked })
        #expect(try get(server.port, "/").status == 200)
        #expect(try get(server.port, "/app.js").status == 200)
        done.wait()
        #expect(String(decoding: names.get(), as: UTF8.self) == noNames)
    }
}
