import Foundation
import Hardware
@testable import LinuxHardware
import Testing
import TestSupport

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

    @Test("a chip is a device however it is spelled, a label otherwise, and nothing means every chip")
    func chipNames() {
        #expect(GPIODLine.ChipName("gpiochip4") == .path("/dev/gpiochip4"))
        #expect(GPIODLine.ChipName("/dev/gpiochip0") == .path("/dev/gpiochip0"))
        #expect(GPIODLine.ChipName("2") == .path("/dev/gpiochip2"))
        #expect(GPIODLine.ChipName("pinctrl-rp1") == .label("pinctrl-rp1"))
        #expect(GPIODLine.ChipName("gpiochip") == .label("gpiochip"))
        #expect(GPIODLine.ChipName("") == .any)
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

@Suite("GPIO lines found by name or chip label")
struct GPIOLocateTests {
    @Test("GPIO17 with no chip is found wherever the kernel put the header", arguments: [
        (MadeUpChips.pi4, "/dev/gpiochip0"), (MadeUpChips.pi5, "/dev/gpiochip0"), (MadeUpChips.pi5Kernel61, "/dev/gpiochip4"),
    ])
    func byName(chips: MadeUpChips, expected: String) throws {
        #expect(try GPIODLine.locate(chip: "", lineName: "GPIO17", in: chips) == expected)
    }

    @Test("a chip label names the chip whatever its number")
    func byLabel() throws {
        #expect(try GPIODLine.locate(chip: "pinctrl-rp1", lineName: "GPIO17", in: MadeUpChips.pi5Kernel61) == "/dev/gpiochip4")
        #expect(try GPIODLine.locate(chip: "pinctrl-rp1", lineName: nil, in: MadeUpChips.pi5) == "/dev/gpiochip0")
        do throws(GPIODLine.OpenError) {
            _ = try GPIODLine.locate(chip: "pinctrl-rp1", lineName: "GPIO17", in: MadeUpChips.pi4)
            Issue.record("found a label no chip has")
        } catch {
            #expect(error == .noSuchChipLabel(label: "pinctrl-rp1", chips: ["gpiochip0 [pinctrl-bcm2711]", "gpiochip1 [raspberrypi-exp-gpio]"]))
            #expect(error.description.contains("gpiochip0 [pinctrl-bcm2711]"))
        }
    }

    @Test("a name two chips have is an error naming both, and so is a label two chips share")
    func ambiguous() {
        let twice = MadeUpChips(chips: [
            MadeUpChips.header("/dev/gpiochip0", "pinctrl-bcm2711"),
            ("/dev/gpiochip2", "mcp23017", ["GPIO0", "GPIO17"]),
            ("/dev/gpiochip3", "mcp23017", ["GPIO1"]),
        ])
        #expect(throws: GPIODLine.OpenError.ambiguousLine(name: "GPIO17", chips: ["gpiochip0 [pinctrl-bcm2711]", "gpiochip2 [mcp23017]"])) {
            try GPIODLine.locate(chip: "", lineName: "GPIO17", in: twice)
        }
        #expect(throws: GPIODLine.OpenError.ambiguousChipLabel(label: "mcp23017", chips: ["gpiochip2 [mcp23017]", "gpiochip3 [mcp23017]"])) {
            try GPIODLine.locate(chip: "mcp23017", lineName: "GPIO1", in: twice)
        }
        // Named, the chip decides.
        #expect((try? GPIODLine.locate(chip: "pinctrl-bcm2711", lineName: "GPIO17", in: twice)) == "/dev/gpiochip0")
    }

    @Test("a name no chip has lists the chips searched; chips this user may not open are passed over, then blamed")
    func missingAndDenied() {
        #expect(throws: GPIODLine.OpenError.noSuchLine(name: "GPIO99", chips: ["/dev/gpiochip0", "/dev/gpiochip1"])) {
            try GPIODLine.locate(chip: "", lineName: "GPIO99", in: MadeUpChips.pi4)
        }
        var locked = MadeUpChips.pi4
        locked.denied = ["/dev/gpiochip1"]
        #expect((try? GPIODLine.locate(chip: "", lineName: "GPIO17", in: locked)) == "/dev/gpiochip0")
        #expect(throws: GPIODLine.OpenError.permissionDenied(path: "/dev/gpiochip1")) {
            try GPIODLine.locate(chip: "", lineName: "GPIO99", in: locked)
        }
        #expect(throws: GPIODLine.OpenError.self) {
            try GPIODLine.locate(chip: "", lineName: nil, in: MadeUpChips.pi4)
        }
    }

    @Test("this machine's chips, through libgpiod: each has a label, and a name none has is no line")
    func systemChips() throws {
        let chips = SystemGPIOChips()
        for path in chips.chipPaths() {
            // A chip this user may not open says so; any other answer is a label.
            do throws(GPIODLine.OpenError) {
                #expect(try !chips.label(of: path).isEmpty)
                #expect(try chips.offset(of: "BLC_NO_SUCH_LINE", on: path) == nil)
            } catch {
                #expect(error == .permissionDenied(path: path))
            }
        }
        #expect(throws: GPIODLine.OpenError.noSuchChip(path: "/dev/gpiochip99")) { try chips.label(of: "/dev/gpiochip99") }
    }
}
