import Foundation
import Hardware

/// The one owner of an I2C bus shared by the servo driver and the LCD.
///
/// Each transaction takes the bus whole. When the bus frees up, a waiting
/// servo transaction always goes before a waiting LCD one, and the LCD
/// driver's transactions are chunked (a few characters each), so a servo
/// flush waits behind at most one LCD chunk.
public final class BusArbiter: @unchecked Sendable {
    /// Who is asking for the bus.
    public enum Priority: Sendable {
        /// Servo and ESC pulses: latency matters.
        case servo
        /// Display traffic: may wait.
        case display
    }

    public let bus: any I2CBus
    private let condition = NSCondition()
    private var busy = false
    private var holder: Priority?
    private var servoWaiting = 0
    private var displayCompletions = 0
    private var maxDisplayWaited = 0
    private var servoWaits = LatencyHistogram()

    /// What the servo side has had to wait for so far.
    public struct Statistics: Sendable {
        /// The most display transactions one servo transaction waited behind
        /// (the design promises at most one).
        public var maxDisplayTransactionsWaited: Int
        /// The longest a servo transaction waited for the bus, in µs.
        public var maxServoWaitMicroseconds: Int
    }

    public var statistics: Statistics {
        condition.withLock { Statistics(maxDisplayTransactionsWaited: maxDisplayWaited, maxServoWaitMicroseconds: servoWaits.maximumMicroseconds) }
    }

    public init(bus: any I2CBus) {
        self.bus = bus
    }

    /// An `I2CBus` whose transactions go through this arbiter at `priority`;
    /// hand it to a driver as its bus.
    public func client(_ priority: Priority) -> any I2CBus {
        Client(arbiter: self, priority: priority)
    }

    fileprivate func transfer(_ messages: [I2CMessage], at address: I2CAddress, priority: Priority) throws -> [[UInt8]] {
        acquire(priority)
        defer { release() }
        return try bus.transfer(messages, at: address)
    }

    private func acquire(_ priority: Priority) {
        condition.lock()
        defer { condition.unlock() }
        switch priority {
        case .servo:
            servoWaiting += 1
            let before = displayCompletions
            if busy {
                let start = ContinuousClock.now
                while busy { condition.wait() }
                servoWaits.record(start.duration(to: .now))
            }
            maxDisplayWaited = max(maxDisplayWaited, displayCompletions - before)
            servoWaiting -= 1
        case .display:
            while busy || servoWaiting > 0 { condition.wait() }
        }
        busy = true
        holder = priority
    }

    private func release() {
        condition.lock()
        if holder == .display { displayCompletions += 1 }
        holder = nil
        busy = false
        condition.broadcast()
        condition.unlock()
    }

    private final class Client: I2CBus, @unchecked Sendable {
        let arbiter: BusArbiter
        let priority: Priority
        init(arbiter: BusArbiter, priority: Priority) {
            self.arbiter = arbiter
            self.priority = priority
        }
        var maxWriteLength: Int? { arbiter.bus.maxWriteLength }
        func transfer(_ messages: [I2CMessage], at address: I2CAddress) throws -> [[UInt8]] {
            try arbiter.transfer(messages, at: address, priority: priority)
        }
    }
}
