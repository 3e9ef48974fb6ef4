import BlueZ
import Board
import CMosquitto
import Control
import DBus
import Reactor
import Hardware
import LinuxHardware
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// What `blecontrol doctor` checks against.
public struct DoctorOptions: Sendable {
    /// Where the installed service reads its board file.
    public static let installedBoardPath = "/etc/blecontrol/board.yaml"
    /// The user the systemd unit runs blecontrold as.
    public static let serviceUser = ControlClient.serviceUser
    /// The groups the unit gives that user (SupplementaryGroups=).
    public static let serviceGroups = ["i2c", "gpio", "bluetooth", "dialout"]

    /// The board file; nil: ``installedBoardPath`` if it exists, else the
    /// built-in simulator board.
    public var boardPath: String?
    /// The daemon's control socket; nil: `$BLECONTROL_SOCKET`, else the
    /// board file's `control.socket`.
    public var socketPath: String?
    /// Where `/proc`, `/sys`, `/boot`, `/etc` and `/var` are read, and the GPIO chips.
    public var system: SystemInspector
    public var environment: [String: String]

    public init(
        boardPath: String? = nil,
        socketPath: String? = nil,
        system: SystemInspector = SystemInspector(),
        environment: [String: String] = Doctor.processEnvironment()
    ) {
        self.boardPath = boardPath
        self.socketPath = socketPath
        self.system = system
        self.environment = environment
    }
}

/// The checks behind `blecontrol doctor`: the board file, the I2C buses and
/// the chips on them, the LED's and switches' GPIO lines, the service user,
/// the systemd unit, the system under it (watchdog, boot-time all-off,
/// journal, file systems), bluetoothd and the adapter, and the running
/// daemon. Every warning and failure carries one line saying what to do.
///
/// Nothing here changes the machine. The chips are probed with reads only,
/// which is safe while the daemon drives the same bus; each GPIO line is
/// requested for an instant (driven to its inactive level: the LED dark, a
/// switch off) and released, unless the daemon holds it.
///
/// A board whose buses and LED are all emulated (the simulator) needs none
/// of the hardware, and runs without the service user or BlueZ: there those
/// checks say "emulated: nothing to check" or warn instead of failing.
public enum Doctor {
    /// The process's environment as a dictionary.
    public static func processEnvironment() -> [String: String] {
        var result: [String: String] = [:]
        var pointer = environ
        while let entry = pointer.pointee {
            let text = String(cString: entry)
            if let equals = text.firstIndex(of: "=") {
                result[String(text[..<equals])] = String(text[text.index(after: equals)...])
            }
            pointer += 1
        }
        return result
    }

    /// Where a symbolic link points, nil if it is not one.
    static func linkTarget(_ path: String) -> String? {
        var buffer = [CChar](repeating: 0, count: 4096)
        let count = readlink(path, &buffer, buffer.count - 1)
        guard count > 0 else { return nil }
        return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    public static func run(_ options: DoctorOptions) -> DoctorReport {
        var context = Context(options: options)
        let boardSection = context.checkBoard()
        var sections = [boardSection]
        if let configuration = context.configuration {
            sections.append(context.checkI2C(configuration))
            sections.append(context.checkGPIO(configuration))
            if let serial = configuration.serial { sections.append(context.checkSerial(serial)) }
            if let mqtt = configuration.mqtt { sections.append(context.checkMQTT(mqtt)) }
        }
        sections.append(context.checkService())
        sections.append(context.checkSystem())
        sections.append(context.checkBluetooth())
        sections.append(context.checkDaemon())
        return DoctorReport(boardSource: context.boardSource, sections: sections)
    }
}

/// State shared by the checks of one run.
struct Context {
    let options: DoctorOptions
    var system: SystemInspector { options.system }
    var boardPath: String?
    var boardSource: String
    var configuration: BoardConfiguration?
    /// The service user, looked up once.
    let account: SystemInspector.Account?
    /// Group ids the service runs with: the user's own plus SupplementaryGroups=.
    let serviceGroupIDs: [UInt32]
    let currentUser: String
    private let quietLogger = Logger(label: "blecontrol.doctor") { _ in SwiftLogNoOpLogHandler() }

