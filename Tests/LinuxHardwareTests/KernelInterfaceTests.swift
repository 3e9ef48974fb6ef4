import Foundation
import Hardware
@testable import LinuxHardware
import Testing

/// Tests against the kernel's own i2c-stub and gpio-sim, run where they exist
/// (the VM rig: `modprobe i2c-stub chip_addr=0x40,0x27; modprobe i2c-dev`)
/// and skipped elsewhere. `BLC_TEST_I2C_BUS` overrides the adapter lookup.
/// Other tests in this target write to `TMPDIR` (default /tmp): point it at a
/// writable directory in a guest whose root is read-only.
enum KernelRig {
    static let i2cStub: String? = {
        if let path = ProcessInfo.processInfo.environment["BLC_TEST_I2C_BUS"], !path.isEmpty { return path }
        return LinuxI2CBus.findAdapter(named: "SMBus stub driver")
    }()

    /// A gpio-sim chip held for testing: `BLC_TEST_GPIOSIM_CHIP` (e.g.
    /// /dev/gpiochip1) and `BLC_TEST_GPIOSIM_SYSFS`, the chip's directory
    /// under /sys/devices/platform/gpio-sim.N/ holding `sim_gpioN/value`.
    static let gpioSim: (chip: String, sysfs: String)? = {
        let environment = ProcessInfo.processInfo.environment
        guard let chip = environment["BLC_TEST_GPIOSIM_CHIP"], !chip.isEmpty,
              let sysfs = environment["BLC_TEST_GPIOSIM_SYSFS"], !sysfs.isEmpty else { return nil }
        return (chip, sysfs)
    }()

    /// A line of that chip named through gpio-sim's configfs
    /// (`BLC_TEST_GPIOSIM_LINE_NAME`, at `BLC_TEST_GPIOSIM_LINE_OFFSET`).
    static let namedLine: (name: String, offset: Int)? = {
        let environment = ProcessInfo.processInfo.environment
        guard gpioSim != nil, let name = environment["BLC_TEST_GPIOSIM_LINE_NAME"], !name.isEmpty,
              let offset = environment["BLC_TEST_GPIOSIM_LINE_OFFSET"].flatMap({ Int($0) }) else { return nil }
        return (name, offset)
    }()

    static func simValue(_ sysfs: String, _ offset: Int) -> String? {
        guard let data = FileManager.default.contents(atPath: "\(sysfs)/sim_gpio\(offset)/value") else { return nil }
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }
}

// Serialized: the tests share the stub's register files.
@Suite("LinuxI2CBus on i2c-stub", .serialized, .enabled(if: KernelRig.i2cStub != nil, "no i2c-stub adapter (runs in the VM rig)"))
struct I2CStubTests {
    let pca9685 = I2CAddress(0x40)!
    let backpack = I2CAddress(0x27)!

    @Test("i2c-stub is SMBus-only, so the bus falls back to SMBus and limits writes to 33 bytes")
    func fallback() throws {
        let bus = try LinuxI2CBus(path: KernelRig.i2cStub!)
        #expect(bus.usesSMBus)
        #expect(bus.maxWriteLength == 33)
        #expect(bus.functionality.contains(.smbusWriteI2CBlock))
    }

    @Test("PCA9685-style register writes read back from the stub's register file")
    func registers() throws {
        let bus = try LinuxI2CBus(path: KernelRig.i2cStub!)
        try bus.write([0x00, 0x21], to: pca9685)  // MODE1: AI | ALLCALL
        #expect(try bus.writeRead([0x00], count: 1, at: pca9685) == [0x21])
        // LED0 ON = 0, OFF = 0x133 (1.5 ms at 50 Hz, datasheet §7.3.3).
        try bus.write([0x06, 0x00, 0x00, 0x33, 0x01], to: pca9685)
        #expect(try bus.writeRead([0x06], count: 4, at: pca9685) == [0x00, 0x00, 0x33, 0x01])
    }

    @Test("a write longer than one SMBus block lands whole, in two blocks")
    func longWrite() throws {
        let bus = try LinuxI2CBus(path: KernelRig.i2cStub!)
        let data = (0..<64).map { UInt8($0 * 3 & 0xFF) }
        try bus.write([0x06] + data, to: pca9685)
        #expect(try bus.writeRead([0x06], count: 64, at: pca9685) == data)
    }

    @Test("byte-stream writes reach a PCF8574-style address as separate send bytes, in order")
    func byteStream() throws {
        let bus = try LinuxI2CBus(path: KernelRig.i2cStub!)
        // i2c-stub keeps the last send byte as its register pointer and answers
        // a receive byte from the register there (drivers/i2c/i2c-stub.c).
        try bus.write([0x01, 0xA5], to: backpack)
        try bus.write([0x08, 0x5A], to: backpack)
        bus.setSMBusWriteStyle(.byteStream, for: backpack)
        #expect(bus.smbusWriteStyle(for: backpack) == .byteStream)
        try bus.write([0x01, 0x08], to: backpack)
        #expect(try bus.transfer([.read(count: 1)], at: backpack) == [[0x5A]])
        try bus.write([0x08, 0x01], to: backpack)
        #expect(try bus.transfer([.read(count: 1)], at: backpack) == [[0xA5]])
    }

