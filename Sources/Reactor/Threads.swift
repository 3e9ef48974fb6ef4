#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CReactor

/// A joinable OS thread with a name (visible in `ps -L` and `top -H`) and
/// a stack of an explicit size.
///
/// The daemon's threads are few and long-lived: the I/O loop, the D-Bus
/// loop, the servo thread and the LCD thread. Each is a plain pthread so
/// its scheduling (SCHED_FIFO for the servo thread) is the kernel's, with no
/// runtime in between.
///
/// Without a size, glibc gives every thread a stack as large as the stack
/// rlimit (8 MiB on Debian): harmless while only the pages a thread touches
/// are resident, but `mlockall` (a board's `realtime.lock_memory`) locks
/// every page of every mapping, so each thread cost 8 MiB of RAM a Pi Zero
/// 2 W does not have (issue #29). Every thread here states its size; the
/// owners' constants (``EventLoop/stackSize``, the servo path's, the LCD
/// service's) say what they measured.
public final class OSThread: @unchecked Sendable {
    // `handle` is written once by `start` (before any other thread can see
    // this object through it) and read by `join` from the starting thread.
    private var handle: pthread_t?
    public let name: String
    /// The stack size asked for, in bytes (see ``init(name:stackSize:)``).
    public let stackSize: Int

    /// The size threads get when their maker names none: tests' helper
    /// threads. Four times the event loop's, which already has a wide margin.
    public static let defaultStackSize = 1024 * 1024

    private final class Body {
        let name: String
        let run: @Sendable () -> Void
        init(name: String, run: @escaping @Sendable () -> Void) {
            self.name = name
            self.run = run
        }
    }

    /// - Parameter stackSize: bytes of stack, thread-local storage included.
    ///   Raised to the system's minimum (PTHREAD_STACK_MIN: 16 KiB on
    ///   x86_64, 128 KiB on aarch64) and to whole pages; multiplied by 4 in
    ///   a build with AddressSanitizer or ThreadSanitizer, whose frames are
    ///   several times larger (scripts/sanitize).
    public init(name: String, stackSize: Int = OSThread.defaultStackSize) {
        precondition(stackSize > 0, "thread \(name): a stack size must be positive")
        self.name = name
        self.stackSize = stackSize
    }

    /// Starts `body` on the new thread. A `detached` thread cleans up after
    /// itself when `body` returns (``join()`` then does nothing): for a
    /// thread nobody waits for, whose stack would otherwise stay mapped
    /// until a join that never comes.
    public func start(detached: Bool = false, _ body: @escaping @Sendable () -> Void) {
        precondition(handle == nil, "thread \(name) started twice")
        let context = Unmanaged.passRetained(Body(name: name, run: body)).toOpaque()
        var thread = pthread_t()
        let status = creactor_thread_create(&thread, stackSize, detached ? 1 : 0, { raw in
            let body = Unmanaged<Body>.fromOpaque(raw!).takeRetainedValue()
            creactor_set_thread_name(body.name)
            body.run()
            return nil
        }, context)
        precondition(status == 0, "pthread_create \(name): \(String(cString: strerror(status)))")
        if !detached { handle = thread }
    }

    /// Waits for the thread to finish (once; later calls return at once).
    public func join() {
        guard let thread = handle else { return }
        handle = nil
        pthread_join(thread, nil)
    }

    /// The calling thread's stack, as the C library set it up: its lowest
    /// address and its size in bytes (nil for a thread whose stack the
    /// library cannot tell).
    public static var currentStack: (base: UnsafeMutableRawPointer, size: Int)? {
        var base: UnsafeMutableRawPointer?
        var size = 0
        guard creactor_current_stack(&base, &size) == 0, let base else { return nil }
        return (base, size)
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

    private let stackSize: Int

    /// - Parameter stackSize: the thread's stack, in bytes (``OSThread``).
    /// - Parameter priorityInheritance: the service's lock boosts a holder
    ///   to a waiter's priority (the servo path's lock, which the event loop
    ///   and the real-time servo thread share).
    public init(name: String, stackSize: Int, priorityInheritance: Bool = false) {
        self.name = name
        self.stackSize = stackSize
        condition = Condition(priorityInheritance: priorityInheritance)
    }

    /// True once stop was requested. Read it with the condition locked.
    public var isStopping: Bool { stopping }

    /// Runs `body` on a new thread.
    public func start(_ body: @escaping @Sendable () -> Void) {
        let thread = OSThread(name: name, stackSize: stackSize)
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

/// What the kernel counted of a thread's time: for telling a thread the
/// host did not run from one blocked in a system call.
public enum ThreadTime {
    /// The calling thread's kernel id (gettid(2)).
    public static func currentID() -> Int32 { creactor_gettid() }

    /// How long thread `id` of this process has been on a CPU or waiting in
    /// a run queue for one, in all: the first two fields of
    /// `/proc/self/task/ID/schedstat`, in nanoseconds (the kernel's
    /// CONFIG_SCHED_INFO, on in Debian's and Raspberry Pi OS's kernels). A
    /// thread asleep in the kernel (an I2C transfer waiting for its adapter)
    /// adds to neither; nil when the file cannot be read.
    public static func runnable(thread id: Int32) -> Duration? {
        let fd = open("/proc/self/task/\(id)/schedstat", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        // "ON_CPU_NS WAITING_NS TIMESLICES\n": at most three 20-digit numbers.
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 80) { buffer -> Duration? in
            let count = read(fd, buffer.baseAddress, buffer.count)
            guard count > 0 else { return nil }
            var fields: [Int64] = []
            var value: Int64 = 0
            var digits = 0
            for byte in buffer[..<count] {
                if byte >= 0x30, byte <= 0x39, digits < 19 {
                    value = value * 10 + Int64(byte - 0x30)
                    digits += 1
                } else if digits > 0 {
                    fields.append(value)
                    value = 0
                    digits = 0
                    if fields.count == 2 { break }
                }
            }
            guard fields.count == 2 else { return nil }
            return .nanoseconds(fields[0]) + .nanoseconds(fields[1])
        }
    }
}