    init(options: DoctorOptions) {
        self.options = options
        boardPath = options.boardPath
            ?? (Files.exists(DoctorOptions.installedBoardPath) ? DoctorOptions.installedBoardPath : nil)
        boardSource = boardPath ?? "(built-in simulator board)"
        account = SystemInspector.account(named: DoctorOptions.serviceUser)
        serviceGroupIDs = (account?.groups ?? []) + DoctorOptions.serviceGroups.compactMap(SystemInspector.groupID(named:))
        currentUser = SystemInspector.userName(geteuid())
    }

    /// True when the board needs real hardware (a device bus or a GPIO LED).
    var isRealBoard: Bool {
        guard let configuration else { return boardPath != nil }
        if case .gpio? = configuration.led { return true }
        return configuration.buses.values.contains { $0.kind != .emulated }
    }

    /// FAIL on a real board, WARN where the simulator can do without it.
    var neededLevel: DoctorLevel { isRealBoard ? .fail : .warn }

    // MARK: Board file

    mutating func checkBoard() -> DoctorSection {
        var findings: [DoctorFinding] = []
        do throws(BoardFileError) {
            let loaded: BoardConfiguration
            if let boardPath {
                loaded = try BoardFile.load(path: boardPath)
            } else {
                loaded = try BoardFile.parse(EmbeddedBoards.simulator, path: EmbeddedBoards.simulatorPath)
            }
            configuration = loaded
            let kind = isRealBoard ? "" : "; every bus and the LED are emulated"
            findings.append(DoctorFinding(.ok, "board file", "\(boardSource) is valid (board \"\(loaded.name)\"\(kind))"))
        } catch {
            let path = boardPath ?? EmbeddedBoards.simulatorPath
            let more = error.problems.count > 1 ? " (and \(error.problems.count - 1) more)" : ""
            findings.append(DoctorFinding(
                .fail, "board file", "\(error.problems.first?.description ?? "invalid")\(more)",
                fix: "edit \(path) at the line shown; `blecontrold --board \(path) --check-board` lists every problem and re-checks"
            ))
            findings.append(DoctorFinding(.warn, "hardware", "not checked: the board file says what to check"))
        }
        return DoctorSection(title: "Board", findings: findings)
    }

    // MARK: I2C

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

    // MARK: Serial (an HM-10 on a UART)

    /// transports.mqtt: the library, the files it names (the password file
    /// readable by the service and by nobody else), and the broker's port.
    func checkMQTT(_ mqtt: MQTTConfiguration) -> DoctorSection {
        var findings: [DoctorFinding] = []
        var error = [CChar](repeating: 0, count: 256)
        if let api = bc_mosquitto_load(&error, error.count) {
            findings.append(DoctorFinding(.ok, "libmosquitto", "\(api.pointee.major).\(api.pointee.minor).\(api.pointee.revision)"))
        } else {
            findings.append(DoctorFinding(.fail, "libmosquitto", String(decoding: error.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self),
                                          fix: "sudo apt install libmosquitto1"))
        }
        let files = [("password file", mqtt.passwordFile), ("CA file", mqtt.caFile), ("certificate", mqtt.certFile), ("key file", mqtt.keyFile)]
        for case let (what, path?) in files {
            let subject = "MQTT \(what) \(path)"
            guard let node = SystemInspector.node(at: system.path(path)) else {
                findings.append(DoctorFinding(.fail, subject, "does not exist", fix: "create it, or correct transports.mqtt in the board file"))
                continue
            }
            if let account, !node.readable(uid: account.uid, groups: serviceGroupIDs) {
                findings.append(DoctorFinding(.fail, subject, "not readable by user \(account.name)",
                                              fix: "sudo chgrp blecontrol \(path) && sudo chmod 0640 \(path)"))
            } else if what == "password file" || what == "key file", node.mode & 0o004 != 0 {
                findings.append(DoctorFinding(.warn, subject, "readable by everyone (\(node.description))",
                                              fix: "sudo chgrp blecontrol \(path) && sudo chmod 0640 \(path)"))
            } else {
                findings.append(DoctorFinding(.ok, subject, node.description))
            }
        }
        let broker = "\(mqtt.host):\(mqtt.port)"
        // From this process, outside the unit's sandbox: what the broker
        // does, not what the service may do (serviceReach says that).
        if let failure = Sockets.probeTCP(host: mqtt.host, port: mqtt.port, timeout: .seconds(3)) {
            findings.append(DoctorFinding(.fail, "MQTT broker \(broker)", "not reachable from doctor's own process: \(failure)",
                                          fix: "start the broker, or correct transports.mqtt.broker; `blecontrol fleet --mqtt \(broker)` tries it too"))
        } else {
            findings.append(DoctorFinding(.ok, "MQTT broker \(broker)", "accepts TCP connections from doctor's own process\(mqtt.tls ? " (TLS is checked when the daemon connects)" : "")"))
        }
        if let service = serviceReach(host: mqtt.host, port: mqtt.port) { findings.append(service) }
        return DoctorSection(title: "MQTT", findings: findings)
    }

