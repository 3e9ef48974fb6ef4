import Reactor
import Hardware

/// An in-process output line (the simulator's status LED): records its
/// level and how often it changed, and can be made to fail.
public final class EmulatedDigitalOutput: DigitalOutput, @unchecked Sendable {
    /// The name used in errors, like a GPIO line name.
    public let name: String

    private let lock = Lock()
    private var level = false
    private var changes = 0
    private var writes = 0
    private var failuresLeft = 0
    private var failing = false

    /// - Parameter name: names the line in errors.
    public init(name: String = "emulated-led") {
        self.name = name
    }

    /// The line's level: `true` when driven active. Starts inactive.
    public var isActive: Bool { lock.withLock { level } }

    /// Level changes since creation (writes of the level it already had do
    /// not count).
    public var transitions: Int { lock.withLock { changes } }

    /// Successful writes since creation, changing the level or not.
    public var writeCount: Int { lock.withLock { writes } }

    /// Makes the next `count` writes throw without changing the level.
    public func failNextWrites(_ count: Int) {
        lock.withLock { failuresLeft = max(count, 0) }
    }

    /// Makes every write throw until called with `false`.
    public func setFailing(_ on: Bool) {
        lock.withLock { failing = on }
    }

    public func set(_ active: Bool) throws {
        try lock.withLock {
            if failing || failuresLeft > 0 {
                if failuresLeft > 0 { failuresLeft -= 1 }
                throw DigitalOutputError(line: name, context: "set \(active ? "active" : "inactive"): injected failure")
            }
            writes += 1
            if level != active {
                level = active
                changes += 1
            }
        }
    }
}
