#if canImport(Glibc)
import Glibc
#endif
import Reactor
import SystemPackage
import Testing
import TestSupport

@Suite("The reactor: timers on virtual time, the epoll loop, fair connections")
struct ReactorTests {
    @Test("A manual loop fires timers in deadline order, each at its own virtual instant")
    func manualTimers() {
        let loop = ManualLoop()
        let start = loop.now
        var fired: [(String, Duration)] = []
        loop.schedule(after: .milliseconds(30)) { fired.append(("c", start.duration(to: loop.now))) }
        loop.schedule(after: .milliseconds(10)) { fired.append(("a", start.duration(to: loop.now))) }
        let cancelled = loop.schedule(after: .milliseconds(20)) { fired.append(("x", .zero)) }
        loop.schedule(after: .milliseconds(10)) { fired.append(("b", start.duration(to: loop.now))) }
        loop.cancel(cancelled)
        loop.advance(by: .milliseconds(25))
        #expect(fired.map(\.0) == ["a", "b"])
        #expect(fired.map(\.1) == [.milliseconds(10), .milliseconds(10)])
        loop.advance(by: .milliseconds(5))
        #expect(fired.map(\.0) == ["a", "b", "c"])
        #expect(fired.last?.1 == .milliseconds(30))
        #expect(loop.pendingTimers == 0)
    }

    @Test("A timer scheduled by a timer, due within the advance, fires in the same advance")
    func chainedTimers() {
        let loop = ManualLoop()
        var count = 0
        func tick() {
            count += 1
            if count < 5 { loop.schedule(after: .milliseconds(100)) { tick() } }
        }
        loop.schedule(after: .milliseconds(100)) { tick() }
        loop.advance(by: .milliseconds(350))
        #expect(count == 3)
        loop.advance(by: .seconds(10))
        #expect(count == 5)
    }

    @Test("Many cancelled timers do not pile up (the heap compacts)")
    func cancelledTimersCompact() {
        let loop = ManualLoop()
        for _ in 0..<10_000 {
            let token = loop.schedule(after: .seconds(60)) {}
            loop.cancel(token)
        }
        #expect(loop.pendingTimers == 0)
        var fired = false
        loop.schedule(after: .seconds(1)) { fired = true }
        loop.advance(by: .seconds(2))
        #expect(fired)
    }

    @Test("The epoll loop runs work from other threads, timers and descriptor events on its own thread")
    func eventLoop() throws {
        let loop = try EventLoop(name: "test-loop")
        loop.start()
        defer { loop.stop() }
        #expect(!loop.inLoop)
        #expect(try loop.submitAndWait { loop.inLoop })
        let fired = Promise<Bool>()
        _ = try loop.submitAndWait {
            loop.schedule(after: .milliseconds(5)) { fired.fulfil(loop.inLoop) }
        }
        #expect(fired.wait())

        var pair: [Int32] = [-1, -1]
        #expect(pipe(&pair) == 0)
        let fds = pair
        defer { close(fds[0]); close(fds[1]) }
        let readable = Promise<[UInt8]>()
        let token = try loop.submitAndWait {
            try loop.register(fds[0], interest: .readable) { _ in
                var buffer = [UInt8](repeating: 0, count: 16)
                let count = read(fds[0], &buffer, buffer.count)
                readable.fulfil(Array(buffer[0..<max(count, 0)]))
            }
        }
        var bytes: [UInt8] = [1, 2, 3]
        #expect(write(fds[1], &bytes, 3) == 3)
        #expect(readable.wait() == [1, 2, 3])
        try loop.submitAndWait { loop.unregister(token) }
    }

    @Test("Two registrations on one descriptor (libdbus watches a socket twice) each get their events")
    func sharedDescriptor() throws {
        let loop = try EventLoop(name: "test-shared")
        loop.start()
        defer { loop.stop() }
        var pair: [Int32] = [-1, -1]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        let fds = pair
        defer { close(fds[0]); close(fds[1]) }
        let writable = Promise<Bool>()
        let readable = Promise<Bool>()
        let tokens = try loop.submitAndWait { () -> [LoopToken] in
            let w = try loop.register(fds[0], interest: .writable) { readiness in
                if readiness.contains(.writable) { writable.fulfil(true) }
            }
            let r = try loop.register(fds[0], interest: .readable) { readiness in
                if readiness.contains(.readable) { readable.fulfil(true) }
            }
            return [w, r]
        }
        #expect(writable.wait())
        // Writable stays true; pause it so the loop does not spin on it.
        try loop.submitAndWait { loop.setInterest(tokens[0], .none) }
        var byte: UInt8 = 7
        #expect(write(fds[1], &byte, 1) == 1)
        #expect(readable.wait())
        try loop.submitAndWait { for token in tokens { loop.unregister(token) } }
    }