    func checkSerial(_ serial: SerialConfiguration) -> DoctorSection {
        var findings: [DoctorFinding] = []
        let subject = "UART \(serial.device)"
        // /dev/serial0 is a link to the UART the Pi's firmware chose for the
        // header (ttyS0, the mini UART, or ttyAMA0, the PL011).
        let resolved = Doctor.linkTarget(system.path(serial.device)).map { $0.split(separator: "/").last.map(String.init) ?? $0 }
            ?? (serial.device.split(separator: "/").last.map(String.init) ?? serial.device)
        if !system.exists(serial.device) {
            findings.append(DoctorFinding(
                .fail, subject, "does not exist",
                fix: system.raspberryPiModel() != nil
                    ? "add `enable_uart=1` to config.txt (or `sudo raspi-config nonint do_serial_hw 0`) and reboot"
                    : "plug in the USB serial adapter, or set transports.serial.device to the port `ls /dev/tty{S,USB,ACM}*` shows"
            ))
        } else {
            var line = "\(serial.device)\(resolved != serial.device.split(separator: "/").last.map(String.init) ? " → \(resolved)" : ""), \(serial.baud) baud 8N1"
            if let node = SystemInspector.node(at: system.path(serial.device)) {
                line += " (\(node.description))"
                if let account, !node.readWritable(uid: account.uid, groups: serviceGroupIDs) {
                    findings.append(DoctorFinding(
                        .fail, subject, "not readable and writable by user \(account.name)",
                        fix: "the service user needs group dialout: `sudo systemd-sysusers blecontrol.conf`"
                    ))
                }
            }
            findings.insert(DoctorFinding(.ok, subject, line), at: 0)
        }
        if let config = system.configTxtPath(), system.raspberryPiModel() != nil {
            let settings = system.configTxtSettings(config)
            if !settings.contains("enable_uart=1") {
                findings.append(DoctorFinding(
                    .fail, "config.txt", "\(config) does not enable the header UART",
                    fix: "add `enable_uart=1` to \(config) (or `sudo raspi-config nonint do_serial_hw 0`) and reboot"
                ))
            }
            // On Pis with onboard Bluetooth the PL011 (ttyAMA0) is the
            // Bluetooth chip's unless an overlay moves it.
            let bluetoothMoved = settings.contains { $0.hasPrefix("dtoverlay=disable-bt") || $0.hasPrefix("dtoverlay=miniuart-bt") }
            if resolved == "ttyAMA0", !bluetoothMoved, !system.bluetoothAdapters().isEmpty {
                findings.append(DoctorFinding(
                    .warn, subject, "ttyAMA0 carries the onboard Bluetooth on this Pi",
                    fix: "use /dev/serial0, or add `dtoverlay=disable-bt` (or miniuart-bt) to \(config) and reboot"
                ))
            }
        }
        let consoles = (system.read("/proc/cmdline") ?? "").split(separator: " ").compactMap { word -> String? in
            guard word.hasPrefix("console=") else { return nil }
            return String(word.dropFirst("console=".count).split(separator: ",").first ?? "")
        }
        let deviceName = serial.device.split(separator: "/").last.map(String.init) ?? serial.device
        if let console = consoles.first(where: { $0 == deviceName || $0 == resolved || ($0 == "serial0" && serial.device == "/dev/serial0") }) {
            findings.append(DoctorFinding(
                .fail, subject, "the kernel's console is on it (console=\(console) in the kernel command line): its output would reach the module",
                fix: "remove `console=\(console),115200` from cmdline.txt (`sudo raspi-config nonint do_serial_cons 1`) and reboot"
            ))
        } else {
            findings.append(DoctorFinding(.ok, "console", "not on \(deviceName)"))
        }
        return DoctorSection(title: "Serial", findings: findings)
    }

