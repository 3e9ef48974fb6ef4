#if canImport(Glibc)
import Glibc
#endif
import Foundation
import SystemPackage

/// A single-threaded `poll(2)` reactor: every socket, every decoder and the
/// dispatcher run on its thread, so none of them needs a lock. Slow work
/// (bus traffic) is handed to the servo and LCD threads, never done here.
///
/// Anything may call ``execute(_:)`` from any thread; everything else is for
/// the loop's own thread.
public final class EventLoop: @unchecked Sendable {
    /// What a file descriptor is ready for.
    public struct Readiness: OptionSet, Sendable {
        public let rawValue: Int16
        public init(rawValue: Int16) { self.rawValue = rawValue }
        public static let readable = Readiness(rawValue: Int16(POLLIN))
        public static let writable = Readiness(rawValue: Int16(POLLOUT))
        /// Hang-up or error: the handler should read (and see EOF or the error) and close.
        public static let closed = Readiness(rawValue: Int16(POLLHUP | POLLERR | POLLNVAL))
    }

    /// Identifies a registration or a timer.
    public struct Token: Hashable, Sendable { fileprivate let id: UInt64 }

    private struct Registration {
        var fd: Int32
        var interest: Readiness
        var handler: (Readiness) -> Void
    }

    private struct Timer {
        var token: Token
        var deadline: ContinuousClock.Instant
        var work: () -> Void
    }

    /// A self-pipe: writing a byte to `wakeWriteFD` wakes poll(2) from any
    /// thread. (eventfd would do with one descriptor, but Glibc's Swift module
    /// does not export it without _GNU_SOURCE.)
    private let wakeFD: Int32
    private let wakeWriteFD: Int32
    private let queueLock = NSLock()
    private var queued: [@Sendable () -> Void] = []
    private var registrations: [Token: Registration] = [:]
    private var timers: [Timer] = []
    private var nextID: UInt64 = 0
    private var running = false
    private var stopRequested = false
    private var thread: Thread?
    private let finished = DispatchSemaphore(value: 0)
    private var loopThreadID: pthread_t?

    public init() throws {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { throw Sockets.Failure(call: "pipe", errno: Errno(rawValue: errno)) }
        for fd in fds { Sockets.makeNonBlockingCloseOnExec(fd) }
        wakeFD = fds[0]
        wakeWriteFD = fds[1]
    }

    deinit {
        close(wakeFD)
        close(wakeWriteFD)
    }

    /// Starts the loop on a thread of its own, named for `ps -L`.
    public func start(name: String = "blecontrol-io") {
        let thread = Thread { [self] in
            loopThreadID = pthread_self()
            run()
            finished.signal()
        }
        thread.name = name
        self.thread = thread
        queueLock.withLock { running = true }
        thread.start()
    }

    /// Asks the loop to finish after the work already queued, and waits for it.
    public func stop() {
        let wasRunning = queueLock.withLock { () -> Bool in
            defer { stopRequested = true }
            return running
        }
        wake()
        if wasRunning, !isOnLoop { finished.wait() }
    }

    /// True on the loop's own thread.
    public var isOnLoop: Bool {
        guard let id = loopThreadID else { return false }
        return pthread_equal(id, pthread_self()) != 0
    }

    /// Runs `work` on the loop thread, soon. Safe from any thread.
    public func execute(_ work: @escaping @Sendable () -> Void) {
        queueLock.withLock { queued.append(work) }
        wake()
    }

    /// Runs `work` on the loop thread and waits for its result (never call
    /// from the loop thread itself).
    public func submitAndWait<T: Sendable>(_ work: @escaping @Sendable () throws -> T) throws -> T {
        precondition(!isOnLoop, "submitAndWait from the loop thread would deadlock")
        let box = ResultBox<T>()
        let done = DispatchSemaphore(value: 0)
        execute {
            box.result = Result { try work() }
            done.signal()
        }
        done.wait()
        return try box.result!.get()
    }

    // MARK: Loop-thread API

    /// Watches `fd`; `handler` runs on the loop thread with what it is ready for.
    public func register(_ fd: FileDescriptor, interest: Readiness, handler: @escaping (Readiness) -> Void) -> Token {
        let token = makeToken()
        registrations[token] = Registration(fd: fd.rawValue, interest: interest, handler: handler)
        return token
    }

    /// Changes what a registration waits for (e.g. add `.writable` while output is queued).
    public func setInterest(_ token: Token, _ interest: Readiness) {
        registrations[token]?.interest = interest
    }

    /// Stops watching; the caller closes the descriptor.
    public func unregister(_ token: Token) {
        registrations.removeValue(forKey: token)
    }

    /// Runs `work` on the loop thread at `deadline`.
    @discardableResult
    public func schedule(at deadline: ContinuousClock.Instant, _ work: @escaping () -> Void) -> Token {
        let token = makeToken()
        timers.append(Timer(token: token, deadline: deadline, work: work))
        return token
    }

    public func cancelTimer(_ token: Token) {
        timers.removeAll { $0.token == token }
    }

    // MARK: Internals

    private final class ResultBox<T>: @unchecked Sendable { var result: Result<T, any Error>? }

    private func makeToken() -> Token {
        nextID += 1
        return Token(id: nextID)
    }

    private func wake() {
        // A full pipe already guarantees a wake-up, so EAGAIN is fine.
        var one: UInt8 = 1
        _ = write(wakeWriteFD, &one, 1)
    }

    private func drainWake() {
        var buffer = (UInt64(0), UInt64(0), UInt64(0), UInt64(0))
        while withUnsafeMutableBytes(of: &buffer, { read(wakeFD, $0.baseAddress, $0.count) }) > 0 {}
    }

    private func run() {
        var pollSet: [pollfd] = []
        var tokens: [Token] = []
        while true {
            let work = queueLock.withLock { () -> [@Sendable () -> Void] in
                defer { queued.removeAll(keepingCapacity: true) }
                return queued
            }
            for item in work { item() }
            runDueTimers()
            if queueLock.withLock({ stopRequested && queued.isEmpty }) { break }

            pollSet.removeAll(keepingCapacity: true)
            tokens.removeAll(keepingCapacity: true)
            pollSet.append(pollfd(fd: wakeFD, events: Int16(POLLIN), revents: 0))
            for (token, registration) in registrations {
                pollSet.append(pollfd(fd: registration.fd, events: registration.interest.rawValue, revents: 0))
                tokens.append(token)
            }
            let ready = poll(&pollSet, nfds_t(pollSet.count), pollTimeoutMilliseconds())
            if ready < 0 { continue }  // EINTR: go round again
            if pollSet[0].revents != 0 { drainWake() }
            for index in 1..<pollSet.count where pollSet[index].revents != 0 {
                // A handler may have unregistered this or another token meanwhile.
                guard let registration = registrations[tokens[index - 1]] else { continue }
                registration.handler(Readiness(rawValue: pollSet[index].revents))
            }
        }
        queueLock.withLock { running = false }
    }

    private func runDueTimers() {
        let now = ContinuousClock.now
        while let index = timers.firstIndex(where: { $0.deadline <= now }) {
            let timer = timers.remove(at: index)
            timer.work()
        }
    }

    private func pollTimeoutMilliseconds() -> Int32 {
        guard let next = timers.map(\.deadline).min() else { return -1 }
        let remaining = ContinuousClock.now.duration(to: next)
        if remaining <= .zero { return 0 }
        let (seconds, attoseconds) = remaining.components
        // Round up so a timer never fires early and spins the loop.
        let milliseconds = seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
        return Int32(clamping: milliseconds)
    }
}
