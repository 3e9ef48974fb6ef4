/// Generation bookkeeping shared by the servo path and the LCD service: a
/// write with response is acknowledged only once everything submitted before
/// it has reached the hardware (docs/protocol.md, Transport). Not thread-safe; its
/// owner keeps it under its own lock.
struct ApplyTracker {
    typealias Callback = @Sendable (String?) -> Void

    private(set) var submitted: UInt64 = 0
    private(set) var applied: UInt64 = 0
    private var waiters: [(generation: UInt64, callback: Callback)] = []

    /// Counts one submitted change.
    mutating func submit() { submitted += 1 }

    /// Queues `callback` until the current generation is applied; returns
    /// false (and keeps nothing) when everything is applied already.
    mutating func wait(_ callback: @escaping Callback) -> Bool {
        if applied >= submitted { return false }
        waiters.append((submitted, callback))
        return true
    }

    /// Marks everything up to `generation` applied; returns the callbacks to
    /// call (outside the lock) with nil.
    mutating func complete(upTo generation: UInt64) -> [Callback] {
        applied = max(applied, generation)
        return take(upTo: generation)
    }

    /// Everything up to `generation` failed; returns the callbacks to call
    /// with the error.
    mutating func fail(upTo generation: UInt64) -> [Callback] {
        take(upTo: generation)
    }

    private mutating func take(upTo generation: UInt64) -> [Callback] {
        // The common case on the servo thread's hot path: nobody waits, and
        // an empty array costs no allocation.
        if waiters.isEmpty { return [] }
        let ready = waiters.filter { $0.generation <= generation }.map(\.callback)
        waiters.removeAll { $0.generation <= generation }
        return ready
    }
}