    // MARK: Service

    /// The installed service's unit: what runs the daemon, and whose
    /// sandbox its connections go through.
    static let serviceUnit = "blecontrold.service"

    func checkService() -> DoctorSection {
        var findings: [DoctorFinding] = []
        let user = DoctorOptions.serviceUser
        if let account {
            var missing: [String] = []
            var notMember: [String] = []
            for group in DoctorOptions.serviceGroups {
                guard let gid = SystemInspector.groupID(named: group) else {
                    missing.append(group)
                    continue
                }
                if !account.groups.contains(gid) { notMember.append(group) }
            }
            let groups = account.groups.map(SystemInspector.groupName).joined(separator: ", ")
            findings.append(DoctorFinding(.ok, "user \(user)", "uid \(account.uid), groups \(groups)"))
            if !missing.isEmpty {
                findings.append(DoctorFinding(
                    neededLevel, "groups", "\(missing.joined(separator: ", ")) missing: the unit's SupplementaryGroups= would keep it from starting",
                    fix: "`sudo systemd-sysusers blecontrol.conf` creates them"
                ))
            }
            if !notMember.isEmpty {
                findings.append(DoctorFinding(
                    .warn, "groups", "\(user) is not in \(notMember.joined(separator: ", ")) (the unit adds them with SupplementaryGroups=)",
                    fix: "`sudo usermod -aG \(notMember.joined(separator: ",")) \(user)`"
                ))
            }
        } else {
            findings.append(DoctorFinding(
                neededLevel, "user \(user)", "does not exist\(isRealBoard ? "" : " (the simulator does not need it)")",
                fix: "install (scripts/install or the .deb), or `sudo systemd-sysusers blecontrol.conf` with /usr/lib/sysusers.d/blecontrol.conf in place"
            ))
        }
        if let unit = unitFinding() { findings.append(unit) }
        return DoctorSection(title: "Service", findings: findings)
    }

    /// blecontrold.service as systemd sees it; nil where it does not matter.
    /// On a simulated board the installed unit is not what is being checked,
    /// so its trouble is a warning there.
    private func unitFinding() -> DoctorFinding? {
        guard var finding = serviceUnitFinding() else { return nil }
        if !isRealBoard && finding.level == .fail { finding.level = .warn }
        return finding
    }

    private func serviceUnitFinding() -> DoctorFinding? {
        let subject = "blecontrold.service"
        guard Files.exists( "/run/systemd/system") else {
            return isRealBoard ? DoctorFinding(.warn, subject, "not checked: systemd is not running here") : nil
        }
        let show = ["show", Self.serviceUnit, "--property=LoadState,ActiveState,SubState,UnitFileState,Result"]
        guard let text = system.run("/usr/bin/systemctl", show) ?? system.run("/bin/systemctl", show) else {
            return DoctorFinding(.warn, subject, "not checked: systemctl did not answer")
        }
        var properties: [String: String] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            if parts.count == 2 { properties[String(parts[0])] = String(parts[1]) }
        }
        let load = properties["LoadState"] ?? "", active = properties["ActiveState"] ?? ""
        let sub = properties["SubState"] ?? "", enabled = properties["UnitFileState"] ?? ""
        if load == "not-found" {
            return isRealBoard
                ? DoctorFinding(.warn, subject, "not installed", fix: "install it: scripts/install (or the .deb from scripts/build-deb)")
                : nil
        }
        let state = "\(active) (\(sub)), \(enabled.isEmpty ? "unknown" : enabled)"
        switch active {
        case "active", "reloading", "activating":
            if enabled != "enabled" && enabled != "static" {
                return DoctorFinding(.warn, subject, state + ": will not start at boot", fix: "`sudo systemctl enable blecontrold`")
            }
            return DoctorFinding(.ok, subject, state)
        case "failed":
            return DoctorFinding(
                .fail, subject, "\(state), result \(properties["Result"] ?? "?")",
                fix: "`journalctl -u blecontrold -b -e` says why; after fixing: `sudo systemctl reset-failed blecontrold && sudo systemctl restart blecontrold`"
            )
        default:
            return DoctorFinding(isRealBoard ? .fail : .warn, subject, state, fix: "`sudo systemctl enable --now blecontrold`")
        }
    }

