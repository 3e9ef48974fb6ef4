import Foundation
import Hardware
@testable import LinuxHardware
import Testing

@Suite("GPIODLine without hardware")
struct GPIODLineTests {
    @Test("a missing chip is 'no such chip', however it is spelled", arguments: ["gpiochip99", "/dev/gpiochip99", "99"])
    func missingChip(chip: String) {
        do {
            _ = try GPIODLine(chip: chip, offset: 17, lineName: nil, activeLow: false)
            Issue.record("requested a line on a missing chip")
        } catch let error as GPIODLine.OpenError {
            #expect(error == .noSuchChip(path: "/dev/gpiochip99"))
            #expect(error.description.contains("/dev/gpiochip99"))
        } catch {
            Issue.record("unexpected \(error)")
        }
    }

    @Test("a missing chip is reported before a line name is looked up on it")
    func missingChipByName() {
        #expect(throws: GPIODLine.OpenError.noSuchChip(path: "/dev/gpiochip99")) {
            try GPIODLine(chip: "gpiochip99", offset: nil, lineName: "GPIO17", activeLow: true)
        }
    }

    @Test("a file that is not a GPIO chip is refused as such")
    func notAChip() {
        do {
            _ = try GPIODLine(chip: "/dev/null", offset: 0, lineName: nil, activeLow: false)
            Issue.record("requested a line on /dev/null")
        } catch GPIODLine.OpenError.notAChip(let path, _) {
            #expect(path == "/dev/null")
        } catch {
            Issue.record("unexpected \(error)")
        }
    }

    @Test("a line name no chip has is 'no such line', naming the chips searched")
    func missingLineName() throws {
        let chips = GPIODLine.chipPaths(in: "/dev")
        do {
            _ = try GPIODLine(chip: "", offset: nil, lineName: "BLC_NO_SUCH_LINE", activeLow: false)
            Issue.record("found a line that should not exist")
        } catch let error as GPIODLine.OpenError {
            #expect(error == .noSuchLine(name: "BLC_NO_SUCH_LINE", chips: chips))
            #expect(error.description.contains("BLC_NO_SUCH_LINE"))
        }
    }

    @Test("a line needs a name, or a chip and an offset")
    func invalidArguments() {
        #expect(throws: GPIODLine.OpenError.self) {
            try GPIODLine(chip: "", offset: 3, lineName: nil, activeLow: false)
        }
        #expect(throws: GPIODLine.OpenError.self) {
            try GPIODLine(chip: "gpiochip0", offset: nil, lineName: nil, activeLow: false)
        }
        #expect(throws: GPIODLine.OpenError.self) {
            try GPIODLine(chip: "gpiochip0", offset: nil, lineName: "", activeLow: false)
        }
    }

    @Test("chip arguments become device paths")
    func chipPaths() {
        #expect(GPIODLine.chipPath(for: "gpiochip4") == "/dev/gpiochip4")
        #expect(GPIODLine.chipPath(for: "/dev/gpiochip0") == "/dev/gpiochip0")
        #expect(GPIODLine.chipPath(for: "2") == "/dev/gpiochip2")
        #expect(GPIODLine.chipPath(for: "") == nil)
    }

    @Test("chips are searched in numeric order")
    func chipOrder() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("linuxhw-dev-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: root) }
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        for name in ["gpiochip10", "gpiochip2", "gpiochip0", "gpiochipX", "i2c-1"] {
            _ = FileManager.default.createFile(atPath: "\(root)/\(name)", contents: nil)
        }
        #expect(GPIODLine.chipPaths(in: root) == ["\(root)/gpiochip0", "\(root)/gpiochip2", "\(root)/gpiochip10"])
    }

    @Test("busy and permission errors say who holds the line and how to get access")
    func errorTexts() {
        let busy = GPIODLine.OpenError.lineBusy(chip: "/dev/gpiochip0", offset: 17, holder: "led-heartbeat").description
        #expect(busy.contains("busy") && busy.contains("led-heartbeat") && busy.contains("17"))
        let denied = GPIODLine.OpenError.permissionDenied(path: "/dev/gpiochip0").description
        #expect(denied.contains("gpio") && denied.contains("udev"))
    }

    @Test("the linked libgpiod reports its version")
    func version() {
        #expect(GPIODLine.libraryVersion.first?.isNumber == true)
    }
}
