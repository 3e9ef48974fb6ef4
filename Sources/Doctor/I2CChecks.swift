import Board
import Hardware
import LinuxHardware

#if canImport(Glibc)
import Glibc
#endif

/// The I2C buses of the board file: each adapter's device node, whether the
/// service user may open it, and the chips the board names on it (probed with
/// reads only, safe beside a running daemon).
extension Context {
    func checkI2C(_ configuration: BoardConfiguration) -> DoctorSection {
        var findings: [DoctorFinding] = []
        var opened: [String: any I2CBus] = [:]
        var unavailable: [String: String] = [:]
        for (name, bus) in configuration.buses.sorted(by: { $0.key < $1.key }) {
            switch bus.kind {
            case .emulated:
                findings.append(DoctorFinding(.ok, "bus \(name)", "emulated: nothing to check"))
            case .device(let path):
                let (busFindings, handle) = checkBusDevice(name: name, path: path)
                findings += busFindings
                if let handle { opened[name] = handle } else { unavailable[name] = path }
            case .adapter(let adapter):
                do throws(LinuxI2CBus.OpenError) {
                    let path = try LinuxI2CBus.devicePath(adapterNamed: adapter, sysfsDevices: system.path("/sys/bus/i2c/devices"))
                    var (busFindings, handle) = checkBusDevice(name: name, path: path)
                    if !busFindings.isEmpty { busFindings[0].detail = "adapter \"\(adapter)\": \(busFindings[0].detail)" }
                    findings += busFindings
                    if let handle { opened[name] = handle } else { unavailable[name] = path }
                } catch {
                    let fix: String
                    if case .ambiguousAdapter = error {
                        fix = "name the bus by its device instead (buses.\(name).device: /dev/i2c-N; `i2cdetect -l` lists which is which)"
                    } else {
                        fix = "set buses.\(name).adapter to one of the names listed (`i2cdetect -l` shows them)" + (raspberryPiI2CAdvice(name: name).map { "; \($0)" } ?? "")
                    }
                    findings.append(DoctorFinding(.fail, "bus \(name)", error.description, fix: fix))
                    unavailable[name] = "adapter \"\(adapter)\""
                }
            }
        }
        for chip in configuration.servo?.chips ?? [] {
            findings.append(probe(
                "\(chip)", bus: chip.bus, configuration: configuration,
                opened: opened, unavailable: unavailable
            ) { bus in
                switch ChipProbe.pca9685(on: bus, at: chip.address) {
                case .answered(let what):
                    return DoctorFinding(.ok, "", "answers: \(what)")
                case .absent:
                    return DoctorFinding(
                        .fail, "", "no answer at \(chip.address)",
                        fix: "check the wiring (SDA pin 3, SCL pin 5, GND, VCC to 3.3 V) and the address jumpers A0–A5 against the board file's address; `i2cdetect -y \(busNumber(configuration, chip.bus))` lists what answers"
                    )
                case .failed(let why):
                    return DoctorFinding(.fail, "", why, fix: "check the wiring and pull-ups; `i2cdetect -y \(busNumber(configuration, chip.bus))` lists what answers")
                }
            })
        }
        if let lcd = configuration.lcd {
            findings.append(probe(
                "LCD backpack \(lcd.address) on \(lcd.bus)", bus: lcd.bus, configuration: configuration,
                opened: opened, unavailable: unavailable
            ) { bus in
                switch ChipProbe.pcf8574(on: bus, at: lcd.address) {
                case .answered(let what):
                    return DoctorFinding(.ok, "", "answers: \(what)")
                case .absent:
                    if let twin = ChipProbe.pcf8574Twin(of: lcd.address), case .answered = ChipProbe.pcf8574(on: bus, at: twin) {
                        return DoctorFinding(
                            .fail, "", "no answer at \(lcd.address), but a backpack answers at \(twin)",
                            fix: "set lcd.address: \(twin) in the board file (PCF8574 backpacks are 0x20–0x27, PCF8574A 0x38–0x3F)"
                        )
                    }
                    return DoctorFinding(
                        .fail, "", "no answer at \(lcd.address)",
                        fix: "check the wiring and lcd.address (0x27 for a PCF8574 backpack, 0x3F for a PCF8574A); `i2cdetect -y \(busNumber(configuration, lcd.bus))` lists what answers"
                    )
                case .failed(let why):
                    return DoctorFinding(.fail, "", why, fix: "check the wiring and pull-ups; a 5 V backpack needs its pull-ups removed or a level shifter")
                }
            })
        }
        return DoctorSection(title: "I2C", findings: findings)
    }

    /// The chip check on `busName`, or why it cannot be made.
    private func probe(
        _ subject: String,
        bus busName: String,
        configuration: BoardConfiguration,
        opened: [String: any I2CBus],
        unavailable: [String: String],
        _ check: (any I2CBus) -> DoctorFinding
    ) -> DoctorFinding {
        var finding: DoctorFinding
        if configuration.buses[busName]?.kind == .emulated {
            finding = DoctorFinding(.ok, "", "emulated: nothing to check")
        } else if let bus = opened[busName] {
            finding = check(bus)
        } else {
            finding = DoctorFinding(.warn, "", "not probed: \(unavailable[busName] ?? busName) could not be opened (see above)")
        }
        finding.subject = subject
        return finding
    }