    // MARK: Bluetooth

    func checkBluetooth() -> DoctorSection {
        var findings: [DoctorFinding] = []
        // An invalid board file: check what a default board would need.
        let ble = configuration?.ble ?? BLEConfiguration(enabled: true, name: "", adapter: "hci0")
        guard ble.enabled else {
            findings.append(DoctorFinding(.ok, "BLE", "disabled in the board file: nothing to check"))
            return DoctorSection(title: "Bluetooth", findings: findings)
        }
        let level = neededLevel

        // Any user can name a process bluetoothd: only root's is BlueZ's,
        // and nothing of the others is read or run.
        let named = system.processes(named: "bluetoothd")
        let bluetoothd = named.first(where: \.isRoot)
        if let bluetoothd {
            let version = bluetoothdVersion()
            findings.append(DoctorFinding(.ok, "bluetoothd", "running (pid \(bluetoothd.pid)), \(version.map { "BlueZ \($0)" } ?? "version unknown (no root-owned bluetoothd in the usual places answered --version, and dpkg lists no bluez)")"))
            if let version, Self.isOlder(version, than: [5, 50]) {
                findings.append(DoctorFinding(
                    .warn, "bluetoothd", "BlueZ \(version) is older than 5.50: its LE advertising and GATT server interfaces may need --experimental",
                    fix: "upgrade bluez (Raspberry Pi OS bookworm ships 5.66)"
                ))
            }
            findings.append(pairingPopUp(pid: bluetoothd.pid))
        } else {
            findings.append(DoctorFinding(
                level, "bluetoothd", "not running\(isRealBoard ? "" : " (the simulator runs on TCP without it)")",
                fix: "`sudo apt install bluez && sudo systemctl enable --now bluetooth`"
            ))
        }
        for impostor in named where !impostor.isRoot {
            let user = impostor.uids.map { SystemInspector.userName($0.real) } ?? "an unknown user"
            findings.append(DoctorFinding(
                .warn, "bluetoothd", "pid \(impostor.pid) is named bluetoothd but runs as \(user), not root: not BlueZ's, ignored",
                fix: "`ps -o user,pid,args -p \(impostor.pid)` shows what it is"
            ))
        }

        let adapter = ble.adapter
        let adapters = system.bluetoothAdapters()
        if adapters.contains(adapter) {
            findings.append(DoctorFinding(.ok, "adapter \(adapter)", "present"))
            let switches = system.rfkillSwitches(for: adapter)
            if switches.isEmpty {
                findings.append(DoctorFinding(.ok, "rfkill", "no switch for \(adapter)"))
            } else if let hard = switches.first(where: \.hardBlocked) {
                findings.append(DoctorFinding(
                    level, "rfkill", "\(hard.name) is hard-blocked",
                    fix: "a hardware switch or the firmware blocks the radio: check for an airplane-mode switch; `rfkill list` shows it"
                ))
            } else if let soft = switches.first(where: \.softBlocked) {
                findings.append(DoctorFinding(level, "rfkill", "\(soft.name) is soft-blocked", fix: "`sudo rfkill unblock bluetooth`"))
            } else {
                findings.append(DoctorFinding(.ok, "rfkill", "\(switches.map(\.name).joined(separator: ", ")) not blocked"))
            }
            findings.append(adapterPowered(adapter, level: level, bluetoothdRunning: bluetoothd != nil))
        } else {
            let others = adapters.filter { $0 != adapter }
            let fix: String
            if let other = others.first {
                fix = "set ble.adapter: \(other) in the board file"
            } else if system.raspberryPiModel() != nil {
                fix = onboardRadioFix()
            } else {
                fix = "plug in a Bluetooth LE adapter; `bluetoothctl list` shows the adapters bluetoothd uses"
            }
            let present = others.isEmpty ? "no adapters" : "adapters: \(others.joined(separator: ", "))"
            findings.append(DoctorFinding(level, "adapter \(adapter)", "missing (\(present))", fix: fix))
        }
        return DoctorSection(title: "Bluetooth", findings: findings)
    }

