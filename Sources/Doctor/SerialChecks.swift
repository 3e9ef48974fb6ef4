import Board
import CMosquitto
import Reactor

#if canImport(Glibc)
import Glibc
#endif

/// The transports that need files and devices: MQTT (the library, its
/// password and certificate files, the broker's port) and an HM-10 on a UART.
extension Context {
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
}
