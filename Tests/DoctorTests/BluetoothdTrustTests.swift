import Foundation
@testable import Doctor
import Reactor
import Testing

/// The programs doctor asked to run, in order.
private final class RunRecorder: @unchecked Sendable {
    private let lock = NSLock()
    private var calls: [(String, [String])] = []
    let answer: String?

    init(answer: String?) { self.answer = answer }

    var runner: SystemInspector.ProgramRunner {
        { [self] executable, arguments in
            // dpkg-query is the system's own (its path fixed, root's): it
            // runs for real, on the made-up machine's database (--root).
            if executable == "/usr/bin/dpkg-query" { return Subprocess.output(of: executable, arguments) }
            lock.withLock { calls.append((executable, arguments)) }
            return answer
        }
    }

    var executables: [String] { lock.withLock { calls.map(\.0) } }
}

extension MadeUpMachine {
    /// A process in /proc: its name, its real and effective uid, its
    /// command line, and /proc/PID/exe pointing at `exe`.
    func process(_ pid: Int32, comm: String, uid: UInt32, cmdline: [String], exe: String) throws {
        try write("/proc/\(pid)/comm", comm + "\n")
        try write("/proc/\(pid)/status", "Name:\t\(comm)\nUmask:\t0022\nState:\tS (sleeping)\nPid:\t\(pid)\nUid:\t\(uid)\t\(uid)\t\(uid)\t\(uid)\nGid:\t\(uid)\t\(uid)\t\(uid)\t\(uid)\n")
        try write("/proc/\(pid)/cmdline", cmdline.map { $0 + "\0" }.joined())
        try link("/proc/\(pid)/exe", to: exe)
    }

    /// An executable file at `path`, with this owner and mode.
    func executable(_ path: String, owner: UInt32 = 0, mode: Int = 0o755) throws {
        try write(path, "#!/bin/sh\necho 9.99\n")
        try FileManager.default.setAttributes([.posixPermissions: mode, .ownerAccountID: owner], ofItemAtPath: root + path)
    }
}

@Suite("blecontrol doctor trusts nothing another user owns", .enabled(if: geteuid() == 0, "files of root's and of uid 65534 need root to make"))
struct BluetoothdTrustTests {
    /// A machine where uid 65534 runs a program it named bluetoothd, with a
    /// lower pid than root's bluetoothd, its command line saying the
    /// battery plugin is off (root's does not) and its exe its own file.
    static func machineWithImpostor() throws -> MadeUpMachine {
        let machine = try MadeUpMachine()
        try machine.write("/tmp/evil-bluetoothd", "#!/bin/sh\nid > /tmp/pwned\n")
        try machine.process(100, comm: "bluetoothd", uid: 65534, cmdline: ["/tmp/evil-bluetoothd", "-P", "battery"], exe: machine.root + "/tmp/evil-bluetoothd")
        try machine.process(200, comm: "bluetoothd", uid: 0, cmdline: ["/usr/libexec/bluetooth/bluetoothd"], exe: "/usr/libexec/bluetooth/bluetoothd")
        try machine.process(300, comm: "bash", uid: 65534, cmdline: ["bash"], exe: "/usr/bin/bash")
        return machine
    }

    /// The Bluetooth section of `machine`, its programs answering `answer`,
    /// and the programs it asked to run.
    static func bluetooth(_ machine: MadeUpMachine, answer: String) -> (section: DoctorSection, bluetoothd: [DoctorFinding], ran: [String]) {
        let recorder = RunRecorder(answer: answer)
        let section = context(machine, run: recorder.runner).checkBluetooth()
        return (section, section.findings.filter { $0.subject == "bluetoothd" }, recorder.executables)
    }

    @Test("A bluetoothd of uid 65534 with a lower pid than root's is ignored: its exe never run, its command line never read")
    func impostorIgnored() throws {
        let machine = try Self.machineWithImpostor()
        try machine.executable("/usr/libexec/bluetooth/bluetoothd")
        let (section, bluetoothd, ran) = Self.bluetooth(machine, answer: "5.72")
        #expect(bluetoothd.first?.level == .ok && bluetoothd.first?.detail == "running (pid 200), BlueZ 5.72", "\(bluetoothd)")
        #expect(bluetoothd.contains { $0.level == .warn && $0.detail.contains("pid 100 is named bluetoothd but runs as nobody") }, "\(bluetoothd)")
        #expect(!section.findings.contains { $0.detail.contains("pid 300") })
        // Root's command line keeps the battery plugin (WARN): uid 65534's "-P battery" was not read.
        let popUp = try #require(section.finding("iPhone pairing pop-up"))
        #expect(popUp.level == .warn, "\(popUp.detail)")
        // Only the packaged path, only with --version.
        #expect(ran == [machine.root + "/usr/libexec/bluetooth/bluetoothd"], "\(ran)")
        #expect(!ran.contains { $0.contains("/proc/") || $0.contains("evil") })
    }

    @Test("Only uid 65534's bluetoothd: not running, nothing of it run or read")
    func onlyImpostor() throws {
        let machine = try Self.machineWithImpostor()
        try machine.remove("/proc/200")
        let (section, bluetoothd, ran) = Self.bluetooth(machine, answer: "5.72")
        #expect(bluetoothd.first?.level == .fail && bluetoothd.first?.detail.hasPrefix("not running") == true, "\(bluetoothd)")
        #expect(section.finding("iPhone pairing pop-up") == nil)
        #expect(ran.isEmpty, "\(ran)")
    }

    @Test("A bluetoothd file another user could have written is not run: the version comes from dpkg-query instead")
    func untrustedVersionPaths() throws {
        let machine = try Self.machineWithImpostor()
        try machine.executable("/usr/libexec/bluetooth/bluetoothd", mode: 0o775)
        try machine.executable("/usr/lib/bluetooth/bluetoothd", owner: 65534)
        try machine.executable("/usr/sbin/bluetoothd")
        try FileManager.default.setAttributes([.posixPermissions: 0o777], ofItemAtPath: machine.root + "/usr/sbin")
        try machine.makeDirectory("/usr/bin")
        try machine.link("/usr/bin/bluetoothd", to: "/tmp/evil-bluetoothd")
        try machine.write("/var/lib/dpkg/status", """
            Package: bluez-firmware
            Status: install ok installed
            Version: 1.2-9

            Package: bluez
            Status: install ok installed
            Priority: optional
            Version: 5.66-1+rpt1+deb12u2
            Description: Bluetooth tools and daemons
             with a continuation line

            """)
        let (_, bluetoothd, ran) = Self.bluetooth(machine, answer: "9.99")
        #expect(ran.isEmpty, "\(ran)")
        #expect(bluetoothd.first?.detail == "running (pid 200), BlueZ 5.66")

        let system = machine.system()
        #expect(system.untrustedExecutable("/usr/libexec/bluetooth/bluetoothd")?.contains("writable by others than root") == true)
        #expect(system.untrustedExecutable("/usr/lib/bluetooth/bluetoothd")?.contains("belongs to nobody") == true)
        #expect(system.untrustedExecutable("/usr/sbin/bluetoothd")?.contains("/usr/sbin is writable") == true)
        #expect(system.untrustedExecutable("/usr/bin/bluetoothd")?.contains("symbolic link") == true)
    }
}
