import Reactor

/// A value that the test's thread and the threads it starts (a spinner, a
/// completion handler, a flood of frames) read and write: every access
/// under one lock, so a test or a benchmark needs no box of its own.
public final class LockedBox<Value>: @unchecked Sendable {
    private let lock = Lock()
    private var stored: Value

    public init(_ value: Value) { stored = value }

    /// The value as it is now.
    public var value: Value {
        get { lock.withLock { stored } }
        set { lock.withLock { stored = newValue } }
    }

    /// Puts `newValue` in and gives back what was there, in one step.
    public func swap(_ newValue: Value) -> Value {
        lock.withLock {
            defer { stored = newValue }
            return stored
        }
    }
}
