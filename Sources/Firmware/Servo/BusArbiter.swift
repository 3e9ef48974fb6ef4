import Hardware
import Reactor

/// The one owner of an I2C bus shared by the servo driver and the LCD.
///
/// Each transaction holds the bus whole. A waiting servo transaction goes
/// before any LCD transaction that has not started, and the LCD driver's
/// transactions are chunked (a few characters each), so a servo flush waits
/// behind at most one LCD chunk.
///
/// That bound must hold even when the LCD thread is preempted in the middle
/// of its chunk: the servo thread may run SCHED_FIFO, the LCD thread does
/// not, and anything of middling priority could keep the LCD thread off the
/// CPU while it holds the bus (classic priority inversion). So the bus
/// itself is a priority-inheriting mutex: while the servo thread waits for
/// it, its holder runs at the servo thread's priority until it lets go.
public final class BusArbiter: @unchecked Sendable {
    // `servoWaiting`, `displayCompletions`, `maxDisplayWaited`, `servoWaits`
    // are guarded by `state`; the bus is used only with `busLock` held.

    /// Who is asking for the bus.
    public enum Priority: Sendable {
        /// Servo and ESC pulses: latency matters.
        case servo
        /// Display traffic: may wait.
        case display
    }

    public let bus: any I2CBus
    private let state = Condition()
    private let busLock = Lock(priorityInheritance: true)
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
        state.withLock { Statistics(maxDisplayTransactionsWaited: maxDisplayWaited, maxServoWaitMicroseconds: servoWaits.maximumMicroseconds) }
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
        switch priority {
        case .servo:
            let before = state.withLock { () -> Int in
                servoWaiting += 1
                return displayCompletions
            }
            let start = ContinuousClock.now
            busLock.lock()
            let waited = start.duration(to: .now)
            state.withLock {
                servoWaiting -= 1
                maxDisplayWaited = max(maxDisplayWaited, displayCompletions - before)
                servoWaits.record(waited)
                if servoWaiting == 0 { state.broadcast() }
            }
            defer { busLock.unlock() }
            return try bus.transfer(messages, at: address)
        case .display:
            state.withLock {
                while servoWaiting > 0 { state.wait() }
            }
            busLock.lock()
            defer {
                state.withLock { displayCompletions += 1 }
                busLock.unlock()
            }
            return try bus.transfer(messages, at: address)
        }
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
