#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CReactor
import Synchronization

/// The one reactor: an epoll loop on a thread of its own, with descriptor
/// registrations (interest sets), timers on a monotonic deadline heap and
/// cross-thread ``execute(_:)``.
///
/// The firmware's I/O (TCP, the control socket, acquired BLE sockets, a
/// serial line, signals) runs on one instance; the D-Bus connection on
/// another, so bus traffic never delays a central's frames. Everything a
/// handler touches belongs to the loop's thread, so none of it needs a lock;
/// slow work (bus transfers) is handed to the servo and LCD threads.
///
/// Registrations are level-triggered: a handler that leaves data unread is
/// called again on the next round, after every other ready descriptor had
/// its turn. That is what keeps one flooding peer from starving the others:
/// each connection reads a bounded amount per round (``StreamConnection``).
public final class EventLoop: Scheduler, @unchecked Sendable {
    // Confinement: `queued` and `stopRequested` are guarded by `queueLock`;
    // `loopThread` is atomic; everything else is touched only on the loop's
    // thread (checked with `assertInLoop`), which is what makes the
    // unchecked Sendable sound.

    /// What a registration waits for.
    public struct Interest: OptionSet, Sendable, Hashable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        public static let readable = Interest(rawValue: 1)
        public static let writable = Interest(rawValue: 2)
        public static let none: Interest = []

