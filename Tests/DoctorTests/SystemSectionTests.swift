import Foundation
@testable import Doctor
import Testing

@Suite("blecontrol doctor: the System section")
struct SystemSectionTests {
    @Test("The image with everything in place: every System finding is OK")
    func wellSetUpImage() throws {
        let machine = try MadeUpMachine.wellSetUpImage()
        let section = context(machine).checkSystem()
        #expect(section.title == "System")
        for finding in section.findings {
            #expect(finding.level == .ok, "\(finding.subject): \(finding.detail)")
        }
        let subjects = section.findings.map(\.subject)
        for subject in ["hardware watchdog", "systemd watchdog", "blecontrol-safe-outputs.service", "journal", "journal limit", "/", "/boot/firmware", "ext4 mmcblk0p2 (/)"] {
            #expect(subjects.contains(subject), "no \(subject) in \(subjects)")
        }
        #expect(section.finding("hardware watchdog")?.detail.contains("Broadcom BCM2835 Watchdog timer, at most 15 s") == true)
        #expect(section.finding("systemd watchdog")?.detail.contains("RuntimeWatchdogSec=15s (\(ApplianceSettings.watchdogDropIn))") == true)
        #expect(section.finding("journal limit")?.detail == "SystemMaxUse=64M (\(ApplianceSettings.journalDropIn))")
        #expect(section.finding("journal")?.detail.contains("persistent") == true)
    }

    @Test("The doctor's fixes write what the image ships in image/rootfs")
    func fixesMatchTheImage() throws {
        for (file, section, settings) in [
            (ApplianceSettings.watchdogDropIn, "Manager", ApplianceSettings.watchdog(seconds: ApplianceSettings.watchdogSeconds)),
            (ApplianceSettings.journalDropIn, "Journal", ApplianceSettings.journal),
        ] {
            let shipped = try String(contentsOf: repositoryRoot.appendingPathComponent("image/rootfs" + file), encoding: .utf8)
            let expected = Dictionary(uniqueKeysWithValues: settings.map { ("\(section).\($0.0)", $0.1) })
            #expect(SystemInspector.iniSettings(shipped) == expected, "\(file)")
        }
    }

    @Test("No hardware watchdog: a WARN with the module on the image, only reported elsewhere")
    func noWatchdog() throws {
        let image = try MadeUpMachine.wellSetUpImage()
        try image.remove("/sys/class/watchdog")
        let missing = try #require(context(image).checkSystem().finding("hardware watchdog"))
        #expect(missing.level == .warn)
        #expect(missing.fix?.contains("modprobe bcm2835_wdt") == true)

        let laptop = try MadeUpMachine()
        let none = try #require(context(laptop).checkSystem().finding("hardware watchdog"))
        #expect(none.level == .ok && none.detail.contains("none on this machine"))
    }

    @Test("RuntimeWatchdogSec above the device's maximum: WARN, and the fix is the drop-in with 15 s")
    func watchdogAboveMaximum() throws {
        let machine = try MadeUpMachine.wellSetUpImage()
        // A later drop-in (by file name) overrides the image's.
        try machine.write("/etc/systemd/system.conf.d/zz-local.conf", "[Manager]\nRuntimeWatchdogSec=1min\n")
        let finding = try #require(context(machine).checkSystem().finding("systemd watchdog"))
        #expect(finding.level == .warn)
        #expect(finding.detail.contains("RuntimeWatchdogSec=1min (/etc/systemd/system.conf.d/zz-local.conf)"), "\(finding.detail)")
        #expect(finding.detail.contains("maximum of 15 s"))
        let fix = try #require(finding.fix)
        #expect(fix.contains("printf '[Manager]\\nRuntimeWatchdogSec=15s\\nRebootWatchdogSec=1min\\n' | sudo tee \(ApplianceSettings.watchdogDropIn)"), "\(fix)")
        #expect(fix.contains("daemon-reexec"))
    }

    @Test("The watchdog configured but the device inactive, or not configured at all: WARN on a Pi")
    func watchdogNotArmed() throws {
        let machine = try MadeUpMachine.wellSetUpImage()
        try machine.watchdog(state: "inactive", timeout: 15, maxTimeout: 15)
        let inactive = try #require(context(machine).checkSystem().finding("systemd watchdog"))
        #expect(inactive.level == .warn && inactive.detail.contains("watchdog0 inactive"), "\(inactive.detail)")

        try machine.remove(ApplianceSettings.watchdogDropIn)
        let off = try #require(context(machine).checkSystem().finding("systemd watchdog"))
        #expect(off.level == .warn && off.detail.contains("RuntimeWatchdogSec is off"))
        #expect(off.fix?.contains("RuntimeWatchdogSec=15s") == true)
    }

