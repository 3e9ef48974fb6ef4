import LinuxHardware

/// Chips as a test describes them: device node → label and line names.
public struct MadeUpChips: GPIOChipCatalog {
    public var chips: [(path: String, label: String, lines: [String])]
    /// Chips this user may not open.
    public var denied: Set<String> = []

    public init(chips: [(path: String, label: String, lines: [String])], denied: Set<String> = []) {
        self.chips = chips
        self.denied = denied
    }

    public func chipPaths() -> [String] { chips.map(\.path) }

    public func label(of chip: String) throws(GPIODLine.OpenError) -> String {
        if denied.contains(chip) { throw .permissionDenied(path: chip) }
        guard let found = chips.first(where: { $0.path == chip }) else { throw .noSuchChip(path: chip) }
        return found.label
    }

    public func offset(of name: String, on chip: String) throws(GPIODLine.OpenError) -> Int? {
        if denied.contains(chip) { throw .permissionDenied(path: chip) }
        guard let found = chips.first(where: { $0.path == chip }) else { throw .noSuchChip(path: chip) }
        return found.lines.firstIndex(of: name)
    }

    /// The header's GPIO0…GPIO27 on a chip with `extra` lines after them.
    public static func header(_ path: String, _ label: String, extra: [String] = []) -> (path: String, label: String, lines: [String]) {
        (path, label, (0...27).map { "GPIO\($0)" } + extra)
    }

    /// A Pi 5 under Raspberry Pi OS's kernel 6.6.45 or later: RP1 first.
    public static let pi5 = MadeUpChips(chips: [
        header("/dev/gpiochip0", "pinctrl-rp1", extra: ["PCIE_RP1_WAKE", "FAN_TACH"]),
        ("/dev/gpiochip10", "gpio-brcmstb@107d508500", ["-", "2712_BOOT_CS_N", "2712_BOOT_MISO"]),
        ("/dev/gpiochip11", "gpio-brcmstb@107d517c00", ["RP1_SDA", "RP1_SCL", "RP1_RUN"]),
    ])

    /// The same Pi 5 under kernel 6.1: RP1 behind the SoC's four chips.
    public static let pi5Kernel61 = MadeUpChips(chips: [
        ("/dev/gpiochip0", "gpio-brcmstb@107d508500", ["-", "2712_BOOT_CS_N"]),
        ("/dev/gpiochip1", "gpio-brcmstb@107d508520", ["-"]),
        ("/dev/gpiochip2", "gpio-brcmstb@107d517c00", ["RP1_SDA", "RP1_SCL"]),
        ("/dev/gpiochip3", "gpio-brcmstb@107d517c20", ["-"]),
        header("/dev/gpiochip4", "pinctrl-rp1"),
    ])

    /// A Pi 4: the SoC's bank, then the firmware's expander.
    public static let pi4 = MadeUpChips(chips: [
        header("/dev/gpiochip0", "pinctrl-bcm2711"),
        ("/dev/gpiochip1", "raspberrypi-exp-gpio", ["BT_ON", "WL_ON", "PWR_LED_OFF"]),
    ])
}