        var epollEvents: UInt32 {
            var events: UInt32 = 0
            if contains(.readable) { events |= UInt32(truncatingIfNeeded: CREACTOR_EPOLLIN) | UInt32(truncatingIfNeeded: CREACTOR_EPOLLRDHUP) }
            if contains(.writable) { events |= UInt32(truncatingIfNeeded: CREACTOR_EPOLLOUT) }
            return events
        }
    }

    /// What a descriptor is ready for.
    public struct Readiness: OptionSet, Sendable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        public static let readable = Readiness(rawValue: 1)
        public static let writable = Readiness(rawValue: 2)
        /// Hang-up or error: read (to see EOF or the error) and close.
        public static let closed = Readiness(rawValue: 4)

        init(epollEvents events: UInt32) {
            var readiness: Readiness = []
            if events & UInt32(truncatingIfNeeded: CREACTOR_EPOLLIN) != 0 { readiness.insert(.readable) }
            if events & UInt32(truncatingIfNeeded: CREACTOR_EPOLLOUT) != 0 { readiness.insert(.writable) }
            let closedBits = UInt32(truncatingIfNeeded: CREACTOR_EPOLLHUP) | UInt32(truncatingIfNeeded: CREACTOR_EPOLLERR) | UInt32(truncatingIfNeeded: CREACTOR_EPOLLRDHUP)
            if events & closedBits != 0 { readiness.insert(.closed) }
            self = readiness
        }
    }

    /// A registration or timer call failed.
    public struct Failure: Error, CustomStringConvertible {
        public var call: String
        public var errno: Int32
        public var description: String { "\(call): \(String(cString: strerror(errno)))" }
    }

    private struct Registration {
        var fd: CInt
        var interest: Interest
        var handler: (Readiness) -> Void
    }

    public let name: String
    private let epollFD: CInt
    private let wakeFD: CInt
    private let queueLock = Lock()
    /// Work from `execute`, and the batch the loop runs (swapped, so that
    /// neither is reallocated once both have grown: `execute` from the
    /// servo thread allocates nothing). Each closure sits in a `Job`: an
    /// array of bare closures would wrap each one on the way in (a
    /// reabstraction thunk, 32 bytes of heap per call).
    private var queued: [Job] = []
    private var running: [Job] = []
    private struct Job { let work: @Sendable () -> Void }
    private var stopRequested = false
    private let loopThread = Atomic<UInt>(0)
    private var thread: OSThread?

    private var registrations: [UInt64: Registration] = [:]
    /// Registrations per descriptor: libdbus watches one socket twice (read
    /// and write), and epoll takes a descriptor once.
    private var descriptors: [CInt: [UInt64]] = [:]
    private var armed: [CInt: UInt32] = [:]
    private var timers = TimerHeap()
    /// Timers with leeway (``schedule(at:leeway:_:)``): few, so a dictionary.
    private var lenient: [UInt64: (deadline: ContinuousClock.Instant, latest: ContinuousClock.Instant, work: () -> Void)] = [:]
    private var nextID: UInt64 = 0
    private let stackSize: Int
    /// epoll_wait returns: the loop thread's wake-ups, for the idle benchmark.
    public private(set) var wakeups: UInt64 = 0

    /// The stack of a loop's thread. Measured (issue #29) as the resident
    /// part of each thread's 8 MiB default stack after the daemon served
    /// everything a board does for a minute (the demo app's traffic at 500
    /// frames/s, LCD text, bad frames, status requests, MQTT messages,
    /// reloads that restart BLE): the I/O loop's high-water mark was 32 KiB
    /// in a release build and 36 KiB in a debug one, thread-local storage
    /// included; the D-Bus loop's 20 KiB. The deepest input the loops parse
    /// is bounded (JSON 64 levels, the board file's YAML 32, D-Bus 64), and
    /// ReactorTests parses each at its limit on a thread of this size.
    /// 256 KiB: seven times the worst measured.
    public static let stackSize = 256 * 1024

    /// - Parameter name: the thread's name (15 bytes show in `ps -L`).
    /// - Parameter stackSize: its stack, in bytes (``OSThread``).
    public init(name: String, stackSize: Int = EventLoop.stackSize) throws {
        self.name = name
        self.stackSize = stackSize
        // Room for a burst from the start: a thread that calls `execute`
        // (the servo thread) does not grow the queue itself.
        queued.reserveCapacity(64)
        running.reserveCapacity(64)
        epollFD = creactor_epoll_create()
        guard epollFD >= 0 else { throw Failure(call: "epoll_create1", errno: errno) }
        wakeFD = creactor_eventfd()
        guard wakeFD >= 0 else {
            let code = errno
            close(epollFD)
            throw Failure(call: "eventfd", errno: code)
        }
        // Token 0 is the wake-up descriptor; registrations start at 1.
        guard creactor_epoll_ctl(epollFD, 1, wakeFD, UInt32(truncatingIfNeeded: CREACTOR_EPOLLIN), 0) == 0 else {
            let code = errno
            close(wakeFD)
            close(epollFD)
            throw Failure(call: "epoll_ctl(eventfd)", errno: code)
        }
    }

    deinit {
        close(wakeFD)
        close(epollFD)
    }

    // MARK: Any thread

    public var now: ContinuousClock.Instant { .now }

    public var inLoop: Bool {
        let current = UInt(pthread_self())
        return loopThread.load(ordering: .acquiring) == current
    }

    /// Starts the loop on a thread of its own.
    public func start() {
        let thread = OSThread(name: name, stackSize: stackSize)
        self.thread = thread
        thread.start { [self] in run() }
    }

    /// Finishes the work already queued, ends the loop and waits for its
    /// thread (unless called on it). Idempotent.
    public func stop() {
        queueLock.withLock { stopRequested = true }
        wake()
        if !inLoop {
            thread?.join()
            thread = nil
        }
    }

    public func execute(_ work: @escaping @Sendable () -> Void) {
        queueLock.withLock { queued.append(Job(work: work)) }
        wake()
    }

    /// Runs `work` on the loop and waits for its result (never call it from
    /// the loop itself: it would wait for itself).
    public func submitAndWait<T: Sendable>(_ work: @escaping @Sendable () throws -> T) throws -> T {
        precondition(!inLoop, "submitAndWait from the loop thread would deadlock")
        let promise = Promise<Result<T, any Error>>()
        execute { promise.fulfil(Result { try work() }) }
        return try promise.wait().get()
    }

    // MARK: Loop thread

    public func schedule(at deadline: ContinuousClock.Instant, _ work: @escaping () -> Void) -> LoopToken {
        assertInLoop()
        nextID += 1
        timers.insert(id: nextID, deadline: deadline, work)
        return LoopToken(nextID)
    }

    /// Runs `work` on the loop at the first turn at or after `deadline`,
    /// and the loop sleeps past `deadline` for up to `leeway` waiting for
    /// another reason to wake (a descriptor, an `execute`, a timer without
    /// leeway): housekeeping that can wait rides on the wake-ups the loop
    /// makes anyway, instead of adding its own. An idle board's loop wakes
    /// for its LED's pattern; a status check or a keepalive tick due
    /// meanwhile runs then (issue #29). For a few such timers: each turn
    /// looks at all of them. Cancel it with ``cancel(_:)`` (call on the loop).
    @discardableResult
    public func schedule(at deadline: ContinuousClock.Instant, leeway: Duration, _ work: @escaping () -> Void) -> LoopToken {
        guard leeway > .zero else { return schedule(at: deadline, work) }
        assertInLoop()
        nextID += 1
        lenient[nextID] = (deadline, deadline + leeway, work)
        return LoopToken(nextID)
    }

    /// ``schedule(at:leeway:_:)`` after `delay`.
    @discardableResult
    public func schedule(after delay: Duration, leeway: Duration, _ work: @escaping () -> Void) -> LoopToken {
        schedule(at: now + delay, leeway: leeway, work)
    }

    public func cancel(_ token: LoopToken) {
        assertInLoop()
        timers.cancel(id: token.id)
        lenient.removeValue(forKey: token.id)
    }

    /// Watches `fd`; `handler` runs on the loop with what it is ready for.
    /// A descriptor may carry several registrations (each with its own
    /// interest). The caller closes the descriptor after ``unregister(_:)``.
    public func register(_ fd: CInt, interest: Interest, handler: @escaping (Readiness) -> Void) throws -> LoopToken {
        assertInLoop()
        nextID += 1
        registrations[nextID] = Registration(fd: fd, interest: interest, handler: handler)
        descriptors[fd, default: []].append(nextID)
        do {
            try rearm(fd)
        } catch {
            registrations.removeValue(forKey: nextID)
            descriptors[fd]?.removeAll { $0 == nextID }
            if descriptors[fd]?.isEmpty == true { descriptors.removeValue(forKey: fd) }
            throw error
        }
        return LoopToken(nextID)
    }

    /// Changes what a registration waits for (add `.writable` while output
    /// is queued; `.none` pauses it, as `accept` does when descriptors run out).
    public func setInterest(_ token: LoopToken, _ interest: Interest) {
        assertInLoop()
        guard let registration = registrations[token.id], registration.interest != interest else { return }
        registrations[token.id]?.interest = interest
        try? rearm(registration.fd)  // MOD/DEL on a registered descriptor cannot fail but for a closed fd
    }

    /// Stops watching (before the caller closes the descriptor).
    public func unregister(_ token: LoopToken) {
        assertInLoop()
        guard let registration = registrations.removeValue(forKey: token.id) else { return }
        descriptors[registration.fd]?.removeAll { $0 == token.id }
        if descriptors[registration.fd]?.isEmpty == true { descriptors.removeValue(forKey: registration.fd) }
        try? rearm(registration.fd)
    }

    /// Number of live registrations and timers (status, tests).
    public var load: (registrations: Int, timers: Int) {
        assertInLoop()
        return (registrations.count, timers.count + lenient.count)
    }

    // MARK: Internals

    private func rearm(_ fd: CInt) throws {
        var events: UInt32 = 0
        for id in descriptors[fd] ?? [] {
            if let registration = registrations[id] { events |= registration.interest.epollEvents }
        }
        let current = armed[fd]
        let status: CInt
        let call: String
        switch (current, events) {
        case (nil, 0):
            return
        case (nil, _):
            (status, call) = (creactor_epoll_ctl(epollFD, 1, fd, events, UInt64(fd)), "epoll_ctl ADD")
        case (_?, 0):
            armed.removeValue(forKey: fd)
            _ = creactor_epoll_ctl(epollFD, 2, fd, 0, 0)
            return
        case (let before?, _):
            guard before != events else { return }
            (status, call) = (creactor_epoll_ctl(epollFD, 3, fd, events, UInt64(fd)), "epoll_ctl MOD")
        }
        guard status == 0 else { throw Failure(call: "\(call) fd \(fd)", errno: errno) }
        armed[fd] = events
    }

    private func wake() {
        var one: UInt64 = 1
        // A full counter already guarantees a wake-up, so EAGAIN is fine.
        _ = withUnsafeBytes(of: &one) { write(wakeFD, $0.baseAddress, 8) }
    }

    private func drainWake() {
        var value: UInt64 = 0
        _ = withUnsafeMutableBytes(of: &value) { read(wakeFD, $0.baseAddress, 8) }
    }

    private func run() {
        loopThread.store(UInt(pthread_self()), ordering: .releasing)
        defer { loopThread.store(0, ordering: .releasing) }
        var events = [creactor_event](repeating: creactor_event(), count: 64)
        while true {
            queueLock.withLock { swap(&queued, &running) }
            for job in running { job.work() }
            running.removeAll(keepingCapacity: true)
            runDueTimers()
            if queueLock.withLock({ stopRequested && queued.isEmpty }) { break }

            let count = events.withUnsafeMutableBufferPointer { buffer in
                creactor_epoll_wait(epollFD, buffer.baseAddress, Int32(buffer.count), timeoutMilliseconds())
            }
            wakeups &+= 1
            guard count > 0 else { continue }  // timeout, or EINTR: go round again
            for index in 0..<Int(count) {
                let event = events[index]
                guard event.data != 0 else {
                    drainWake()
                    continue
                }
                dispatch(fd: CInt(truncatingIfNeeded: event.data), readiness: Readiness(epollEvents: event.events))
            }
        }
    }

    private func dispatch(fd: CInt, readiness: Readiness) {
        guard let ids = descriptors[fd] else { return }
        for id in ids {
            // An earlier handler this round may have unregistered this one.
            guard let registration = registrations[id] else { continue }
            var relevant = readiness.intersection(.closed)
            if registration.interest.contains(.readable) { relevant.formUnion(readiness.intersection(.readable)) }
            if registration.interest.contains(.writable) { relevant.formUnion(readiness.intersection(.writable)) }
            if !relevant.isEmpty { registration.handler(relevant) }
        }
    }

    private func runDueTimers() {
        let now = ContinuousClock.now
        while let work = timers.popDue(at: now) { work() }
        // Allocation-free unless one is due: this runs every turn.
        guard lenient.values.contains(where: { $0.deadline <= now }) else { return }
        let due = lenient.filter { $0.value.deadline <= now }.sorted { ($0.value.deadline, $0.key) < ($1.value.deadline, $1.key) }
        for (id, _) in due {
            // An earlier one may have cancelled it.
            lenient.removeValue(forKey: id)?.work()
        }
    }

    private func timeoutMilliseconds() -> Int32 {
        var wake = timers.nextDeadline()
        for timer in lenient.values where wake.map({ timer.latest < $0 }) ?? true { wake = timer.latest }
        guard let next = wake else { return -1 }
        let remaining = ContinuousClock.now.duration(to: next).nanoseconds
        if remaining <= 0 { return 0 }
        // Round up so a timer never fires early and spins the loop.
        return Int32(clamping: (remaining + 999_999) / 1_000_000)
    }
}

