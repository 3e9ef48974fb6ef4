#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CReactor

/// A joinable OS thread with a name (visible in `ps -L` and `top -H`).
///
/// The daemon's threads are few and long-lived: the I/O loop, the D-Bus
/// loop, the servo thread and the LCD thread. Each is a plain pthread so
/// its scheduling (SCHED_FIFO for the servo thread) is the kernel's, with no
/// runtime in between.
public final class OSThread: @unchecked Sendable {
    // `handle` is written once by `start` (before any other thread can see
    // this object through it) and read by `join` from the starting thread.
    private var handle: pthread_t?
    public let name: String

    private final class Body {
        let name: String
        let run: @Sendable () -> Void
        init(name: String, run: @escaping @Sendable () -> Void) {
            self.name = name
            self.run = run
        }
    }

    public init(name: String) { self.name = name }

    /// Starts `body` on the new thread.
    public func start(_ body: @escaping @Sendable () -> Void) {
        precondition(handle == nil, "thread \(name) started twice")
        let context = Unmanaged.passRetained(Body(name: name, run: body)).toOpaque()
        var thread = pthread_t()
        let status = pthread_create(&thread, nil, { raw in
            let body = Unmanaged<Body>.fromOpaque(raw!).takeRetainedValue()
            creactor_set_thread_name(body.name)
            body.run()
            return nil
        }, context)
        precondition(status == 0, "pthread_create \(name): \(String(cString: strerror(status)))")
        handle = thread
    }

    /// Waits for the thread to finish (once; later calls return at once).
    public func join() {
        guard let thread = handle else { return }
        handle = nil
        pthread_join(thread, nil)
    }
}

/// The dedicated thread of a device service (servo path, LCD) and the
/// condition that guards the service's state: started once, asked to stop
/// through the condition, joined on stop. Keeps the start/stop/join dance in
/// one place.
public final class ServiceThread: @unchecked Sendable {
    // `stopping` is read and written with `condition` locked; `thread` only
    // by the owner's start/stop, which are called from one thread.
    public let condition: Condition
    private let name: String
    private var thread: OSThread?
    private var stopping = false

    /// - Parameter priorityInheritance: the service's lock boosts a holder
    ///   to a waiter's priority (the servo path's lock, which the event loop
    ///   and the real-time servo thread share).
    public init(name: String, priorityInheritance: Bool = false) {
        self.name = name
        condition = Condition(priorityInheritance: priorityInheritance)
    }

    /// True once stop was requested. Read it with the condition locked.
    public var isStopping: Bool { stopping }

    /// Runs `body` on a new thread.
    public func start(_ body: @escaping @Sendable () -> Void) {
        let thread = OSThread(name: name)
        self.thread = thread
        thread.start(body)
    }

    /// Requests the stop, wakes the service and waits for its thread to end.
    /// Idempotent.
    public func stop() {
        condition.withLock {
            stopping = true
            condition.broadcast()
        }
        thread?.join()
        thread = nil
    }
}

/// Sleeps the calling thread for `duration` (nanosleep, restarted after a
/// signal for the time left). For drivers' datasheet delays and tests.
public func sleepThread(_ duration: Duration) {
    var remaining = duration.nanoseconds
    guard remaining > 0 else { return }
    var request = timespec(tv_sec: Int(remaining / 1_000_000_000), tv_nsec: Int(remaining % 1_000_000_000))
    var left = timespec()
    while nanosleep(&request, &left) != 0 && errno == EINTR {
        request = left
        remaining = Int64(left.tv_sec) * 1_000_000_000 + Int64(left.tv_nsec)
        if remaining <= 0 { break }
    }
}
