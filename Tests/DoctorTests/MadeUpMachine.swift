import Foundation
@testable import Doctor

/// The checkout's root, for the image's files under image/rootfs.
let repositoryRoot = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// A machine's /proc, /sys, /etc, … as files in a scratch directory, for a
/// ``SystemInspector`` rooted there; removed when the test is done.
final class MadeUpMachine {
    let root: String

    init() throws {
        root = FileManager.default.temporaryDirectory.appendingPathComponent("blecontrol-machine-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(atPath: root) }

    /// The machine's inspector; a made-up machine runs no program unless
    /// the test says what happens (`run`).
    func system(run: @escaping SystemInspector.ProgramRunner = { _, _ in nil }) -> SystemInspector {
        SystemInspector(root: root, run: run)
    }

    /// Writes `text` at the absolute machine path `path`.
    func write(_ path: String, _ text: String) throws {
        let file = root + path
        try FileManager.default.createDirectory(atPath: (file as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        try Data(text.utf8).write(to: URL(fileURLWithPath: file))
    }

    func remove(_ path: String) throws {
        try FileManager.default.removeItem(atPath: root + path)
    }

    func makeDirectory(_ path: String) throws {
        try FileManager.default.createDirectory(atPath: root + path, withIntermediateDirectories: true)
    }

    /// A symbolic link at `path` whose target is `target`, as written.
    func link(_ path: String, to target: String) throws {
        let file = root + path
        try FileManager.default.createDirectory(atPath: (file as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: file, withDestinationPath: target)
    }

    /// An INI file's text: `[section]` and `key=value` lines.
    static func ini(_ section: String, _ settings: [(String, String)]) -> String {
        "[\(section)]\n" + settings.map { "\($0.0)=\($0.1)\n" }.joined()
    }

    /// A Raspberry Pi's device tree model.
    func raspberryPi(_ model: String = "Raspberry Pi 4 Model B Rev 1.4") throws {
        try write("/proc/device-tree/model", model + "\0")
    }

    /// This project's image on a Pi 4 with everything in place: the
    /// watchdog armed within its maximum, the safe-outputs unit enabled, a
    /// bounded persistent journal, both partitions mounted read-write
    /// without ext4 errors.
    static func wellSetUpImage() throws -> MadeUpMachine {
        let machine = try MadeUpMachine()
        try machine.raspberryPi()
        try machine.write("/usr/lib/blecontrol-image/firstboot", "#!/bin/sh\n")
        try machine.watchdog(state: "active", timeout: 15, maxTimeout: 15)
        try machine.write(ApplianceSettings.watchdogDropIn, ini("Manager", ApplianceSettings.watchdog(seconds: 15)))
        try machine.write("/etc/systemd/journald.conf", "[Journal]\n#Storage=auto\n#SystemMaxUse=\n")
        try machine.write(ApplianceSettings.journalDropIn, ini("Journal", ApplianceSettings.journal))
        try machine.write("/var/log/journal/0123456789abcdef/system.journal", String(repeating: "j", count: 8192))
        try machine.safeOutputsUnit()
        try machine.link("/etc/systemd/system/sysinit.target.wants/blecontrol-safe-outputs.service",
                         to: "/usr/lib/systemd/system/blecontrol-safe-outputs.service")
        try machine.write("/proc/self/mountinfo", """
            22 1 179:2 / / rw,noatime shared:1 - ext4 /dev/mmcblk0p2 rw,errors=remount-ro
            28 22 179:1 / /boot/firmware rw,relatime shared:7 - vfat /dev/mmcblk0p1 rw,fmask=0077,dmask=0077,shortname=mixed,errors=remount-ro

            """)
        try machine.write("/etc/fstab", """
            # <file system>  <mount point>   <type> <options>                          <dump> <pass>
            LABEL=RASPIROOT  /               ext4   rw,errors=remount-ro               0      1
            LABEL=RASPIFIRM  /boot/firmware  vfat   rw,umask=0077,shortname=mixed      0      2

            """)
        try machine.write("/sys/fs/ext4/mmcblk0p2/errors_count", "0\n")
        try machine.write("/sys/class/block/mmcblk0p2/dev", "179:2\n")
        try machine.write("/boot/firmware/cmdline.txt", "console=tty0 console=ttyS1,115200 root=LABEL=RASPIROOT rw fsck.repair=yes net.ifnames=0 rootwait\n")
        try machine.write("/boot/firmware/config.txt", "dtparam=i2c_arm=on\ndtoverlay=blecontrol\n")
        return machine
    }

    func watchdog(identity: String = "Broadcom BCM2835 Watchdog timer", state: String, timeout: Int, maxTimeout: Int) throws {
        try write("/sys/class/watchdog/watchdog0/identity", identity + "\n")
        try write("/sys/class/watchdog/watchdog0/state", state + "\n")
        try write("/sys/class/watchdog/watchdog0/timeout", "\(timeout)\n")
        try write("/sys/class/watchdog/watchdog0/max_timeout", "\(maxTimeout)\n")
    }

    func safeOutputsUnit() throws {
        try write("/usr/lib/systemd/system/blecontrol-safe-outputs.service", """
            [Unit]
            Description=Switch the servo outputs off at boot
            DefaultDependencies=no

            [Service]
            Type=oneshot
            ExecStart=/usr/bin/blecontrold safe-outputs

            [Install]
            WantedBy=sysinit.target

            """)
    }
}

/// The doctor's checks of one run against `machine`, with the simulator
/// board (its checks need no hardware).
func context(_ machine: MadeUpMachine, run: @escaping SystemInspector.ProgramRunner = { _, _ in nil }) -> Context {
    Context(options: DoctorOptions(
        boardPath: repositoryRoot.appendingPathComponent("board/simulator.yaml").path,
        socketPath: "/nonexistent/blecontrol.sock",
        system: machine.system(run: run)
    ))
}

extension DoctorSection {
    /// The finding about `subject`, if there is one.
    func finding(_ subject: String) -> DoctorFinding? {
        findings.first { $0.subject == subject }
    }
}
