import Reactor
import Hardware

/// A device that can sit on an ``EmulatedI2CBus``.
///
/// The bus calls these with its own lock held, so one device never sees two
/// transactions at once; implementations still guard state they expose to
/// other threads (tests, the status reader) with their own lock.
public protocol EmulatedI2CDevice: AnyObject, Sendable {
    /// A START addressed to this device was acknowledged.
    func start()
    /// The bytes of one write message, in order.
    func receive(_ bytes: [UInt8])
    /// The device answers a read message of `count` bytes.
    func transmit(count: Int) -> [UInt8]
    /// STOP: the transaction is over.
    func stop()
}

extension EmulatedI2CDevice {
    public func start() {}
    public func stop() {}
    public func transmit(count: Int) -> [UInt8] { [UInt8](repeating: 0xFF, count: count) }
}

/// An in-process I2C bus: address → emulated device. An address with no
/// device NACKs, as on a real bus; faults can be injected per address.
public final class EmulatedI2CBus: I2CBus, @unchecked Sendable {
    /// A failure to inject on an address.
    public enum Fault: Sendable, Hashable {
        case noAcknowledge
        case timeout
        /// The bus hangs (a slave holding SDA low, endless clock
        /// stretching): a transfer to the address blocks until the fault's
        /// duration ends, then fails with a timeout.
        case stall
    }

    /// One completed (or failed) transaction, for transcript assertions.
    public struct Transaction: Sendable, Hashable {
        public var address: I2CAddress
        public var messages: [I2CMessage]
        public var error: I2CError.Kind?
    }

    private let lock = Lock()
    private var devices: [I2CAddress: any EmulatedI2CDevice] = [:]
    private var faults: [I2CAddress: (fault: Fault, remaining: Int?, until: ContinuousClock.Instant?)] = [:]
    private var recording = false
    private var recorded: [Transaction] = []
    private var transactionCount = 0
    private var writtenByteCount = 0
    /// Simulated wire time per byte, to make contention visible in benchmarks
    /// (100 kHz standard mode ≈ 90 µs per byte with its ACK bit). Zero by default.
    private let byteTime: Duration

    public let maxWriteLength: Int?

    /// - Parameters:
    ///   - maxWriteLength: emulate an adapter limited to this many bytes per
    ///     write message (SMBus-only adapters), or `nil` for plain I2C.
    ///   - byteTime: how long each byte occupies the bus (wall-clock sleep
    ///     while the bus lock is held); zero for tests.
    public init(maxWriteLength: Int? = nil, byteTime: Duration = .zero) {
        self.maxWriteLength = maxWriteLength
        self.byteTime = byteTime
    }

    /// Places `device` at `address`, replacing whatever was there.
    public func attach(_ device: any EmulatedI2CDevice, at address: I2CAddress) {
        lock.withLock { devices[address] = device }
    }

    /// Unplugs the device at `address`; it NACKs from now on.
    public func detach(at address: I2CAddress) {
        lock.withLock { _ = devices.removeValue(forKey: address) }
    }

    /// The device at `address`, if any.
    public func device(at address: I2CAddress) -> (any EmulatedI2CDevice)? {
        lock.withLock { devices[address] }
    }

    /// Makes transactions to `address` fail with `fault`, for the next
    /// `count` transactions and/or until `duration` has passed (both `nil`:
    /// until ``clearFault(at:)``).
    public func injectFault(_ fault: Fault, at address: I2CAddress, count: Int? = nil, for duration: Duration? = nil) {
        let until = duration.map { ContinuousClock.now.advanced(by: $0) }
        lock.withLock { faults[address] = (fault, count, until) }
    }

    public func clearFault(at address: I2CAddress) {
        lock.withLock { _ = faults.removeValue(forKey: address) }
    }

    /// Starts or stops keeping a transcript of every transaction.
    public func setRecording(_ on: Bool) {
        lock.withLock {
            recording = on
            if !on { recorded.removeAll() }
        }
    }

    /// The transcript since recording started (or was last taken), and clears it.
    public func takeTranscript() -> [Transaction] {
        lock.withLock {
            let result = recorded
            recorded.removeAll()
            return result
        }
    }

    /// Transactions attempted and write bytes carried since the bus was made.
    public var statistics: (transactions: Int, writtenBytes: Int) {
        lock.withLock { (transactionCount, writtenByteCount) }
    }

    @discardableResult
    public func transfer(_ messages: [I2CMessage], at address: I2CAddress) throws -> [[UInt8]] {
        if let until = lock.withLock({ stallDeadline(at: address) }) {
            // Outside the lock: the test (or status) must still see the bus.
            let now = ContinuousClock.now
            if until > now { sleepThread(now.duration(to: until)) }
            throw I2CError(.timeout, address: address, context: "bus stalled")
        }
        return try lock.withLock {
            transactionCount += 1
            if let error = activeFault(at: address) {
                record(address, messages, error)
                throw I2CError(error, address: address, context: describe(messages))
            }
            guard let device = devices[address] else {
                record(address, messages, .noAcknowledge)
                throw I2CError(.noAcknowledge, address: address, context: describe(messages))
            }
            if let limit = maxWriteLength {
                for case .write(let bytes) in messages where bytes.count > limit {
                    record(address, messages, .notSupported)
                    throw I2CError(.notSupported, address: address, context: "write of \(bytes.count) bytes exceeds the adapter's \(limit)")
                }
            }
            var replies: [[UInt8]] = []
            var byteCount = 0
            for message in messages {
                device.start()
                switch message {
                case .write(let bytes):
                    device.receive(bytes)
                    writtenByteCount += bytes.count
                    byteCount += bytes.count + 1
                case .read(let count):
                    replies.append(device.transmit(count: count))
                    byteCount += count + 1
                }
            }
            device.stop()
            record(address, messages, nil)
            if byteTime > .zero {
                sleepThread(byteTime * byteCount)
            }
            return replies
        }
    }

    /// When an injected stall on `address` ends (a stall without a
    /// duration lasts 1 s per transfer), or nil without one.
    private func stallDeadline(at address: I2CAddress) -> ContinuousClock.Instant? {
        guard let entry = faults[address], entry.fault == .stall, activeFault(at: address) != nil else { return nil }
        return entry.until ?? ContinuousClock.now + .seconds(1)
    }

    private func activeFault(at address: I2CAddress) -> I2CError.Kind? {
        guard var entry = faults[address] else { return nil }
        if let until = entry.until, ContinuousClock.now >= until {
            faults.removeValue(forKey: address)
            return nil
        }
        if let remaining = entry.remaining {
            if remaining <= 0 {
                faults.removeValue(forKey: address)
                return nil
            }
            entry.remaining = remaining - 1
            faults[address] = entry
        }
        switch entry.fault {
        case .noAcknowledge: return .noAcknowledge
        case .timeout, .stall: return .timeout
        }
    }

    private func record(_ address: I2CAddress, _ messages: [I2CMessage], _ error: I2CError.Kind?) {
        if recording { recorded.append(Transaction(address: address, messages: messages, error: error)) }
    }

    private func describe(_ messages: [I2CMessage]) -> String {
        messages.map { message -> String in
            switch message {
            case .write(let bytes): return "write \(bytes.count) bytes"
            case .read(let count): return "read \(count) bytes"
            }
        }.joined(separator: ", ")
    }
}
