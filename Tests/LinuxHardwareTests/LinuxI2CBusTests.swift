import Foundation
import Hardware
@testable import LinuxHardware
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("LinuxI2CBus without hardware")
struct LinuxI2CBusTests {
    @Test("a missing adapter is 'no such device', with a hint to enable I2C")
    func missingAdapter() {
        do {
            _ = try LinuxI2CBus(path: "/dev/i2c-99")
            Issue.record("opened a missing adapter")
        } catch let error as LinuxI2CBus.OpenError {
            #expect(error == .noSuchDevice(path: "/dev/i2c-99"))
            #expect(error.description.contains("i2c-dev"))
        } catch {
            Issue.record("unexpected \(error)")
        }
    }

    @Test("a file that is not an i2c-dev node is 'not an i2c adapter'", arguments: ["/dev/null", "/tmp"])
    func notAnAdapter(path: String) {
        do {
            _ = try LinuxI2CBus(path: path)
            Issue.record("opened \(path) as an adapter")
        } catch LinuxI2CBus.OpenError.notAnAdapter(let reported, _) {
            #expect(reported == path)
        } catch {
            Issue.record("unexpected \(error)")
        }
    }

    @Test("the permission error explains the group and udev rule")
    func permissionText() {
        let text = LinuxI2CBus.OpenError.permissionDenied(path: "/dev/i2c-1").description
        #expect(text.contains("/dev/i2c-1"))
        #expect(text.contains("i2c"))
        #expect(text.contains("udev"))
    }

    @Test("kernel error codes map to I2C error kinds", arguments: [
        (ENXIO, I2CError.Kind.noAcknowledge),
        (EREMOTEIO, .noAcknowledge),
        (ENODEV, .noAcknowledge),
        (ETIMEDOUT, .timeout),
        (EAGAIN, .busError),
        (EIO, .busError),
        (EPROTO, .busError),
        (EBADMSG, .busError),
        (EBUSY, .busError),
        (EOPNOTSUPP, .notSupported),
        (EINVAL, .system(errno: EINVAL)),
        (ENOMEM, .system(errno: ENOMEM)),
    ] as [(Int32, I2CError.Kind)])
    func errnoMapping(code: Int32, kind: I2CError.Kind) {
        #expect(LinuxI2CBus.errorKind(forErrno: code) == kind)
    }

    @Test("adapters are found by their sysfs name, not their number")
    func findAdapter() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("linuxhw-sysfs-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: root) }
        let adapters = ["i2c-0": "i915 gmbus dpb\n", "i2c-3": "SMBus stub driver\n", "i2c-12": "SMBus stub driver\n"]
        for (entry, name) in adapters {
            try FileManager.default.createDirectory(atPath: "\(root)/\(entry)", withIntermediateDirectories: true)
            try name.write(toFile: "\(root)/\(entry)/name", atomically: true, encoding: .utf8)
        }
        // A client device, whose name must not be mistaken for an adapter's.
        try FileManager.default.createDirectory(atPath: "\(root)/3-0040", withIntermediateDirectories: true)
        try "SMBus stub driver\n".write(toFile: "\(root)/3-0040/name", atomically: true, encoding: .utf8)

        #expect(LinuxI2CBus.findAdapter(named: "SMBus stub driver", sysfsDevices: root, deviceDirectory: "/dev") == "/dev/i2c-3")
        #expect(LinuxI2CBus.findAdapter(named: "i915 gmbus dpb", sysfsDevices: root, deviceDirectory: "/dev") == "/dev/i2c-0")
        #expect(LinuxI2CBus.findAdapter(named: "bcm2835 (i2c@7e804000)", sysfsDevices: root, deviceDirectory: "/dev") == nil)
        #expect(LinuxI2CBus.findAdapter(named: "x", sysfsDevices: "\(root)/missing", deviceDirectory: "/dev") == nil)
    }

    @Test("a bus named by its adapter: the one node of that name, or an error listing the adapters there are")
    func devicePathOfAdapter() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("linuxhw-sysfs-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: root) }
        for (entry, name) in ["i2c-1": "bcm2835 (i2c@7e804000)", "i2c-2": "bcm2835 (i2c@7e805000)", "i2c-20": "fef04500.i2c", "i2c-21": "fef04500.i2c", "1-0040": "pca9685"] {
            try FileManager.default.createDirectory(atPath: "\(root)/\(entry)", withIntermediateDirectories: true)
            try "\(name)\n".write(toFile: "\(root)/\(entry)/name", atomically: true, encoding: .utf8)
        }
        #expect(try LinuxI2CBus.devicePath(adapterNamed: "bcm2835 (i2c@7e804000)", sysfsDevices: root, deviceDirectory: "/dev") == "/dev/i2c-1")
        #expect(throws: LinuxI2CBus.OpenError.ambiguousAdapter(name: "fef04500.i2c", matches: ["i2c-20", "i2c-21"])) {
            try LinuxI2CBus.devicePath(adapterNamed: "fef04500.i2c", sysfsDevices: root, deviceDirectory: "/dev")
        }
        do throws(LinuxI2CBus.OpenError) {
            _ = try LinuxI2CBus.devicePath(adapterNamed: "Synopsys DesignWare I2C adapter", sysfsDevices: root, deviceDirectory: "/dev")
            Issue.record("found an adapter that is not there")
        } catch {
            #expect(error == .noSuchAdapter(name: "Synopsys DesignWare I2C adapter", present: [
                "i2c-1 \"bcm2835 (i2c@7e804000)\"", "i2c-2 \"bcm2835 (i2c@7e805000)\"", "i2c-20 \"fef04500.i2c\"", "i2c-21 \"fef04500.i2c\"",
            ]))
            #expect(error.description.contains("i2c-1 \"bcm2835 (i2c@7e804000)\""))
        }
    }

    @Test("functionality reads as names")
    func functionalityText() {
        #expect(I2CFunctionality([.i2c, .smbusQuick]).description == "I2C, SMBus quick")
        #expect(I2CFunctionality().description == "none")
    }
}
