import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The checkout's root, for web/.
private let repositoryRoot = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// `blecontrol web --listen 127.0.0.1:0`, stopped with SIGTERM when done.
private final class WebServerProcess {
    let process = Process()
    private(set) var port: UInt16 = 0
    private let output = Pipe()

    init(arguments: [String] = ["--listen", "127.0.0.1:0"]) throws {
        process.executableURL = URL(fileURLWithPath: Executables.cli)
        process.arguments = ["web"] + arguments
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        // Ready once it prints its URL (it listens before printing).
        var text = ""
        receiveChunks(from: output.fileHandleForReading.fileDescriptor) { chunk in
            text += String(decoding: chunk, as: UTF8.self)
            if let range = text.range(of: "http://127.0.0.1:"), let end = text[range.upperBound...].firstIndex(of: "/") {
                port = UInt16(text[range.upperBound..<end]) ?? 0
            }
            return port == 0
        }
        if port == 0 { throw HarnessError(description: "no URL from blecontrol web: \(text)") }
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
