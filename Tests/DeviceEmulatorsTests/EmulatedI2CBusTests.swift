import DeviceEmulators
import Foundation
import Hardware
import Testing

private let present = I2CAddress(0x40)!
private let absent = I2CAddress(0x41)!

/// A device that keeps every byte written to it and answers reads with a
/// counting pattern, so tests can see what reached the device.
private final class RecordingDevice: EmulatedI2CDevice, @unchecked Sendable {
    private let lock = NSLock()
    private var messages: [[UInt8]] = []
    private var stops = 0

    func receive(_ bytes: [UInt8]) { lock.withLock { messages.append(bytes) } }
    func transmit(count: Int) -> [UInt8] { (0..<count).map { UInt8($0 + 1) } }
    func stop() { lock.withLock { stops += 1 } }

    var received: [[UInt8]] { lock.withLock { messages } }
    var stopCount: Int { lock.withLock { stops } }
}

private func errorKind(_ body: () throws -> Void) -> I2CError.Kind? {
    do {
        try body()
        return nil
    } catch let error as I2CError {
        return error.kind
    } catch {
        return .system(errno: -1)
    }
}

@Suite("EmulatedI2CBus")
struct EmulatedI2CBusTests {
    @Test("a write reaches the device at its address, one STOP per transaction")
    func deliversWrites() throws {
        let bus = EmulatedI2CBus()
        let device = RecordingDevice()
        bus.attach(device, at: present)
        try bus.transfer([.write([1, 2]), .write([3])], at: present)
        #expect(device.received == [[1, 2], [3]])
        #expect(device.stopCount == 1)
        #expect(try bus.writeRead([9], count: 3, at: present) == [1, 2, 3])
    }

    @Test("an address without a device does not acknowledge")
    func absentAddressNACKs() throws {
        let bus = EmulatedI2CBus()
        bus.attach(RecordingDevice(), at: present)
        do {
            try bus.write([0x00], to: absent)
            Issue.record("the write to an empty address succeeded")
        } catch let error as I2CError {
            #expect(error.kind == .noAcknowledge)
            #expect(error.address == absent)
        }
    }

    @Test("a detached device NACKs from then on")
    func detachedDeviceNACKs() throws {
        let bus = EmulatedI2CBus()
        bus.attach(RecordingDevice(), at: present)
        try bus.write([0], to: present)
        bus.detach(at: present)
        #expect(bus.device(at: present) == nil)
        #expect(errorKind { try bus.write([0], to: present) } == .noAcknowledge)
    }

    @Test("an injected NACK fails exactly `count` transactions, which never reach the device")
    func injectedNACKForCount() throws {
        let bus = EmulatedI2CBus()
        let device = RecordingDevice()
        bus.attach(device, at: present)
        bus.injectFault(.noAcknowledge, at: present, count: 2)
        #expect(errorKind { try bus.write([1], to: present) } == .noAcknowledge)
        #expect(errorKind { try bus.write([2], to: present) } == .noAcknowledge)
        try bus.write([3], to: present)
        try bus.write([4], to: present)
        #expect(device.received == [[3], [4]])
    }

    @Test("an injected timeout lasts for its duration")
    func injectedTimeoutForDuration() throws {
        let bus = EmulatedI2CBus()
        let device = RecordingDevice()
        bus.attach(device, at: present)
        let duration = Duration.seconds(1)
        let injected = ContinuousClock.now
        bus.injectFault(.timeout, at: present, for: duration)
        let first = errorKind { try bus.write([1], to: present) }
        let second = errorKind { try bus.write([2], to: present) }
        // Both writes fail if both ran within the duration; a machine too
        // busy to make two writes in a second cannot tell, and is not asked to.
        if injected.duration(to: .now) < duration {
            #expect(first == .timeout)
            #expect(second == .timeout)
        }
        // A sleep lasts at least as long as asked, however busy the machine:
        // the fault is over after it.
        Thread.sleep(forTimeInterval: 1.1)
        try bus.write([3], to: present)
        #expect(device.received == [[3]])
    }

    @Test("a fault without count or duration stays until cleared, and only on its address")
    func persistentFault() throws {
        let bus = EmulatedI2CBus()
        let other = I2CAddress(0x27)!
        bus.attach(RecordingDevice(), at: present)
        bus.attach(RecordingDevice(), at: other)
        bus.injectFault(.noAcknowledge, at: present)
        for _ in 0..<5 {
            #expect(errorKind { try bus.write([0], to: present) } == .noAcknowledge)
        }
        try bus.write([0], to: other)
        bus.clearFault(at: present)
        try bus.write([0], to: present)
    }

    @Test("maxWriteLength: longer write messages are refused before they reach the device")
    func maxWriteLengthEnforced() throws {
        let bus = EmulatedI2CBus(maxWriteLength: 33)
        let device = RecordingDevice()
        bus.attach(device, at: present)
        #expect(bus.maxWriteLength == 33)
        try bus.write([UInt8](repeating: 7, count: 33), to: present)
        #expect(errorKind { try bus.write([UInt8](repeating: 8, count: 34), to: present) } == .notSupported)
        #expect(device.received.count == 1)
        // Reads are not limited by it.
        #expect(try bus.writeRead([0], count: 64, at: present).count == 64)
        #expect(EmulatedI2CBus().maxWriteLength == nil)
    }

    @Test("the transcript records every transaction with its outcome while recording")
    func transcript() throws {
        let bus = EmulatedI2CBus()
        bus.attach(RecordingDevice(), at: present)
        try bus.write([1], to: present)
        bus.setRecording(true)
        #expect(bus.takeTranscript().isEmpty)

        try bus.write([2, 3], to: present)
        _ = try bus.writeRead([4], count: 2, at: present)
        _ = errorKind { try bus.write([5], to: absent) }
        bus.injectFault(.timeout, at: present, count: 1)
        _ = errorKind { try bus.write([6], to: present) }

        let transcript = bus.takeTranscript()
        #expect(transcript.map(\.address) == [present, present, absent, present])
        #expect(transcript.map(\.messages) == [
            [.write([2, 3])],
            [.write([4]), .read(count: 2)],
            [.write([5])],
            [.write([6])]
        ])
        #expect(transcript.map(\.error) == [nil, nil, .noAcknowledge, .timeout])
        // Taking the transcript empties it; stopping recording drops the rest.
        #expect(bus.takeTranscript().isEmpty)
        try bus.write([7], to: present)
        bus.setRecording(false)
        try bus.write([8], to: present)
        bus.setRecording(true)
        #expect(bus.takeTranscript().isEmpty)
    }

    @Test("statistics count attempted transactions and carried write bytes")
    func statistics() throws {
        let bus = EmulatedI2CBus()
        bus.attach(RecordingDevice(), at: present)
        try bus.write([1, 2, 3], to: present)
        _ = errorKind { try bus.write([1], to: absent) }
        let statistics = bus.statistics
        #expect(statistics.transactions == 2)
        #expect(statistics.writtenBytes == 3)
    }
}
