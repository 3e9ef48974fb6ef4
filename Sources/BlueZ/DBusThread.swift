#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// The one thread a D-Bus connection lives on: a `poll(2)` loop over
/// libdbus's watches, its timeouts and our own timers, so no D-Bus traffic
/// ever runs on (or blocks) the firmware's event loop or the servo thread.
///
/// ``execute(_:)`` is safe from any thread; everything else is for the
/// thread itself.
public final class DBusThread: @unchecked Sendable {
    // Thread-confined except `queued`/`stopRequested` (under `lock`) and the
    // wake pipe, which makes the unchecked Sendable sound.
    public struct Token: Hashable, Sendable { fileprivate let id: UInt64 }

    struct Watch {
        var fd: Int32
        var events: Int16
        var handler: (Int16) -> Void
    }

    private struct Timer {
        var token: Token
        var deadline: ContinuousClock.Instant
        var work: () -> Void
    }

    private let wakeRead: Int32
    private let wakeWrite: Int32
    private let lock = NSLock()
    private var queued: [@Sendable () -> Void] = []
    private var stopRequested = false
    private var running = false
    private var threadID: pthread_t?
    private let finished = DispatchSemaphore(value: 0)
    private var timers: [Timer] = []
    private var nextID: UInt64 = 0
    /// Asked each round for the descriptors to poll (libdbus's enabled watches).
    var pollSources: () -> [Watch] = { [] }
    /// Runs after every round (libdbus dispatch).
    var afterRound: () -> Void = {}

    public init() {
        var fds: [Int32] = [-1, -1]
        _ = pipe(&fds)
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        wakeRead = fds[0]
        wakeWrite = fds[1]
    }

    deinit {
        close(wakeRead)
        close(wakeWrite)
    }

    /// Starts the thread, named for `ps -L`.
    public func start(name: String) {
        lock.withLock { running = true }
        let thread = Thread { [self] in
            threadID = pthread_self()
            run()
            finished.signal()
        }
        thread.name = name
        thread.start()
    }

    /// Finishes the queued work and waits for the thread to end (unless
    /// called on the thread itself).
    public func stop() {
        let wasRunning = lock.withLock { () -> Bool in
            defer { stopRequested = true }
            return running
        }
        wake()
        if wasRunning, !isCurrent { finished.wait() }
    }

    public var isCurrent: Bool {
        guard let threadID else { return false }
        return pthread_equal(threadID, pthread_self()) != 0
    }

    /// Runs `work` on the thread, soon, in submission order.
    public func execute(_ work: @escaping @Sendable () -> Void) {
        lock.withLock { queued.append(work) }
        wake()
    }

    /// Runs `work` on the thread after `delay` (call on the thread).
    @discardableResult
    public func schedule(after delay: Duration, _ work: @escaping () -> Void) -> Token {
        nextID += 1
        let token = Token(id: nextID)
        timers.append(Timer(token: token, deadline: .now + delay, work: work))
        return token
    }

    public func cancel(_ token: Token) {
        timers.removeAll { $0.token == token }
    }

    func wake() {
        var one: UInt8 = 1
        _ = write(wakeWrite, &one, 1)
    }

    private func run() {
        var pollSet: [pollfd] = []
        while true {
            let work = lock.withLock { () -> [@Sendable () -> Void] in
                defer { queued.removeAll(keepingCapacity: true) }
                return queued
            }
            for item in work { item() }
            runDueTimers()
            afterRound()
            if lock.withLock({ stopRequested && queued.isEmpty }) { break }

            let sources = pollSources()
            pollSet.removeAll(keepingCapacity: true)
            pollSet.append(pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0))
            for source in sources { pollSet.append(pollfd(fd: source.fd, events: source.events, revents: 0)) }
            let ready = poll(&pollSet, nfds_t(pollSet.count), timeoutMilliseconds())
            if ready < 0 { continue }
            if pollSet[0].revents != 0 {
                var buffer = (UInt64(0), UInt64(0), UInt64(0), UInt64(0))
                while withUnsafeMutableBytes(of: &buffer, { read(wakeRead, $0.baseAddress, $0.count) }) > 0 {}
            }
            for index in sources.indices where pollSet[index + 1].revents != 0 {
                sources[index].handler(pollSet[index + 1].revents)
            }
            afterRound()
        }
        lock.withLock { running = false }
    }

    private func runDueTimers() {
        let now = ContinuousClock.now
        while let index = timers.firstIndex(where: { $0.deadline <= now }) {
            timers.remove(at: index).work()
        }
    }

    /// Extra deadlines (libdbus timeouts) the connection wants honoured.
    var extraDeadline: () -> ContinuousClock.Instant? = { nil }

    private func timeoutMilliseconds() -> Int32 {
        var next = timers.map(\.deadline).min()
        if let extra = extraDeadline() { next = min(next ?? extra, extra) }
        guard let next else { return -1 }
        let remaining = ContinuousClock.now.duration(to: next)
        if remaining <= .zero { return 0 }
        let (seconds, attoseconds) = remaining.components
        // Round up so a timer never fires early and spins the loop.
        return Int32(clamping: seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000)
    }
}
