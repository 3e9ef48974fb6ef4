#if canImport(Glibc)
import Glibc
#endif
import Control
import Reactor
import Testing

@Suite("The CLI trusts no control socket another user owns")
struct ControlSocketTrustTests {
    @Test("A socket file that belongs to another user is refused before connecting; root's and the caller's are used",
          .enabled(if: geteuid() == 0, "chown needs root"))
    func socketFileOwner() throws {
        var template = Array("/tmp/blecontrol-client-XXXXXX".utf8CString)
        let directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)) }
        defer { _ = Subprocess.output(of: "/bin/rm", ["-rf", directory]) }
        let path = directory + "/control.sock"
        let listener = try Sockets.listenUnix(path: path)
        defer { try? listener.close() }

        // This process's own socket (root's here): connected, nothing refused.
        _ = try ControlClient(path: path, timeout: .seconds(1))

        chown(path, 65534, 65534)
        do {
            _ = try ControlClient(path: path, timeout: .seconds(1))
            Issue.record("a socket file of uid 65534 was used")
        } catch {
            let text = "\(error)"
            #expect(text.contains("refusing the control socket \(path)") && text.contains("uid 65534"), "\(text)")
        }
        // Refused before connecting: the listener has no connection waiting
        // beyond the first client's.
        var pending = pollfd(fd: listener.rawValue, events: Int16(POLLIN), revents: 0)
        #expect(poll(&pending, 1, 0) == 1, "the first client's connection is pending")
        let first = accept(listener.rawValue, nil, nil)
        #expect(first >= 0)
        close(first)
        #expect(poll(&pending, 1, 0) == 0, "the refused client connected anyway")
    }
}
