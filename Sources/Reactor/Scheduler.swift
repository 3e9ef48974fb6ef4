/// Identifies a timer or an fd registration on a loop.
public struct LoopToken: Hashable, Sendable {
    let id: UInt64
    init(_ id: UInt64) { self.id = id }
}

/// What the firmware's loop-confined parts (sessions, the failsafe watch,
/// the LED pattern, transports) need from a loop: its clock, a way in from
/// other threads, and timers. ``EventLoop`` is the real one (a thread, epoll,
/// the monotonic clock); ``ManualLoop`` runs on virtual time, driven by a
/// test, so timeouts are tested without sleeping.
public protocol Scheduler: AnyObject, Sendable {
    /// The loop's notion of now: the monotonic clock, or a test's virtual time.
    var now: ContinuousClock.Instant { get }
    /// True on the thread that runs the loop's work.
    var inLoop: Bool { get }
    /// Runs `work` on the loop, soon, in submission order. Safe from any thread.
    func execute(_ work: @escaping @Sendable () -> Void)
    /// Runs `work` on the loop at `deadline` (call on the loop).
    @discardableResult
    func schedule(at deadline: ContinuousClock.Instant, _ work: @escaping () -> Void) -> LoopToken
    /// Cancels a timer that has not fired (call on the loop; unknown tokens are ignored).
    func cancel(_ token: LoopToken)
}

extension Scheduler {
    /// Runs `work` on the loop after `delay` (call on the loop).
    @discardableResult
    public func schedule(after delay: Duration, _ work: @escaping () -> Void) -> LoopToken {
        schedule(at: now + delay, work)
    }

    /// Traps when called off the loop: the check behind every loop-confined
    /// type's "use on the loop only" contract.
    @inlinable
    public func assertInLoop(file: StaticString = #fileID, line: UInt = #line) {
        precondition(inLoop, "loop-confined state used off its loop", file: file, line: line)
    }
}

/// A min-heap of timers ordered by deadline, then by scheduling order (two
/// timers due at the same instant run in the order they were scheduled).
/// Cancelled timers are dropped lazily, and compacted away when they
/// outnumber the live ones, so cancel is O(1) and memory stays bounded.
struct TimerHeap {
    private struct Entry {
        var deadline: ContinuousClock.Instant
        var id: UInt64
    }

    private var heap: [Entry] = []
    private var work: [UInt64: () -> Void] = [:]

    var isEmpty: Bool { work.isEmpty }
    var count: Int { work.count }

    mutating func insert(id: UInt64, deadline: ContinuousClock.Instant, _ body: @escaping () -> Void) {
        work[id] = body
        heap.append(Entry(deadline: deadline, id: id))
        siftUp(heap.count - 1)
    }

    mutating func cancel(id: UInt64) {
        guard work.removeValue(forKey: id) != nil else { return }
        if heap.count > 64 && heap.count > 2 * work.count { compact() }
    }

    /// The earliest live deadline.
    mutating func nextDeadline() -> ContinuousClock.Instant? {
        dropCancelledTop()
        return heap.first?.deadline
    }

    /// Removes and returns the earliest live timer if it is due at `now`.
    mutating func popDue(at now: ContinuousClock.Instant) -> (() -> Void)? {
        dropCancelledTop()
        guard let top = heap.first, top.deadline <= now else { return nil }
        removeTop()
        return work.removeValue(forKey: top.id)
    }

    private mutating func dropCancelledTop() {
        while let top = heap.first, work[top.id] == nil { removeTop() }
    }

    private mutating func removeTop() {
        let last = heap.removeLast()
        if !heap.isEmpty {
            heap[0] = last
            siftDown(0)
        }
    }

    private mutating func compact() {
        heap.removeAll { work[$0.id] == nil }
        // Rebuild the heap bottom-up.
        var index = heap.count / 2
        while index > 0 {
            index -= 1
            siftDown(index)
        }
    }

    private static func less(_ a: Entry, _ b: Entry) -> Bool {
        a.deadline < b.deadline || (a.deadline == b.deadline && a.id < b.id)
    }

    private mutating func siftUp(_ start: Int) {
        var child = start
        while child > 0 {
            let parent = (child - 1) / 2
            guard Self.less(heap[child], heap[parent]) else { return }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    private mutating func siftDown(_ start: Int) {
        var parent = start
        while true {
            let left = 2 * parent + 1
            guard left < heap.count else { return }
            var smallest = left
            if left + 1 < heap.count, Self.less(heap[left + 1], heap[left]) { smallest = left + 1 }
            guard Self.less(heap[smallest], heap[parent]) else { return }
            heap.swapAt(smallest, parent)
            parent = smallest
        }
    }
}