    @Test("blecontrol-safe-outputs.service not enabled, or masked: WARN with the systemctl line")
    func safeOutputs() throws {
        let machine = try MadeUpMachine.wellSetUpImage()
        try machine.remove("/etc/systemd/system/sysinit.target.wants")
        let disabled = try #require(context(machine).checkSystem().finding("blecontrol-safe-outputs.service"))
        #expect(disabled.level == .warn && disabled.fix == "`sudo systemctl enable blecontrol-safe-outputs.service`")

        try machine.link("/etc/systemd/system/blecontrol-safe-outputs.service", to: "/dev/null")
        let masked = try #require(context(machine).checkSystem().finding("blecontrol-safe-outputs.service"))
        #expect(masked.level == .warn && masked.detail.hasPrefix("masked"))

        // Not installed on a machine that is neither the image nor a Pi: nothing to say.
        #expect(context(try MadeUpMachine()).checkSystem().finding("blecontrol-safe-outputs.service") == nil)
    }

    @Test("A persistent journal without SystemMaxUse on a Pi: WARN with the image's drop-in; elsewhere journald's default is only reported")
    func journalWithoutLimit() throws {
        let pi = try MadeUpMachine()
        try pi.raspberryPi()
        try pi.makeDirectory("/var/log/journal")
        try pi.write("/etc/systemd/journald.conf", "[Journal]\n#SystemMaxUse=\n")
        let limit = try #require(context(pi).checkSystem().finding("journal limit"))
        #expect(limit.level == .warn && limit.detail.contains("no SystemMaxUse"), "\(limit.detail)")
        let fix = try #require(limit.fix)
        #expect(fix.contains("sudo tee \(ApplianceSettings.journalDropIn)") && fix.contains("SystemMaxUse=64M") && fix.contains("restart systemd-journald"), "\(fix)")

        // An empty assignment in a later drop-in puts the default back.
        try pi.write("/usr/lib/systemd/journald.conf.d/10-vendor.conf", "[Journal]\nSystemMaxUse=1G\n")
        #expect(try #require(context(pi).checkSystem().finding("journal limit")).level == .ok)
        try pi.write("/run/systemd/journald.conf.d/20-reset.conf", "[Journal]\nSystemMaxUse=\n")
        #expect(try #require(context(pi).checkSystem().finding("journal limit")).level == .warn)

        let laptop = try MadeUpMachine()
        try laptop.makeDirectory("/var/log/journal")
        let reported = try #require(context(laptop).checkSystem().finding("journal limit"))
        #expect(reported.level == .ok && reported.detail.contains("journald's default"))
    }

    @Test("ext4 errors recorded: WARN, and the fix is a boot with fsck.mode=force in cmdline.txt")
    func ext4Errors() throws {
        let machine = try MadeUpMachine.wellSetUpImage()
        try machine.write("/sys/fs/ext4/mmcblk0p2/errors_count", "3\n")
        let finding = try #require(context(machine).checkSystem().finding("ext4 mmcblk0p2 (/)"))
        #expect(finding.level == .warn && finding.detail.hasPrefix("3 errors"))
        let fix = try #require(finding.fix)
        #expect(fix.contains("`fsck.mode=force fsck.repair=yes` added to the line in /boot/firmware/cmdline.txt"), "\(fix)")
        #expect(!fix.contains("forcefsck"))
    }

