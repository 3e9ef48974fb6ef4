import Board
import DBus
import Logging
import Reactor

#if canImport(Glibc)
import Glibc
#endif

/// bluetoothd and the adapter: running, its version, powered, the onboard
/// radio's UART, and the pairing pop-up an iPhone would show.
extension Context {
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
}