    @Test("One flooding peer cannot starve another: each is read one budget per round")
    func fairReads() throws {
        let loop = try EventLoop(name: "test-fair")
        loop.start()
        defer { loop.stop() }
        var floodPair: [Int32] = [-1, -1]
        var quietPair: [Int32] = [-1, -1]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, &floodPair) == 0)
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, &quietPair) == 0)
        let flood = floodPair
        let quiet = quietPair
        defer { close(flood[1]); close(quiet[1]) }
        // Fill the flooding peer's socket with as much as it takes, then one
        // byte on the quiet one: both are ready in the same round.
        var chunk = [UInt8](repeating: 0xAA, count: 4096)
        var queued = 0
        while true {
            let count = write(flood[1], &chunk, chunk.count)
            if count <= 0 { break }
            queued += count
        }
        #expect(queued > 16 * 1024)
        var byte: UInt8 = 1
        #expect(write(quiet[1], &byte, 1) == 1)

        let floodBytesBeforeQuiet = Promise<Int>()
        final class Counter: @unchecked Sendable { var bytes = 0 }
        let counter = Counter()
        let connections = try loop.submitAndWait { () -> [StreamConnection] in
            let a = StreamConnection(fd: FileDescriptor(rawValue: flood[0]), loop: loop, readBudget: 1024)
            let b = StreamConnection(fd: FileDescriptor(rawValue: quiet[0]), loop: loop, readBudget: 1024)
            a.onData = { counter.bytes += $0.count }
            b.onData = { _ in floodBytesBeforeQuiet.fulfil(counter.bytes) }
            try a.start()
            try b.start()
            return [a, b]
        }
        // The quiet peer was served after at most a round or two of the
        // flood's budget, not after the whole backlog.
        let before = floodBytesBeforeQuiet.wait()
        #expect(before <= 2 * 1024)
        #expect(before < queued)
        try loop.submitAndWait { for connection in connections { connection.close() } }
    }

    @Test("finish() writes everything queued before it closes")
    func finishFlushes() throws {
        let loop = try EventLoop(name: "test-finish")
        loop.start()
        defer { loop.stop() }
        var pair: [Int32] = [-1, -1]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, &pair) == 0)
        let fds = pair
        defer { close(fds[1]) }
        let payload = (0..<300_000).map { UInt8(truncatingIfNeeded: $0) }
        let closed = Promise<String?>()
        // The test keeps the connection alive, as a transport does.
        let connection = try loop.submitAndWait { () -> StreamConnection in
            let connection = StreamConnection(fd: FileDescriptor(rawValue: fds[0]), loop: loop)
            connection.onClose = { closed.fulfil($0) }
            try connection.start()
            connection.send(payload)
            connection.finish(reason: "done")
            return connection
        }
        // Read it all on this side (blocking), then the end of the stream.
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        _ = fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) & ~O_NONBLOCK)
        while true {
            let count = read(fds[1], &buffer, buffer.count)
            if count <= 0 { break }
            received += buffer[0..<count]
        }
        #expect(received == payload)
        #expect(closed.wait() == "done")
        _ = connection
    }

    @Test("A listener past its connection cap accepts and closes, and counts it")
    func connectionCap() throws {
        let loop = try EventLoop(name: "test-cap")
        loop.start()
        defer { loop.stop() }
        let listenerFD = try Sockets.listenTCP(host: "127.0.0.1", port: 0)
        let port = try #require(Sockets.localPort(listenerFD))
        let accepted = Promise<Void>()
        final class Box: @unchecked Sendable { var kept: [FileDescriptor] = [] }
        let box = Box()
        let listener = try loop.submitAndWait { () -> Listener in
            let listener = Listener(fd: listenerFD, loop: loop, maxConnections: 2)
            listener.onAccept = { fd, _ in
                box.kept.append(fd)
                listener.openConnections = box.kept.count
                if box.kept.count == 2 { accepted.fulfil(()) }
            }
            try listener.start()
            return listener
        }
        var clients: [Int32] = []
        for _ in 0..<5 { clients.append(try connectTCP(port: port)) }
        defer { for fd in clients { close(fd) } }
        accepted.wait()
        // The three refused ones see their connection closed.
        var refused: Set<Int32> = []
        #expect(eventually {
            for fd in clients where !refused.contains(fd) {
                var pollSet = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                var byte: UInt8 = 0
                if poll(&pollSet, 1, 0) == 1 && read(fd, &byte, 1) == 0 { refused.insert(fd) }
            }
            return refused.count == 3
        })
        let statistics = try loop.submitAndWait { listener.statistics }
        #expect(statistics.accepted == 2)
        #expect(statistics.refused == 3)
        try loop.submitAndWait {
            listener.stop()
            for fd in box.kept { try? fd.close() }
        }
    }

    @Test("Condition waits run on the monotonic clock and time out")
    func monotonicWait() {
        let condition = Condition(priorityInheritance: true)
        let signalled = condition.withLock { condition.wait(until: .now + .milliseconds(5)) }
        #expect(signalled == false)
    }
}

/// A blocking TCP connection to 127.0.0.1:`port`.
func connectTCP(port: UInt16) throws -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
    let status = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard status == 0 else {
        close(fd)
        throw Sockets.Failure(call: "connect", errno: Errno(rawValue: errno))
    }
    return fd
}

@Suite("TCP liveness on accepted connections")
struct LivenessTests {
    @Test("Keepalive and TCP_USER_TIMEOUT are on, as asked, on a real accepted socket: a dead peer is seen within 25 s")
    func livenessIsSet() throws {
        let listener = try Sockets.listenTCP(host: "127.0.0.1", port: 0)
        defer { try? listener.close() }
        let port = try #require(Sockets.localPort(listener))
        let client = try LoopbackTCPClient(port: port)
        var accepted: FileDescriptor?
        #expect(eventually {
            if case .connection(let fd, _)? = try? Sockets.accept(listener) { accepted = fd }
            return accepted != nil
        })
        let fd = try #require(accepted)
        defer { try? fd.close() }
        #expect(Sockets.liveness(of: fd) == nil, "off until asked")
        let set = Sockets.setLiveness(fd)
        #expect(set == Sockets.Liveness())
        #expect(Sockets.Liveness().deadPeerSeconds == 25)
        _ = client
    }
}