/// A loop on virtual time for tests, in the spirit of swift-nio's
/// `EmbeddedEventLoop`: nothing runs until the test calls ``run()`` or
/// ``advance(by:)``, timers fire in deadline order at their own virtual
/// instants, and no thread sleeps. The test's thread is the loop's thread.
public final class ManualLoop: Scheduler, @unchecked Sendable {
    // Every field is guarded by `lock`; work runs outside it.
    private let lock = Lock()
    private var current: ContinuousClock.Instant
    private var queued: [@Sendable () -> Void] = []
    private var timers = TimerHeap()
    private var nextID: UInt64 = 0

    /// Starts at `start` (default: the real now, so instants mix with the
    /// ones code under test takes for granted).
    public init(start: ContinuousClock.Instant = .now) { current = start }

    public var now: ContinuousClock.Instant { lock.withLock { current } }
    /// The test's thread drives the loop, so every caller counts as on it.
    public var inLoop: Bool { true }

    public func execute(_ work: @escaping @Sendable () -> Void) {
        lock.withLock { queued.append(work) }
    }

    public func schedule(at deadline: ContinuousClock.Instant, _ work: @escaping () -> Void) -> LoopToken {
        lock.withLock {
            nextID += 1
            timers.insert(id: nextID, deadline: deadline, work)
            return LoopToken(nextID)
        }
    }

