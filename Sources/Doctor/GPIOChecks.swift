import Board
import LinuxHardware

/// The status LED's line and the switches' GPIO lines: which chip has each,
/// whether the service user may open it, and whether it is free. Each line
/// is requested for an instant, driven to its inactive level (the LED dark,
/// the switch off), and released; a line the daemon holds is reported as
/// such.
extension Context {
    /// One GPIO line of the board file, and the key that names its chip there.
    private struct BoardLine {
        var subject: String
        var chip: String
        var line: Int?
        var lineName: String?
        var activeLow: Bool
        /// `led.chip`, or how to name a switch's chip.
        var chipKey: String
    }

    func checkGPIO(_ configuration: BoardConfiguration) -> DoctorSection {
        var findings: [DoctorFinding] = []
        var lines: [BoardLine] = []
        switch configuration.led {
        case nil:
            findings.append(DoctorFinding(.ok, "LED", "none on this board"))
        case .emulated?:
            findings.append(DoctorFinding(.ok, "LED", "emulated: nothing to check"))
        case .gpio(let chip, let line, let lineName, let activeLow)?:
            lines.append(BoardLine(subject: "LED \(lineName ?? line.map { "line \($0)" } ?? "?")", chip: chip, line: line,
                                   lineName: lineName, activeLow: activeLow, chipKey: "led.chip"))
        }
        for item in configuration.switches {
            guard case .gpio(let chip, let line, let lineName, let activeLow) = item.output else { continue }
            lines.append(BoardLine(subject: "switch \(item.index) \(lineName ?? line.map { "line \($0)" } ?? "?")", chip: chip, line: line,
                                   lineName: lineName, activeLow: activeLow, chipKey: "the chip of switch \(item.index)"))
        }
        if !lines.isEmpty {
            if system.gpio.chipPaths().isEmpty {
                findings.append(DoctorFinding(
                    .fail, "GPIO", "no GPIO chips in /dev",
                    fix: "the kernel exposes no GPIO character devices (CONFIG_GPIO_CDEV); `ls /dev/gpiochip*` should list some"
                ))
            } else {
                for line in lines { findings += check(line) }
            }
        }
        let version = GPIODLine.libraryVersion
        let api = version.hasPrefix("1.") ? "1.x API" : "2.x API"
        findings.append(DoctorFinding(.ok, "libgpiod", "\(version) (\(api))"))
        return DoctorSection(title: "GPIO", findings: findings)
    }

    private func check(_ line: BoardLine) -> [DoctorFinding] {
        let chipPath: String
        do throws(GPIODLine.OpenError) {
            chipPath = try GPIODLine.locate(chip: line.chip, lineName: line.lineName, in: system.gpio)
        } catch {
            return [finding(line, error)]
        }
        // A chip named and a line name it does not have: the name may well
        // be on another chip (the Pi 5's header moved from gpiochip4 to
        // gpiochip0 in kernel 6.6.45), which says what to write instead.
        if GPIODLine.ChipName(line.chip) != .any, let name = line.lineName, lacks(chipPath, name) {
            if let elsewhere = try? GPIODLine.locate(chip: "", lineName: name, in: system.gpio) {
                let label = try? system.gpio.label(of: elsewhere)
                return [DoctorFinding(
                    .fail, line.subject, "\(name) is on \(GPIODLine.describe(elsewhere, label: label)), not on \(line.chip)",
                    fix: "leave \(line.chipKey) out (the line is then found by name on every chip)\(label.map { ", or set it to \($0)" } ?? "")"
                )]
            }
            return [finding(line, .noSuchLine(name: name, chips: [chipPath]))]
        }
        var findings: [DoctorFinding] = []
        if let node = SystemInspector.node(at: chipPath), let account, !node.readWritable(uid: account.uid, groups: serviceGroupIDs) {
            findings.append(DoctorFinding(
                .fail, line.subject, "\(chipPath) (\(node.description)) is not readable and writable by user \(account.name)",
                fix: "install the udev rule (/usr/lib/udev/rules.d/99-blecontrol.rules), then `sudo udevadm trigger --subsystem-match=gpio`"
            ))
        }
        do {
            let gpio = try GPIODLine(chip: chipPath, offset: line.line, lineName: line.lineName, activeLow: line.activeLow,
                                     consumer: "blecontrol-doctor", chips: system.gpio)
            let label = gpio.label
            gpio.close()
            findings.insert(DoctorFinding(.ok, line.subject, "\(label) present and free"), at: 0)
        } catch let error as GPIODLine.OpenError {
            findings.insert(finding(line, error), at: 0)
        } catch {
            findings.insert(DoctorFinding(.fail, line.subject, "\(error)", fix: "`gpioinfo` shows the lines and who holds them"), at: 0)
        }
        return findings
    }

