import Board
@testable import Doctor
import Foundation
import Testing
import TestSupport

/// board/raspberry-pi.yaml with `edit` applied, as the doctor reads it.
private func piBoard(_ edit: (String) -> String = { $0 }) throws -> BoardConfiguration {
    let text = try String(contentsOf: repositoryRoot.appendingPathComponent("board/raspberry-pi.yaml"), encoding: .utf8)
    let edited = edit(text)
    return try BoardFile.parse(edited, path: "board.yaml")
}

/// The doctor's checks against `machine` with these GPIO chips.
private func context(_ machine: MadeUpMachine, chips: MadeUpChips) -> Context {
    var system = machine.system()
    system.gpio = chips
    return Context(options: DoctorOptions(boardPath: "board.yaml", socketPath: "/nonexistent/blecontrol.sock", system: system))
}

@Suite("blecontrol doctor on the Raspberry Pi 5: the header on RP1")
struct RaspberryPi5Tests {
    @Test("A board file that says gpiochip0 where kernel 6.1 put the header on gpiochip4: the finding names the chip that has the line")
    func lineOnAnotherChip() throws {
        let machine = try MadeUpMachine()
        try machine.raspberryPi("Raspberry Pi 5 Model B Rev 1.0")
        let board = try piBoard { $0.replacingOccurrences(of: "led:\n  line_name: GPIO17", with: "led:\n  chip: gpiochip0\n  line_name: GPIO17") }
        let section = context(machine, chips: .pi5Kernel61).checkGPIO(board)
        let led = try #require(section.finding("LED GPIO17"), "\(section.findings)")
        #expect(led.level == .fail)
        #expect(led.detail == "GPIO17 is on gpiochip4 [pinctrl-rp1], not on gpiochip0", "\(led.detail)")
        #expect(led.fix?.contains("leave led.chip out") == true && led.fix?.contains("pinctrl-rp1") == true, "\(led.fix ?? "")")
    }

    @Test("A line name two chips have: FAIL naming both, and the fix asks for the chip")
    func ambiguousLine() throws {
        let machine = try MadeUpMachine()
        try machine.raspberryPi("Raspberry Pi 5 Model B Rev 1.0")
        var chips = MadeUpChips.pi5
        chips.chips.append(("/dev/gpiochip12", "mcp23017", ["GPIO17"]))
        let section = context(machine, chips: chips).checkGPIO(try piBoard())
        let led = try #require(section.finding("LED GPIO17"))
        #expect(led.level == .fail)
        #expect(led.detail.contains("gpiochip0 [pinctrl-rp1]") && led.detail.contains("gpiochip12 [mcp23017]"), "\(led.detail)")
        #expect(led.fix?.contains("led.chip") == true)
    }

    @Test("A Pi 5 whose kernel has no RP1 driver: the GPIO and the I2C advice say so")
    func noRP1Driver() throws {
        let machine = try MadeUpMachine()
        try machine.raspberryPi("Raspberry Pi 5 Model B Rev 1.0")
        try machine.write("/proc/sys/kernel/osrelease", "6.12.38+deb13-arm64\n")
        try machine.makeDirectory("/sys/class/i2c-dev")
        // Only the SoC's own chips: nothing is labelled pinctrl-rp1.
        let chips = MadeUpChips(chips: Array(MadeUpChips.pi5.chips.dropFirst()))
        let board = try piBoard { $0.replacingOccurrences(of: "/dev/i2c-1", with: "/dev/i2c-99") }
        let doctor = context(machine, chips: chips)

        let led = try #require(doctor.checkGPIO(board).finding("LED GPIO17"))
        #expect(led.level == .fail && led.detail.contains("not found"))
        #expect(led.fix?.contains("6.12.38+deb13-arm64") == true && led.fix?.contains("RP1") == true, "\(led.fix ?? "")")

        let bus = try #require(doctor.checkI2C(board).finding("bus i2c1"))
        #expect(bus.level == .fail)
        #expect(bus.fix?.contains("no driver for the Pi 5's RP1 chip") == true, "\(bus.fix ?? "")")
    }

    @Test("The Pi 5's header bus missing under Raspberry Pi OS: dtparam=i2c_arm=on, which enables RP1's i2c1")
    func rp1I2C() throws {
        let machine = try MadeUpMachine()
        try machine.raspberryPi("Raspberry Pi 5 Model B Rev 1.0")
        try machine.makeDirectory("/sys/class/i2c-dev")
        try machine.write("/boot/firmware/config.txt", "[all]\ndtparam=audio=on\n")
        let board = try piBoard { $0.replacingOccurrences(of: "/dev/i2c-1", with: "/dev/i2c-99") }
        let bus = try #require(context(machine, chips: .pi5).checkI2C(board).finding("bus i2c1"))
        #expect(bus.fix?.contains("RP1 chip's i2c1") == true && bus.fix?.contains("dtparam=i2c_arm=on") == true, "\(bus.fix ?? "")")
    }

    @Test("A bus named by its adapter: none of that name lists the adapters there are; two of that name ask for the device")
    func adapterBus() throws {
        let machine = try MadeUpMachine()
        try machine.raspberryPi("Raspberry Pi 5 Model B Rev 1.0")
        try machine.write("/sys/bus/i2c/devices/i2c-1/name", "Synopsys DesignWare I2C adapter\n")
        try machine.write("/sys/bus/i2c/devices/i2c-11/name", "Synopsys DesignWare I2C adapter\n")
        try machine.write("/sys/bus/i2c/devices/i2c-13/name", "107d508200.i2c\n")
        try machine.write("/sys/bus/i2c/devices/1-0040/name", "pca9685\n")
        let named = { (adapter: String) in try piBoard { $0.replacingOccurrences(of: "device: /dev/i2c-1", with: "adapter: \"\(adapter)\"") } }

        let missing = try #require(context(machine, chips: .pi5).checkI2C(try named("bcm2835 (i2c@7e804000)")).finding("bus i2c1"))
        #expect(missing.level == .fail)
        #expect(missing.detail.contains("i2c-1 \"Synopsys DesignWare I2C adapter\"") && missing.detail.contains("i2c-13 \"107d508200.i2c\""), "\(missing.detail)")
        #expect(!missing.detail.contains("pca9685"))
        #expect(missing.fix?.contains("buses.i2c1.adapter") == true)

        let twice = try #require(context(machine, chips: .pi5).checkI2C(try named("Synopsys DesignWare I2C adapter")).finding("bus i2c1"))
        #expect(twice.level == .fail && twice.detail.contains("i2c-1, i2c-11"), "\(twice.detail)")
        #expect(twice.fix?.contains("buses.i2c1.device") == true)

        // Found: the bus is then checked as its device node, which this
        // machine does not have (the made-up sysfs has no /dev).
        let found = try #require(context(machine, chips: .pi5).checkI2C(try named("107d508200.i2c")).finding("bus i2c1"))
        #expect(found.detail.hasPrefix("adapter \"107d508200.i2c\": /dev/i2c-13"), "\(found.detail)")
    }
}
