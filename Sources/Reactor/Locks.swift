#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CReactor

/// A pthread mutex, optionally priority-inheriting.
///
/// The servo thread may run SCHED_FIFO while the LCD thread runs at normal
/// priority; where both take the same lock (the I2C bus), a preempted
/// low-priority holder would stall the servo thread for as long as anything
/// else keeps it off the CPU. With `priorityInheritance` the holder runs at
/// the waiter's priority until it unlocks, so the wait is bounded by the
/// holder's critical section (pthread_mutexattr_setprotocol(3)).
public final class Lock: @unchecked Sendable {
    // The pthread objects live at a fixed heap address for the lock's
    // lifetime, which is what makes sharing it between threads sound.
    let mutex: UnsafeMutablePointer<pthread_mutex_t>

    public init(priorityInheritance: Bool = false) {
        mutex = .allocate(capacity: 1)
        let status = creactor_mutex_init(mutex, priorityInheritance ? 1 : 0)
        if status != 0 {
            // PI needs kernel futex support every Linux since 2.6.18 has;
            // fall back to a plain mutex rather than fail.
            precondition(creactor_mutex_init(mutex, 0) == 0, "pthread_mutex_init failed")
        }
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    public func lock() { pthread_mutex_lock(mutex) }
    public func unlock() { pthread_mutex_unlock(mutex) }

    @inlinable
    public func withLock<T>(_ body: () throws -> T) rethrows -> T {
        lock()
        defer { unlock() }
        return try body()
    }
}

/// A mutex with a condition variable whose timed waits run on
/// CLOCK_MONOTONIC: a wall-clock step (a Raspberry Pi has no RTC, and its
/// clock jumps when NTP first syncs) neither stretches nor cuts a wait.
public final class Condition: @unchecked Sendable {
    // The condition variable lives at a fixed heap address, as the mutex
    // inside `mutex` does.
    private let mutex: Lock
    private let condition: UnsafeMutablePointer<pthread_cond_t>

    public init(priorityInheritance: Bool = false) {
        mutex = Lock(priorityInheritance: priorityInheritance)
        condition = .allocate(capacity: 1)
        precondition(creactor_cond_init_monotonic(condition) == 0, "pthread_cond_init failed")
    }

    deinit {
        pthread_cond_destroy(condition)
        condition.deallocate()
    }

    public func lock() { mutex.lock() }
    public func unlock() { mutex.unlock() }

    public func withLock<T>(_ body: () throws -> T) rethrows -> T {
        try mutex.withLock(body)
    }

    /// Waits for a signal (call with the lock held; spurious wake-ups happen).
    public func wait() { pthread_cond_wait(condition, mutex.mutex) }

    /// Waits for a signal or until `deadline` on the continuous clock (call
    /// with the lock held). Returns false when the deadline passed.
    @discardableResult
    public func wait(until deadline: ContinuousClock.Instant) -> Bool {
        let remaining = ContinuousClock.now.duration(to: deadline)
        if remaining <= .zero { return false }
        return creactor_cond_timedwait_relative(condition, mutex.mutex, remaining.nanoseconds) == 0
    }

    /// Waits for a signal or for `timeout` (call with the lock held).
    @discardableResult
    public func wait(timeout: Duration) -> Bool {
        wait(until: .now + timeout)
    }

    public func signal() { pthread_cond_signal(condition) }
    public func broadcast() { pthread_cond_broadcast(condition) }
}

extension Duration {
    /// The duration in whole nanoseconds, saturating.
    public var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        return scaled.addingReportingOverflow(attoseconds / 1_000_000_000).partialValue
    }
}

/// A value handed from one thread to another exactly once: the result of
/// work done on the event loop for a caller that waits (``EventLoop/submitAndWait(_:)``).
public final class Promise<Value: Sendable>: @unchecked Sendable {
    // `value` is read and written only with `condition` locked.
    private let condition = Condition()
    private var value: Value?

    public init() {}

    /// Delivers the value; later calls are ignored.
    public func fulfil(_ newValue: Value) {
        condition.withLock {
            guard value == nil else { return }
            value = newValue
            condition.broadcast()
        }
    }

    /// Waits for the value.
    public func wait() -> Value {
        condition.withLock {
            while value == nil { condition.wait() }
            return value!
        }
    }

    /// Waits for the value or until `deadline`; nil when it did not come.
    public func wait(until deadline: ContinuousClock.Instant) -> Value? {
        condition.withLock {
            while value == nil {
                if !condition.wait(until: deadline) { break }
            }
            return value
        }
    }
}