    /// Whether the chip can be read and has no line called `name`.
    private func lacks(_ chipPath: String, _ name: String) -> Bool {
        do { return try system.gpio.offset(of: name, on: chipPath) == nil } catch { return false }
    }

    private func finding(_ line: BoardLine, _ error: GPIODLine.OpenError) -> DoctorFinding {
        let subject = line.subject
        switch error {
        case .lineBusy(let chip, let offset, let holder):
            if let holder, holder.hasPrefix("blecontrol") {
                return DoctorFinding(.ok, subject, "\(chip) line \(offset) held by \(holder) (the daemon has it)")
            }
            return DoctorFinding(
                .fail, subject, error.description,
                fix: "stop what holds it (`gpioinfo` names the consumer) or drop the overlay that claims the pin (dtoverlay=gpio-led, w1-gpio, …), or pick another line"
            )
        case .permissionDenied:
            return DoctorFinding(
                .warn, subject, "\(currentUser) may not open the GPIO chip to check the line",
                fix: "run `sudo blecontrol doctor`, or add yourself to group gpio"
            )
        case .noSuchLine:
            return DoctorFinding(.fail, subject, error.description, fix: headerAdvice() ?? "set line_name to a name `gpioinfo` lists")
        case .ambiguousLine:
            return DoctorFinding(.fail, subject, error.description,
                                 fix: "set \(line.chipKey) to the label (or device) of the chip whose pin you wired, as listed")
        case .noSuchChip, .notAChip, .noSuchChipLabel, .ambiguousChipLabel:
            let fix = line.lineName != nil
                ? "leave \(line.chipKey) out: the line is then found by name on every chip (`gpiodetect` lists the chips)"
                : "set \(line.chipKey) to a chip `gpiodetect` lists (by its label, such as \(system.isRaspberryPi5() ? "pinctrl-rp1" : "pinctrl-bcm2711"), the number may change), or name the line with line_name"
            return DoctorFinding(.fail, subject, error.description, fix: headerAdvice().map { "\(fix); \($0)" } ?? fix)
        case .offsetOutOfRange:
            return DoctorFinding(.fail, subject, error.description, fix: "use line_name instead of a number (`gpioinfo` lists the names)")
        case .invalidArguments, .system:
            return DoctorFinding(.fail, subject, error.description, fix: "`gpioinfo` shows the chips' lines and who holds them")
        }
    }

    /// Where a Raspberry Pi's header lines are, nil on other machines: on
    /// the Pi 3, 4 and Zero 2 W the SoC's pinctrl-bcm2835/-bcm2711; on the
    /// Pi 5 the RP1 chip's pinctrl-rp1 (gpiochip4 up to kernel 6.6.44,
    /// gpiochip0 since), which only Raspberry Pi OS's kernel drives yet.
    func headerAdvice() -> String? {
        guard system.raspberryPiModel() != nil else { return nil }
        let names = "GPIO17 is header pin 11 (`gpioinfo` lists the names)"
        guard system.isRaspberryPi5() else {
            return "the header's lines are on pinctrl-bcm2835 (pinctrl-bcm2711 on the Pi 4), named GPIO0 to GPIO27: \(names)"
        }
        if let missing = missingRP1Driver() { return missing }
        return "on a Pi 5 the header's lines are on pinctrl-rp1, named GPIO0 to GPIO27: \(names)"
    }

    /// On a Pi 5 whose kernel drives no RP1 chip (no GPIO chip is labelled
    /// pinctrl-rp1), why nothing on the header works; nil otherwise, and when
    /// a chip this user may not open leaves it unknown.
    func missingRP1Driver() -> String? {
        guard system.isRaspberryPi5() else { return nil }
        var labels: [String] = []
        for chip in system.gpio.chipPaths() {
            guard let label = try? system.gpio.label(of: chip) else { return nil }
            labels.append(label)
        }
        guard !labels.contains("pinctrl-rp1") else { return nil }
        return "this kernel (\(system.kernelRelease() ?? "?")) has no driver for the Pi 5's RP1 chip, which the header's GPIO and I2C are on (no GPIO chip is pinctrl-rp1): Raspberry Pi OS's kernel has one"
    }
}