    public func cancel(_ token: LoopToken) {
        lock.withLock { timers.cancel(id: token.id) }
    }

    /// Timers not fired yet.
    public var pendingTimers: Int { lock.withLock { timers.count } }

    /// Runs queued work and every timer due now, until none is left.
    public func run() {
        while true {
            let work = lock.withLock { () -> [@Sendable () -> Void] in
                defer { queued.removeAll() }
                return queued
            }
            for item in work { item() }
            guard let timer = lock.withLock({ timers.popDue(at: current) }) else {
                if lock.withLock({ queued.isEmpty }) { return }
                continue
            }
            timer()
        }
    }

    /// Moves virtual time to `target` without running anything, as a loop
    /// the host did not schedule (a paused VM, SIGSTOP): timers due
    /// meanwhile fire late, at `target`, on the next ``run()`` or advance.
    public func pause(until target: ContinuousClock.Instant) {
        lock.withLock { current = max(current, target) }
    }

    /// Moves virtual time forward by `duration`, firing each timer at its
    /// own deadline on the way.
    public func advance(by duration: Duration) {
        advance(to: now + duration)
    }

    /// Moves virtual time to `target` (never backwards), timer by timer.
    public func advance(to target: ContinuousClock.Instant) {
        run()
        while let next = lock.withLock({ timers.nextDeadline() }), next <= target {
            lock.withLock { current = max(current, next) }
            run()
        }
        lock.withLock { current = max(current, target) }
        run()
    }
}
