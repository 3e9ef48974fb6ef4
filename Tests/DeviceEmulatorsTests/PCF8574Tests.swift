import DeviceEmulators
import Foundation
import Hardware
import Testing

/// Collects the port updates the expander reports to its wiring.
private final class PortLog: @unchecked Sendable {
    private let lock = NSLock()
    private var ports: [UInt8] = []
    func append(_ port: UInt8) { lock.withLock { ports.append(port) } }
    var all: [UInt8] { lock.withLock { ports } }
}

@Suite("PCF8574")
struct PCF8574Tests {
    let address = I2CAddress(0x27)!

    @Test("powers on with every pin high")
    func powerOn() throws {
        let log = PortLog()
        let chip = PCF8574(onPortWrite: { log.append($0) })
        #expect(chip.port == 0xFF)
        chip.powerOn()
        #expect(log.all == [0xFF])
        #expect(chip.writeCount == 0)
    }

    @Test("every byte of a write message is a port update, in order")
    func eachByteLatches() throws {
        let log = PortLog()
        let chip = PCF8574(onPortWrite: { log.append($0) })
        let bus = EmulatedI2CBus()
        bus.attach(chip, at: address)
        try bus.write([0x0C, 0x08, 0x3C, 0x38], to: address)
        try bus.write([0x55], to: address)
        #expect(log.all == [0x0C, 0x08, 0x3C, 0x38, 0x55])
        #expect(chip.port == 0x55)
        #expect(chip.writeCount == 5)
    }

    @Test("a read returns the pins: written-high pins pulled low externally read low")
    func readsPins() throws {
        let chip = PCF8574()
        let bus = EmulatedI2CBus()
        bus.attach(chip, at: address)
        try bus.write([0xF0], to: address)
        #expect(try bus.writeRead([], count: 1, at: address) == [0xF0])
        chip.externalLow = 0x30
        let replies = try bus.transfer([.read(count: 2)], at: address)
        #expect(replies == [[0xC0, 0xC0]])
        // Reading is not a port update.
        #expect(chip.writeCount == 1)
    }

    @Test("power cycle returns the latch to all-high and reports it")
    func powerCycle() throws {
        let log = PortLog()
        let chip = PCF8574(onPortWrite: { log.append($0) })
        chip.receive([0x00])
        chip.powerOn()
        #expect(chip.port == 0xFF)
        #expect(log.all == [0x00, 0xFF])
    }
}