    /// What brings up a Pi's onboard radio on this system: Raspberry Pi OS
    /// attaches it from user space (hciuart.service); Debian's kernel, and
    /// so this project's image, binds it itself through the device tree's
    /// serdev node (hci_uart with btbcm), which loads the controller's patch
    /// from bluez-firmware.
    private func onboardRadioFix() -> String {
        let config = system.configTxtPath() ?? "/boot/firmware/config.txt"
        let settings = system.configTxtSettings(config)
        var steps: [String] = []
        if settings.contains(where: { $0.hasPrefix("dtoverlay=disable-bt") }) {
            steps.append("remove dtoverlay=disable-bt from \(config) and reboot")
        }
        if system.hasHciuartService() {
            steps.append("the built-in radio needs a running hciuart.service (`systemctl status hciuart`)")
        } else {
            steps.append("the kernel binds the built-in radio itself (serdev hci_uart and btbcm; there is no hciuart.service here): `dmesg | grep -i -e hci_uart -e bluetooth` says why it did not")
            if system.isBLEControlImage(), !settings.contains("dtoverlay=blecontrol") {
                steps.append("put the `dtoverlay=blecontrol` line back in \(config) (it comes from /etc/default/raspi-firmware-custom: `sudo update-initramfs -u` rewrites config.txt) and reboot")
            }
            let patches = ["/lib/firmware/brcm", "/usr/lib/firmware/brcm"].flatMap { system.list($0) }.filter { $0.hasSuffix(".hcd") }
            if patches.isEmpty {
                steps.append("install the controller's patch: `sudo apt install bluez-firmware` (/lib/firmware/brcm/*.hcd)")
            }
        }
        return steps.joined(separator: "; ") + "; or plug in a USB adapter"
    }

    /// Whether a connecting iPhone gets a pairing pop-up nobody asked for:
    /// bluetoothd's GATT client reads the phone's Battery Level (battery
    /// plugin), iOS refuses it to an unpaired device, and bluetoothd then
    /// raises the link's security (an SMP Security Request). Any of the
    /// levers stops it: the battery plugin left out (`-P battery`, what the
    /// package's drop-in for bluetooth.service does), no GATT client on
    /// incoming connections (main.conf `[General] ReverseServiceDiscovery =
    /// false`, or `[GATT] Client = false` from BlueZ 5.74).
    private func pairingPopUp(pid: Int32) -> DoctorFinding {
        let subject = "iPhone pairing pop-up"
        let arguments = (system.read("/proc/\(pid)/cmdline") ?? "").split(separator: "\0").map(String.init)
        var disabled: [String] = []
        for (index, argument) in arguments.enumerated() {
            var value: String?
            if argument == "-P" || argument == "--noplugin", index + 1 < arguments.count { value = arguments[index + 1] }
            else if argument.hasPrefix("--noplugin=") { value = String(argument.dropFirst("--noplugin=".count)) }
            else if argument.hasPrefix("-P"), argument.count > 2 { value = String(argument.dropFirst(2)) }
            if let value { disabled += value.split(separator: ",").map { String($0).trimmed } }
        }
        if disabled.contains("battery") || disabled.contains("*") {
            return DoctorFinding(.ok, subject, "prevented: bluetoothd runs without its battery plugin (-P battery)")
        }
        let settings = SystemInspector.iniSettings(system.read("/etc/bluetooth/main.conf") ?? "")
        if settings["General.ReverseServiceDiscovery"]?.lowercased() == "false" {
            return DoctorFinding(.ok, subject, "prevented: main.conf ReverseServiceDiscovery = false")
        }
        if settings["GATT.Client"]?.lowercased() == "false" {
            return DoctorFinding(.ok, subject, "prevented: main.conf [GATT] Client = false")
        }
        return DoctorFinding(
            .warn, subject,
            "bluetoothd reads a connecting iPhone's battery level, which iOS refuses before pairing, and then asks the phone to pair: it shows a pop-up nobody asked for",
            fix: "the package's drop-in for bluetooth.service leaves the battery plugin out: "
                + "/usr/lib/systemd/system/bluetooth.service.d/blecontrol.conf, then `sudo systemctl daemon-reload && sudo systemctl restart bluetooth`"
        )
    }

