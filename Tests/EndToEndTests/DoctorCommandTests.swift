import Foundation
import Testing
import TestSupport

/// The checkout's root, for the board files under board/.
private let repositoryRoot = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// A scratch directory removed when the test is done.
private final class ScratchDirectory {
    let url: URL
    init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("blecontrol-doctor-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }
    deinit { try? FileManager.default.removeItem(at: url) }

    /// Writes `text` at `relativePath`, creating the directories on the way.
    @discardableResult
    func write(_ relativePath: String, _ text: String) throws -> String {
        let file = url.appendingPathComponent(relativePath)
        try FileManager.default.createDirectory(at: file.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data(text.utf8).write(to: file)
        return file.path
    }

    func makeDirectory(_ relativePath: String) throws {
        try FileManager.default.createDirectory(at: url.appendingPathComponent(relativePath), withIntermediateDirectories: true)
    }
}

/// board/raspberry-pi.yaml with its bus moved to a device node that does not exist.
private func boardWithMissingBus(in scratch: ScratchDirectory) throws -> String {
    let pi = try String(contentsOf: repositoryRoot.appendingPathComponent("board/raspberry-pi.yaml"), encoding: .utf8)
    #expect(pi.contains("device: /dev/i2c-1"))
    return try scratch.write("board.yaml", pi.replacingOccurrences(of: "device: /dev/i2c-1", with: "device: /dev/i2c-99"))
}

/// The line of `output` that reports `subject`, and the fix printed under it.
private func finding(_ subject: String, in output: String) -> (line: String, fix: String?)? {
    let lines = output.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    guard let index = lines.firstIndex(where: { $0.contains(" \(subject): ") }) else { return nil }
    let next = index + 1 < lines.count ? lines[index + 1].trimmingCharacters(in: .whitespaces) : ""
    return (lines[index], next.hasPrefix("fix: ") ? String(next.dropFirst(5)) : nil)
}

private func level(of line: String) -> String {
    String(line.trimmingCharacters(in: .whitespaces).prefix { $0 != " " })
}

@Suite("blecontrol doctor, the command against a daemon", .serialized)
struct DoctorCommandTests {
    @Test("On the simulator board with the daemon running: emulated hardware, the daemon's status, exit 0")
    func simulator() throws {
        let daemon = try SimulatorDaemon()
        // On a loaded machine the doctor could otherwise ask before them.
        try daemon.waitForChipsOnline()
        let board = repositoryRoot.appendingPathComponent("board/simulator.yaml").path
        let result = try daemon.cli(["doctor", "--board", board])
        #expect(result.status == 0, "stdout:\n\(result.stdout)\nstderr:\n\(result.stderr)")

        for subject in ["bus main", "PCA9685 0x40 on main", "LCD backpack 0x27 on main", "LED"] {
            let line = try #require(finding(subject, in: result.stdout), "no \(subject) line in:\n\(result.stdout)").line
            #expect(level(of: line) == "OK")
            #expect(line.hasSuffix("emulated: nothing to check"), "\(line)")
        }
        let boardLine = try #require(finding("board file", in: result.stdout)).line
        #expect(level(of: boardLine) == "OK" && boardLine.contains("is valid (board \"simulator\""))
        let running = try #require(finding("blecontrold", in: result.stdout)).line
        #expect(level(of: running) == "OK")
        #expect(running.contains("running board \"simulator\" (simulated)"))
        #expect(running.contains("tcp 127.0.0.1:\(daemon.tcpPort)"))
        #expect(level(of: try #require(finding("servo path", in: result.stdout)).line) == "OK")
        #expect(try #require(finding("LCD", in: result.stdout)).line.contains("online, 16×2"))
        // Whatever this machine lacks (BlueZ, the service user) only warns on the simulator.
        #expect(!result.stdout.contains("FAIL "), "\(result.stdout)")
        #expect(result.stdout.contains(" 0 FAIL"))
        // Powered needs D-Bus: reported as not checked, never guessed.
        if let powered = finding("adapter hci0 powered", in: result.stdout) {
            #expect(level(of: powered.line) == "WARN" && powered.line.contains("not checked (needs the BLE transport)"))
        }
    }

    @Test("No daemon on the socket: FAIL with how to start it, exit 1")
    func noDaemon() throws {
        let scratch = try ScratchDirectory()
        let board = repositoryRoot.appendingPathComponent("board/simulator.yaml").path
        let socket = scratch.url.appendingPathComponent("nobody.sock").path
        let result = try run(Executables.cli, ["doctor", "--board", board, "--socket", socket])
        #expect(result.status == 1)
        let daemon = try #require(finding("blecontrold", in: result.stdout), "\(result.stdout)")
        #expect(level(of: daemon.line) == "FAIL" && daemon.line.contains("not reachable on \(socket)"))
        #expect(daemon.fix?.contains("scripts/simulator") == true)
    }

    @Test("A board file naming /dev/i2c-99: the bus FAILs with the fix, the chips are not probed, exit 1")
    func missingBus() throws {
        let scratch = try ScratchDirectory()
        let board = try boardWithMissingBus(in: scratch)
        let result = try run(Executables.cli, ["doctor", "--board", board, "--socket", scratch.url.appendingPathComponent("none.sock").path])
        #expect(result.status == 1, "\(result.stdout)")
        let bus = try #require(finding("bus i2c1", in: result.stdout), "\(result.stdout)")
        #expect(level(of: bus.line) == "FAIL")
        #expect(bus.line.contains("/dev/i2c-99 does not exist"))
        let fix = try #require(bus.fix)
        #expect(fix.contains("modprobe i2c-dev") || fix.contains("dtparam=i2c_arm=on") || fix.contains("udevadm trigger"), "\(fix)")
        let pca = try #require(finding("PCA9685 0x40 on i2c1", in: result.stdout)).line
        #expect(level(of: pca) == "WARN" && pca.contains("not probed"))
    }

    @Test("The fix names what is actually missing: the i2c-dev module, or the Pi's dtparam")
    func missingBusFixes() throws {
        let scratch = try ScratchDirectory()
        let board = try boardWithMissingBus(in: scratch)
        let socket = scratch.url.appendingPathComponent("none.sock").path

        // A machine without i2c-dev loaded: no /sys/class/i2c-dev.
        let bare = "bare"
        try scratch.makeDirectory("\(bare)/sys/class")
        try scratch.makeDirectory("\(bare)/proc")
        let noModule = try run(Executables.cli, ["doctor", "--board", board, "--socket", socket, "--system-root", scratch.url.appendingPathComponent(bare).path])
        let moduleFix = try #require(finding("bus i2c1", in: noModule.stdout)?.fix, "\(noModule.stdout)")
        #expect(moduleFix.contains("sudo modprobe i2c-dev"))

        // A Raspberry Pi with i2c-dev loaded but the header's bus not enabled.
        let pi = "pi"
        try scratch.makeDirectory("\(pi)/sys/class/i2c-dev/i2c-20")
        try scratch.write("\(pi)/proc/device-tree/model", "Raspberry Pi 4 Model B Rev 1.4\0")
        try scratch.write("\(pi)/boot/firmware/config.txt", "[all]\n#dtparam=i2c_arm=on\ndtparam=audio=on\n")
        let noBus = try run(Executables.cli, ["doctor", "--board", board, "--socket", socket, "--system-root", scratch.url.appendingPathComponent(pi).path])
        let bus = try #require(finding("bus i2c1", in: noBus.stdout), "\(noBus.stdout)")
        #expect(bus.line.contains("adapters here: /dev/i2c-20"))
        #expect(bus.fix?.contains("add dtparam=i2c_arm=on to /boot/firmware/config.txt") == true, "\(bus.fix ?? "no fix")")
        #expect(bus.fix?.contains("reboot") == true)
        #expect(noBus.status == 1)
    }

    @Test("BlueZ: bluetoothd found in /proc, a soft-blocked adapter FAILs with `rfkill unblock`")
    func bluetooth() throws {
        let scratch = try ScratchDirectory()
        let board = try boardWithMissingBus(in: scratch)
        let root = "machine"
        try scratch.write("\(root)/proc/4242/comm", "bluetoothd\n")
        try scratch.write("\(root)/proc/4242/status", "Name:\tbluetoothd\nUid:\t0\t0\t0\t0\n")
        try scratch.write("\(root)/proc/4243/comm", "bash\n")
        try scratch.write("\(root)/sys/class/bluetooth/hci0/rfkill3/name", "hci0\n")
        try scratch.write("\(root)/sys/class/bluetooth/hci0/rfkill3/type", "bluetooth\n")
        try scratch.write("\(root)/sys/class/bluetooth/hci0/rfkill3/soft", "1\n")
        try scratch.write("\(root)/sys/class/bluetooth/hci0/rfkill3/hard", "0\n")
        let result = try run(Executables.cli, [
            "doctor", "--board", board, "--socket", scratch.url.appendingPathComponent("none.sock").path,
            "--system-root", scratch.url.appendingPathComponent(root).path
        ])
        let bluetoothd = try #require(finding("bluetoothd", in: result.stdout), "\(result.stdout)")
        #expect(level(of: bluetoothd.line) == "OK" && bluetoothd.line.contains("running (pid 4242)"))
        #expect(level(of: try #require(finding("adapter hci0", in: result.stdout)).line) == "OK")
        let rfkill = try #require(finding("rfkill", in: result.stdout))
        #expect(level(of: rfkill.line) == "FAIL" && rfkill.line.contains("hci0 is soft-blocked"))
        #expect(rfkill.fix == "`sudo rfkill unblock bluetooth`")
        let powered = try #require(finding("adapter hci0 powered", in: result.stdout)).line
        #expect(level(of: powered) == "WARN" && powered.contains("not checked"))

        // Unblocked: the same adapter is OK.
        try scratch.write("\(root)/sys/class/bluetooth/hci0/rfkill3/soft", "0\n")
        let unblocked = try run(Executables.cli, [
            "doctor", "--board", board, "--socket", scratch.url.appendingPathComponent("none.sock").path,
            "--system-root", scratch.url.appendingPathComponent(root).path
        ])
        let line = try #require(finding("rfkill", in: unblocked.stdout)).line
        #expect(level(of: line) == "OK" && line.contains("hci0 not blocked"))
    }

    @Test("The iPhone pairing pop-up: WARN while bluetoothd runs its battery plugin, OK with -P battery or main.conf's levers")
    func pairingPopUp() throws {
        let scratch = try ScratchDirectory()
        let board = try boardWithMissingBus(in: scratch)
        let root = "machine"
        try scratch.write("\(root)/proc/4242/comm", "bluetoothd\n")
        try scratch.write("\(root)/proc/4242/status", "Name:\tbluetoothd\nUid:\t0\t0\t0\t0\n")
        func popUp() throws -> (line: String, fix: String?) {
            let result = try run(Executables.cli, [
                "doctor", "--board", board, "--socket", scratch.url.appendingPathComponent("none.sock").path,
                "--system-root", scratch.url.appendingPathComponent(root).path
            ])
            return try #require(finding("iPhone pairing pop-up", in: result.stdout), "\(result.stdout)")
        }
        // As Debian starts it.
        try scratch.write("\(root)/proc/4242/cmdline", "/usr/libexec/bluetooth/bluetoothd\0")
        let plain = try popUp()
        #expect(level(of: plain.line) == "WARN" && plain.line.contains("pop-up"), "\(plain.line)")
        #expect(plain.fix?.contains("/usr/lib/systemd/system/bluetooth.service.d/blecontrol.conf") == true)
        // The package's drop-in, and the other spellings of the option.
        for arguments in ["-P\0battery", "-Pbattery", "--noplugin=sap,battery", "-n\0-P\0*"] {
            try scratch.write("\(root)/proc/4242/cmdline", "/usr/libexec/bluetooth/bluetoothd\0\(arguments)\0")
            let fixed = try popUp()
            #expect(level(of: fixed.line) == "OK" && fixed.line.contains("battery plugin"), "\(arguments): \(fixed.line)")
        }
        // main.conf's levers, with the plugin running.
        try scratch.write("\(root)/proc/4242/cmdline", "/usr/libexec/bluetooth/bluetoothd\0")
        try scratch.write("\(root)/etc/bluetooth/main.conf", "[General]\n# ReverseServiceDiscovery = false\nName = x\n[GATT]\nClient = false\n")
        let client = try popUp()
        #expect(level(of: client.line) == "OK" && client.line.contains("[GATT] Client = false"), "\(client.line)")
        try scratch.write("\(root)/etc/bluetooth/main.conf", "[General]\nReverseServiceDiscovery=false\n")
        let reverse = try popUp()
        #expect(level(of: reverse.line) == "OK" && reverse.line.contains("ReverseServiceDiscovery"), "\(reverse.line)")
    }

    @Test("The HM-10's UART on a Pi: the device, enable_uart, the console on it, Bluetooth on ttyAMA0")
    func serialUART() throws {
        let scratch = try ScratchDirectory()
        let pi = try String(contentsOf: repositoryRoot.appendingPathComponent("board/raspberry-pi.yaml"), encoding: .utf8)
        let board = try scratch.write("board.yaml", pi.replacingOccurrences(of: "transports:\n", with: "transports:\n  serial: { device: /dev/ttyAMA0 }\n"))
        let root = "pi"
        try scratch.write("\(root)/proc/device-tree/model", "Raspberry Pi 4 Model B Rev 1.4\0")
        try scratch.write("\(root)/boot/firmware/config.txt", "[all]\ndtparam=i2c_arm=on\n#enable_uart=1\n")
        try scratch.write("\(root)/proc/cmdline", "console=ttyAMA0,115200 console=tty1 root=PARTUUID=1234 rootwait\n")
        try scratch.write("\(root)/sys/class/bluetooth/hci0/address", "b8:27:eb:00:00:01\n")
        let socket = scratch.url.appendingPathComponent("none.sock").path
        let result = try run(Executables.cli, ["doctor", "--board", board, "--socket", socket, "--system-root", scratch.url.appendingPathComponent(root).path])
        #expect(result.status == 1)
        #expect(result.stdout.contains("Serial"), "\(result.stdout)")
        let uart = result.stdout.split(separator: "\n").map(String.init).filter { $0.contains("UART /dev/ttyAMA0:") }
        #expect(uart.contains { level(of: $0) == "FAIL" && $0.contains("does not exist") }, "\(uart)")
        #expect(uart.contains { level(of: $0) == "FAIL" && $0.contains("console=ttyAMA0") }, "\(uart)")
        #expect(uart.contains { level(of: $0) == "WARN" && $0.contains("onboard Bluetooth") }, "\(uart)")
        let config = try #require(finding("config.txt", in: result.stdout), "\(result.stdout)")
        #expect(level(of: config.line) == "FAIL" && config.fix?.contains("enable_uart=1") == true)

        // Set up as it should be: the UART on, the console and Bluetooth elsewhere.
        try scratch.write("\(root)/boot/firmware/config.txt", "[all]\ndtparam=i2c_arm=on\nenable_uart=1\ndtoverlay=disable-bt\n")
        try scratch.write("\(root)/proc/cmdline", "console=tty1 root=PARTUUID=1234 rootwait\n")
        let fixed = try run(Executables.cli, ["doctor", "--board", board, "--socket", socket, "--system-root", scratch.url.appendingPathComponent(root).path])
        #expect(finding("config.txt", in: fixed.stdout) == nil, "\(fixed.stdout)")
        #expect(!fixed.stdout.contains("onboard Bluetooth"))
        #expect(level(of: try #require(finding("console", in: fixed.stdout)).line) == "OK")
    }

    @Test("transports.mqtt: libmosquitto, a password file everyone can read (WARN), a missing CA file and a broker that is not there (FAIL), then one that is")
    func mqtt() throws {
        let scratch = try ScratchDirectory()
        let password = try scratch.write("mqtt-password", "secret\n")
        chmod(password, 0o644)
        let simulator = try String(contentsOf: repositoryRoot.appendingPathComponent("board/simulator.yaml"), encoding: .utf8)
        func board(_ port: UInt16) throws -> String {
            try scratch.write("board-\(port).yaml", simulator.replacingOccurrences(of: "transports:\n", with: """
            transports:
              mqtt:
                broker: 127.0.0.1:\(port)
                username: robot
                password_file: \(password)
                ca_file: \(scratch.url.path)/missing-ca.pem

            """))
        }
        let socket = scratch.url.appendingPathComponent("none.sock").path
        let result = try run(Executables.cli, ["doctor", "--board", try board(1), "--socket", socket])
        #expect(result.status == 1)
        let lines = result.stdout.split(separator: "\n").map(String.init)
        #expect(lines.contains { level(of: $0) == (MosquittoBroker.available ? "OK" : "FAIL") && $0.contains("libmosquitto") }, "\(result.stdout)")
        #expect(lines.contains { level(of: $0) == "WARN" && $0.contains("MQTT password file") && $0.contains("readable by everyone") }, "\(result.stdout)")
        #expect(lines.contains { level(of: $0) == "FAIL" && $0.contains("MQTT CA file") && $0.contains("does not exist") }, "\(result.stdout)")
        #expect(lines.contains { level(of: $0) == "FAIL" && $0.contains("MQTT broker 127.0.0.1:1") && $0.contains("not reachable") }, "\(result.stdout)")

        guard MosquittoBroker.available else { return }
        let broker = try MosquittoBroker()
        let reachable = try run(Executables.cli, ["doctor", "--board", try board(broker.port), "--socket", socket])
        #expect(reachable.stdout.split(separator: "\n").contains { level(of: String($0)) == "OK" && $0.contains("MQTT broker 127.0.0.1:\(broker.port)") },
                "\(reachable.stdout)")
    }

    @Test("An invalid board file: FAIL with file:line and the --check-board hint, exit 1")
    func invalidBoard() throws {
        let scratch = try ScratchDirectory()
        let simulator = try String(contentsOf: repositoryRoot.appendingPathComponent("board/simulator.yaml"), encoding: .utf8)
        let board = try scratch.write("bad.yaml", simulator.replacingOccurrences(of: "frequency_hz: 50", with: "frequncy_hz: 50"))
        let result = try run(Executables.cli, ["doctor", "--board", board, "--socket", scratch.url.appendingPathComponent("none.sock").path])
        #expect(result.status == 1)
        let line = try #require(finding("board file", in: result.stdout), "\(result.stdout)")
        #expect(level(of: line.line) == "FAIL")
        #expect(line.line.contains("\(board):"))
        #expect(line.line.contains("frequncy_hz"))
        #expect(line.fix?.contains("--check-board") == true)
    }
}