    /// The N of /dev/i2c-N for i2cdetect, or "N".
    private func busNumber(_ configuration: BoardConfiguration, _ bus: String) -> String {
        let path: String?
        switch configuration.buses[bus]?.kind {
        case .device(let device)?: path = device
        case .adapter(let adapter)?: path = try? LinuxI2CBus.devicePath(adapterNamed: adapter, sysfsDevices: system.path("/sys/bus/i2c/devices"))
        case .emulated?, nil: path = nil
        }
        return path.flatMap(Self.adapterNumber) ?? "N"
    }

    static func adapterNumber(_ path: String) -> String? {
        // The digits after the last "i2c-" (/dev/i2c-1 → 1).
        let parts = path.split(separator: "i2c-", omittingEmptySubsequences: false)
        guard parts.count > 1, let digits = parts.last else { return nil }
        return !digits.isEmpty && digits.allSatisfy(\.isNumber) ? String(digits) : nil
    }

    /// The node, its access for the service user, and an open adapter to
    /// probe with when this user may open it.
    private func checkBusDevice(name: String, path: String) -> ([DoctorFinding], LinuxI2CBus?) {
        let subject = "bus \(name)"
        guard let node = SystemInspector.node(at: path) else {
            let present = system.list("/sys/class/i2c-dev").map { "/dev/\($0)" }
            let here = present.isEmpty ? "no I2C adapters here" : "adapters here: \(present.joined(separator: ", "))"
            return ([DoctorFinding(.fail, subject, "\(path) does not exist (\(here))", fix: missingBusFix(name: name, path: path))], nil)
        }
        guard node.isCharacterDevice else {
            return ([DoctorFinding(
                .fail, subject, "\(path) is not a character device (\(node.description))",
                fix: "set buses.\(name).device to an i2c-dev node such as /dev/i2c-1 (`i2cdetect -l` lists them)"
            )], nil)
        }
        var findings: [DoctorFinding] = []
        var access = ""
        if let account {
            if node.readWritable(uid: account.uid, groups: serviceGroupIDs) {
                access = "; user \(account.name) may open it"
            } else {
                findings.append(DoctorFinding(
                    .fail, subject, "\(path) (\(node.description)) is not readable and writable by user \(account.name)",
                    fix: "install the udev rule (scripts/install puts it in /usr/lib/udev/rules.d/99-blecontrol.rules), then `sudo udevadm trigger --subsystem-match=i2c-dev`"
                ))
            }
        }
        do {
            let bus = try LinuxI2CBus(path: path, logger: quietLogger, retries: 0)
            let how = bus.usesSMBus ? "SMBus only" : "plain I2C"
            findings.insert(DoctorFinding(.ok, subject, "\(path) (\(node.description), \(how))\(access)"), at: 0)
            return (findings, bus)
        } catch LinuxI2CBus.OpenError.permissionDenied {
            findings.insert(DoctorFinding(
                .warn, subject, "\(path) (\(node.description)) present\(access), but \(currentUser) may not open it to probe the chips",
                fix: "run `sudo blecontrol doctor`, or add yourself to group \(SystemInspector.groupName(node.gid))"
            ), at: 0)
        } catch {
            findings.insert(DoctorFinding(.fail, subject, "\(error)", fix: missingBusFix(name: name, path: path)), at: 0)
        }
        return (findings, nil)
    }

    /// The most specific fix for a missing /dev/i2c-N.
    private func missingBusFix(name: String, path: String) -> String {
        if !system.exists("/sys/class/i2c-dev") {
            return "load the i2c-dev module: `sudo modprobe i2c-dev` (loaded at boot by /usr/lib/modules-load.d/blecontrol.conf once installed)"
        }
        let number = Self.adapterNumber(path)
        if let number, system.exists("/sys/bus/i2c/devices/i2c-\(number)") || system.exists("/sys/class/i2c-adapter/i2c-\(number)") {
            return "the adapter exists but udev made no \(path): `sudo udevadm trigger --subsystem-match=i2c-dev`"
        }
        return raspberryPiI2CAdvice(name: name)
            ?? "enable the bus (Raspberry Pi: dtparam=i2c_arm=on in config.txt, then reboot) or set buses.\(name).device to a bus `i2cdetect -l` lists"
    }

    /// How a Raspberry Pi's header bus is enabled, nil on other machines.
    /// The Pi 5's header bus is on its RP1 chip, where Raspberry Pi OS's
    /// dtparam=i2c_arm=on enables it as on the other models; a kernel
    /// without an RP1 driver has no header bus at all.
    private func raspberryPiI2CAdvice(name: String) -> String? {
        guard system.raspberryPiModel() != nil else { return nil }
        if let missing = missingRP1Driver() { return missing }
        let config = system.configTxtPath() ?? "/boot/firmware/config.txt"
        let rp1 = system.isRaspberryPi5() ? " (on a Pi 5 that is the RP1 chip's i2c1)" : ""
        if system.configTxtEnablesI2C(config) {
            return "\(config) enables I2C\(rp1): reboot if you just added it; otherwise set buses.\(name).device to a bus `i2cdetect -l` lists"
        }
        return "enable the header's I2C bus\(rp1): add dtparam=i2c_arm=on to \(config) (or `sudo raspi-config nonint do_i2c 0`) and reboot"
    }
}