    /// Asks bluetoothd itself (org.bluez Adapter1.Powered over the system
    /// bus), the same way the BLE transport sees the adapter.
    private func adapterPowered(_ adapter: String, level: DoctorLevel, bluetoothdRunning: Bool) -> DoctorFinding {
        let subject = "adapter \(adapter) powered"
        let fix = "`bluetoothctl power on` (or board file ble.power_on: true, the default, lets blecontrold do it)"
        // A fake system root (tests) has no bus to ask.
        guard system.root == "/" || system.root.isEmpty else {
            return DoctorFinding(.warn, subject, "not checked (--system-root: no system bus to ask)", fix: fix)
        }
        guard bluetoothdRunning else {
            return DoctorFinding(.warn, subject, "not checked (bluetoothd is not running)", fix: fix)
        }
        var logger = Logger(label: "blecontrol.doctor")
        logger.logLevel = .critical
        do {
            let loop = try EventLoop(name: "doctor-dbus")
            loop.start()
            defer { loop.stop() }
            let connection = try DBusConnection.system(loop: loop, logger: logger)
            defer { connection.close() }
            let reply = try connection.callAndWait(
                destination: "org.bluez", path: "/org/bluez/\(adapter)", interface: "org.freedesktop.DBus.Properties",
                method: "Get", arguments: [.string("org.bluez.Adapter1"), .string("Powered")], timeout: .seconds(2)
            )
            switch reply.first {
            case .variant(.bool(true))?, .bool(true)?:
                return DoctorFinding(.ok, subject, "yes")
            case .variant(.bool(false))?, .bool(false)?:
                return DoctorFinding(level, subject, "no", fix: fix)
            default:
                return DoctorFinding(.warn, subject, "unexpected answer from bluetoothd: \("\(reply)".printable)", fix: fix)
            }
        } catch {
            return DoctorFinding(.warn, subject, "could not ask bluetoothd: \("\(error)".printable)", fix: "run doctor as root or a member of group bluetooth; \(fix)")
        }
    }

    /// Where distributions install bluetoothd.
    static let bluetoothdPaths = ["/usr/libexec/bluetooth/bluetoothd", "/usr/lib/bluetooth/bluetoothd", "/usr/sbin/bluetoothd", "/usr/bin/bluetoothd"]

    /// "5.66": `bluetoothd --version` of the first of ``bluetoothdPaths``
    /// that only root can have put there, else the bluez package's version.
    /// Never the running process's `/proc/PID/exe`: doctor runs as root,
    /// and that file is whatever its owner chose.
    private func bluetoothdVersion() -> String? {
        for candidate in Self.bluetoothdPaths where system.untrustedExecutable(candidate) == nil {
            if let text = system.run(system.path(candidate), ["--version"]),
               let first = text.split(whereSeparator: \.isWhitespace).first,
               first.first?.isNumber == true {
                return String(first)
            }
        }
        // 5.66-1+rpt1+deb12u2, 1:5.66-1: the upstream version.
        guard let package = system.installedPackageVersion("bluez") else { return nil }
        let upstream = package.split(separator: ":", maxSplits: 1).last ?? Substring(package)
        let version = upstream.prefix { $0.isNumber || $0 == "." }
        return version.isEmpty ? nil : String(version)
    }

    static func isOlder(_ version: String, than minimum: [Int]) -> Bool {
        let parts = version.split(separator: ".").map { Int($0) ?? 0 }
        for (index, wanted) in minimum.enumerated() {
            let have = index < parts.count ? parts[index] : 0
            if have != wanted { return have < wanted }
        }
        return false
    }

    // MARK: Daemon