    @Test("an absent address is not acknowledged, after the retries")
    func absent() throws {
        let bus = try LinuxI2CBus(path: KernelRig.i2cStub!, retries: 2, backoff: .milliseconds(1))
        do {
            try bus.write([0x00, 0x00], to: I2CAddress(0x26)!)
            Issue.record("an absent address acknowledged")
        } catch let error as I2CError {
            #expect(error.kind == .noAcknowledge)
            #expect(error.address == I2CAddress(0x26))
            #expect(error.context.contains("3 tries"))
        }
        // The bus still works for the device that is there.
        try bus.write([0x00, 0x20], to: pca9685)
    }
}

@Suite("GPIODLine on gpio-sim", .serialized, .enabled(if: KernelRig.gpioSim != nil, "no gpio-sim chip given (runs in the VM rig)"))
struct GPIOSimTests {
    @Test("the line starts inactive and follows set, active-high and active-low")
    func levels() throws {
        let (chip, sysfs) = KernelRig.gpioSim!
        let high = try GPIODLine(chip: chip, offset: 0, lineName: nil, activeLow: false)
        #expect(KernelRig.simValue(sysfs, 0) == "0")
        try high.set(true)
        #expect(KernelRig.simValue(sysfs, 0) == "1")
        try high.set(false)
        #expect(KernelRig.simValue(sysfs, 0) == "0")

        let low = try GPIODLine(chip: chip, offset: 1, lineName: nil, activeLow: true)
        #expect(KernelRig.simValue(sysfs, 1) == "1")
        try low.set(true)
        #expect(KernelRig.simValue(sysfs, 1) == "0")
        low.close()
        high.close()
    }

    @Test("a held line is busy for a second request, which names the holder")
    func busy() throws {
        let (chip, _) = KernelRig.gpioSim!
        let held = try GPIODLine(chip: chip, offset: 2, lineName: nil, activeLow: false, consumer: "blc-test-holder")
        defer { held.close() }
        do {
            _ = try GPIODLine(chip: chip, offset: 2, lineName: nil, activeLow: false)
            Issue.record("requested a held line twice")
        } catch GPIODLine.OpenError.lineBusy(_, let offset, let holder) {
            #expect(offset == 2)
            #expect(holder == "blc-test-holder")
        }
    }

    @Test("an offset past the chip's last line is out of range")
    func outOfRange() {
        let (chip, _) = KernelRig.gpioSim!
        do {
            _ = try GPIODLine(chip: chip, offset: 4096, lineName: nil, activeLow: false)
            Issue.record("requested a line past the end")
        } catch GPIODLine.OpenError.offsetOutOfRange(_, let offset, _) {
            #expect(offset == 4096)
        } catch {
            Issue.record("unexpected \(error)")
        }
    }

    @Test("a line is found by name on whichever chip has it", .enabled(if: KernelRig.namedLine != nil))
    func byName() throws {
        let (chip, sysfs) = KernelRig.gpioSim!
        let (name, offset) = KernelRig.namedLine!
        let line = try GPIODLine(chip: "", offset: nil, lineName: name, activeLow: false)
        defer { line.close() }
        #expect(line.chipPath == chip)
        #expect(line.offset == offset)
        try line.set(true)
        #expect(KernelRig.simValue(sysfs, offset) == "1")
        // On the named chip too; a name the chip lacks is 'no such line'.
        #expect(throws: GPIODLine.OpenError.noSuchLine(name: "BLC_NOT_THERE", chips: [chip])) {
            try GPIODLine(chip: chip, offset: nil, lineName: "BLC_NOT_THERE", activeLow: false)
        }
    }

    @Test("a chip is found by its label as well as by its device")
    func byLabel() throws {
        let (chip, sysfs) = KernelRig.gpioSim!
        let chips = SystemGPIOChips()
        let label = try chips.label(of: chip)
        #expect(!label.isEmpty)
        // gpio-sim names each bank after its device ("gpio-sim.0-node0"): no other chip has it.
        #expect(chips.chipPaths().filter { (try? chips.label(of: $0)) == label } == [chip])
        let line = try GPIODLine(chip: label, offset: 5, lineName: nil, activeLow: false)
        defer { line.close() }
        #expect(line.chipPath == chip)
        try line.set(true)
        #expect(KernelRig.simValue(sysfs, 5) == "1")
    }

    @Test("a released line can no longer be set")
    func released() throws {
        let (chip, _) = KernelRig.gpioSim!
        let line = try GPIODLine(chip: chip, offset: 3, lineName: nil, activeLow: false)
        line.close()
        #expect(throws: DigitalOutputError.self) { try line.set(true) }
    }
}