    @Test("A root the kernel remounted read-only after errors, although fstab says rw: WARN")
    func rootRemountedReadOnly() throws {
        let machine = try MadeUpMachine.wellSetUpImage()
        // The mount keeps its own rw; the file system under it went ro.
        try machine.write("/proc/self/mountinfo", """
            22 1 179:2 / / rw,noatime shared:1 - ext4 /dev/root ro,errors=remount-ro
            28 22 179:1 / /boot/firmware rw,relatime shared:7 - vfat /dev/mmcblk0p1 rw

            """)
        let section = context(machine).checkSystem()
        let root = try #require(section.finding("/"))
        #expect(root.level == .warn && root.detail.contains("the kernel remounted it after errors"), "\(root.detail)")
        #expect(root.fix?.contains("fsck.mode=force") == true)
        // /dev/root is found by its device number.
        #expect(section.finding("ext4 mmcblk0p2 (/)") != nil)

        // Read-only on purpose: fstab says so.
        try machine.write("/etc/fstab", "LABEL=RASPIROOT / ext4 ro 0 1\nLABEL=RASPIFIRM /boot/firmware vfat rw 0 2\n")
        #expect(context(machine).checkSystem().finding("/")?.level == .ok)
    }

    @Test("Time spans and sizes as systemd writes them")
    func systemdValues() {
        #expect(SystemdValue.seconds("15s") == 15)
        #expect(SystemdValue.seconds("1min 30s") == 90)
        #expect(SystemdValue.seconds("20") == 20)
        #expect(SystemdValue.seconds("500ms") == 0.5)
        #expect(SystemdValue.seconds("off") == 0)
        #expect(SystemdValue.seconds("soon") == nil)
        #expect(SystemdValue.bytes("64M") == Double(64 << 20))
        #expect(SystemdValue.bytes("4G") == Double(4 << 30))
        #expect(SystemdValue.bytes("512") == 512)
        #expect(SystemdValue.size(64 * 1024 * 1024) == "64.0M")
    }

    @Test("Drop-ins: a file in /etc hides the one of the same name in /usr/lib; the main file comes first")
    func dropInPrecedence() throws {
        let machine = try MadeUpMachine()
        try machine.write("/etc/systemd/journald.conf", "[Journal]\nSystemMaxUse=1G\nMaxRetentionSec=1week\n")
        try machine.write("/usr/lib/systemd/journald.conf.d/50-a.conf", "[Journal]\nSystemMaxUse=2G\n")
        try machine.write("/etc/systemd/journald.conf.d/50-a.conf", "[Journal]\nSystemMaxUse=3G\n")
        try machine.write("/usr/lib/systemd/journald.conf.d/60-b.conf", "[Journal]\nRuntimeMaxUse=8M\n")
        let settings = machine.system().systemdSettings("journald.conf")
        #expect(settings["Journal.SystemMaxUse"] == SystemdSetting(value: "3G", file: "/etc/systemd/journald.conf.d/50-a.conf"))
        #expect(settings["Journal.RuntimeMaxUse"]?.value == "8M")
        #expect(settings["Journal.MaxRetentionSec"]?.file == "/etc/systemd/journald.conf")
    }

    @Test("A Pi's missing adapter: Raspberry Pi OS's hciuart, or the kernel's hci_uart on Debian's kernel and the image")
    func onboardBluetoothAdvice() throws {
        let image = try MadeUpMachine.wellSetUpImage()
        try image.write("/boot/firmware/config.txt", "dtparam=i2c_arm=on\n")
        let kernel = try #require(context(image).checkBluetooth().finding("adapter hci0")?.fix)
        #expect(kernel.contains("hci_uart") && kernel.contains("dmesg | grep -i -e hci_uart -e bluetooth"), "\(kernel)")
        #expect(kernel.contains("dtoverlay=blecontrol"))
        #expect(kernel.contains("sudo apt install bluez-firmware"))
        #expect(!kernel.contains("hciuart.service`"))

        // With the overlay and the patch in place, only the kernel's side is left.
        try image.write("/boot/firmware/config.txt", "dtparam=i2c_arm=on\ndtoverlay=blecontrol\n")
        try image.write("/usr/lib/firmware/brcm/BCM4345C0.hcd", "patch")
        let settled = try #require(context(image).checkBluetooth().finding("adapter hci0")?.fix)
        #expect(!settled.contains("dtoverlay=blecontrol") && !settled.contains("bluez-firmware"), "\(settled)")

        let raspberryPiOS = try MadeUpMachine()
        try raspberryPiOS.raspberryPi()
        try raspberryPiOS.write("/usr/lib/systemd/system/hciuart.service", "[Service]\nExecStart=/usr/bin/btuart\n")
        let hciuart = try #require(context(raspberryPiOS).checkBluetooth().finding("adapter hci0")?.fix)
        #expect(hciuart.contains("hciuart.service") && !hciuart.contains("hci_uart"), "\(hciuart)")
    }
}
