import Hardware
import Synchronization

/// An in-process output line (the simulator's status LED): records its
/// level and how often it changed, and can be made to fail.
public final class EmulatedDigitalOutput: DigitalOutput, Sendable {
    /// The name used in errors, like a GPIO line name.
    public let name: String

    private struct State {
        var level = false
        var changes = 0
        var writes = 0
        var failuresLeft = 0
        var failing = false
    }
    private let state = Mutex(State())

    /// - Parameter name: names the line in errors.
    public init(name: String = "emulated-led") {
        self.name = name
    }

    /// The line's level: `true` when driven active. Starts inactive.
    public var isActive: Bool { state.withLock { $0.level } }

    /// Level changes since creation (writes of the level it already had do
    /// not count).
    public var transitions: Int { state.withLock { $0.changes } }

    /// Successful writes since creation, changing the level or not.
    public var writeCount: Int { state.withLock { $0.writes } }

    /// Makes the next `count` writes throw without changing the level.
    public func failNextWrites(_ count: Int) {
        state.withLock { $0.failuresLeft = max(count, 0) }
    }

    /// Makes every write throw until called with `false`.
    public func setFailing(_ on: Bool) {
        state.withLock { $0.failing = on }
    }

    public func set(_ active: Bool) throws {
        let failed = state.withLock { line -> Bool in
            if line.failing || line.failuresLeft > 0 {
                if line.failuresLeft > 0 { line.failuresLeft -= 1 }
                return true
            }
            line.writes += 1
            if line.level != active {
                line.level = active
                line.changes += 1
            }
            return false
        }
        if failed { throw DigitalOutputError(line: name, context: "set \(active ? "active" : "inactive"): injected failure") }
    }
}