    func checkDaemon() -> DoctorSection {
        var findings: [DoctorFinding] = []
        let socket = options.socketPath
            ?? options.environment["BLECONTROL_SOCKET"].flatMap { $0.isEmpty ? nil : $0 }
            ?? configuration?.controlSocketPath
            ?? ControlClient.defaultPath()
        let subject = "blecontrold"
        if Files.exists( socket), access(socket, W_OK) != 0, errno == EACCES {
            findings.append(DoctorFinding(
                .warn, subject, "\(currentUser) may not use the control socket \(socket)",
                fix: "`sudo usermod -aG blecontrol \(currentUser)` and log in again, or run `sudo blecontrol doctor`"
            ))
            return DoctorSection(title: "Daemon", findings: findings)
        }
        let status: StatusReport
        do {
            status = try ControlClient(path: socket, timeout: .seconds(3)).status()
        } catch let failure as ControlClient.Failure where failure.refused {
            findings.append(DoctorFinding(.fail, subject, failure.description, fix: "find out who made \(socket) and why; remove it, then start blecontrold"))
            return DoctorSection(title: "Daemon", findings: findings)
        } catch {
            let fix = isRealBoard
                ? "`sudo systemctl start blecontrold`; `journalctl -u blecontrold -e` says why it is not running"
                : "start it: scripts/simulator, or `blecontrold\(boardPath.map { " --board \($0)" } ?? "")`"
            findings.append(DoctorFinding(.fail, subject, "not reachable on \(socket)", fix: fix))
            return DoctorSection(title: "Daemon", findings: findings)
        }

        // The status's strings are the daemon's: printed through `printable`.
        let sessions = status.sessions.count == 1 ? "1 session" : "\(status.sessions.count) sessions"
        let transports = status.transports.named.map { "\($0.0) \($0.1.printable)" }.joined(separator: "; ")
        findings.append(DoctorFinding(
            .ok, subject,
            "\(status.version.printable) running board \"\(status.board.printable)\"\(status.simulated ? " (simulated)" : ""), up \(Int(status.uptimeSeconds)) s, \(sessions); \(transports)"
        ))
        if let configuration, status.board != configuration.name {
            findings.append(DoctorFinding(
                .warn, subject, "runs board \"\(status.board.printable)\", not \"\(configuration.name)\" from \(boardSource)",
                fix: "restart it to load the file: `sudo systemctl restart blecontrold`"
            ))
        }
        if let servo = status.servo {
            if servo.online {
                findings.append(DoctorFinding(.ok, "servo path", "PCA9685 online at \(servo.frequencyHz.fixed(1)) Hz, \(servo.scheduling.printable)"))
            } else {
                findings.append(DoctorFinding(
                    .fail, "servo path", "PCA9685 offline\(servo.error.map { ": \($0.printable)" } ?? "")",
                    fix: "check the PCA9685's wiring and address (the I2C checks above); the daemon retries on its own"
                ))
            }
            if let configuration, configuration.name == status.board, configuration.realtimePriority > 0, !servo.scheduling.hasPrefix("SCHED_FIFO") {
                findings.append(DoctorFinding(
                    .warn, "servo path", "asked for SCHED_FIFO \(configuration.realtimePriority), got \(servo.scheduling.printable)",
                    fix: "the unit's LimitRTPRIO= must be at least realtime.priority (`sudo systemctl edit blecontrold`), or set realtime.priority: 0"
                ))
            }
            if let failsafe = servo.failsafe {
                findings.append(DoctorFinding(.warn, "servo path", "failsafe active: \(failsafe.printable)", fix: "a central commands an output the one that left commanded (ANALOG_OUT_EN on for an ESC, then a value); or, at the board, `sudo blecontrol failsafe clear`"))
            }
        }
        if let lcd = status.lcd {
            if lcd.online {
                findings.append(DoctorFinding(.ok, "LCD", "online, \(lcd.columns)×\(lcd.rows)"))
            } else {
                findings.append(DoctorFinding(
                    .fail, "LCD", "offline\(lcd.error.map { ": \($0.printable)" } ?? "")",
                    fix: "check the backpack's wiring, address and 5 V supply (the I2C checks above)"
                ))
            }
        }
        if let led = status.led, let error = led.error {
            findings.append(DoctorFinding(.warn, "LED", error.printable, fix: "see the LED checks above"))
        }
        return DoctorSection(title: "Daemon", findings: findings)
    }
}
