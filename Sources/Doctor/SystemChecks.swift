import Reactor

/// What this project's SD-card image sets up for itself, for the fixes that
/// put it back on the image or bring it to another Pi. The image's own
/// files are in image/rootfs; a test keeps the two in step.
enum ApplianceSettings {
    /// systemd's hardware watchdog: bcm2835-wdt takes at most 15 s, and
    /// systemd gives the watchdog up when the device refuses the timeout.
    static let watchdogDropIn = "/etc/systemd/system.conf.d/blecontrol-watchdog.conf"
    static func watchdog(seconds: Int) -> [(String, String)] {
        [("RuntimeWatchdogSec", "\(seconds)s"), ("RebootWatchdogSec", "1min")]
    }
    /// The longest RuntimeWatchdogSec the fixes suggest: bcm2835-wdt's maximum.
    static let watchdogSeconds = 15

    /// The journal on an SD card: kept across reboots (a watchdog reset's
    /// cause is in the boot before it) and bounded.
    static let journalDropIn = "/etc/systemd/journald.conf.d/blecontrol.conf"
    static let journal: [(String, String)] = [
        ("Storage", "persistent"), ("SystemMaxUse", "64M"), ("SystemMaxFileSize", "8M"),
        ("SystemKeepFree", "256M"), ("RuntimeMaxUse", "16M"), ("MaxRetentionSec", "1year"),
    ]

    /// The unit that switches the PCA9685's outputs off early at boot: the
    /// chip keeps producing the pulses it held through a reset of the Pi.
    static let safeOutputsUnit = "blecontrol-safe-outputs.service"

    /// One shell line that writes `settings` under `[section]` to `path` and
    /// then runs `then`: the fix names the file's exact content.
    static func dropInCommand(_ path: String, section: String, _ settings: [(String, String)], then: String) -> String {
        let lines = (["[\(section)]"] + settings.map { "\($0.0)=\($0.1)" }).joined(separator: "\\n")
        return "`sudo mkdir -p \(Files.directory(of: path)) && printf '\(lines)\\n' | sudo tee \(path) >/dev/null && \(then)`"
    }
}

/// The machine under the daemon: the hardware watchdog and what arms it,
/// the unit that makes the outputs safe at boot, the journal's limits and
/// the file systems. On this project's image and on a Raspberry Pi (an SD
/// card, a board nobody watches) what is missing warns with the fix; on
/// other machines the same facts are only reported.
extension Context {
    /// The image or a Raspberry Pi.
    var isAppliance: Bool { system.isBLEControlImage() || system.raspberryPiModel() != nil }

    func checkSystem() -> DoctorSection {
        var findings = watchdogFindings()
        if let safeOutputs = safeOutputsFinding() { findings.append(safeOutputs) }
        findings += journalFindings()
        findings += fileSystemFindings()
        return DoctorSection(title: "System", findings: findings)
    }

    // MARK: Watchdog

    /// The watchdog device, what systemd is told to do with it
    /// (RuntimeWatchdogSec in system.conf and its drop-ins) and what the
    /// device says it is doing (sysfs `state` and `timeout`). Files rather
    /// than systemd's RuntimeWatchdogUSec over D-Bus: they can be read by any
    /// user and under --system-root, and the device's own state tells
    /// whether systemd's setting took (systemd keeps reporting the value it
    /// was given after the device refused it).
    private func watchdogFindings() -> [DoctorFinding] {
        let manager = system.systemdSettings("system.conf")
        let device = manager["Manager.WatchdogDevice"]?.value ?? "/dev/watchdog0"
        // /dev/watchdog is the first device's older name.
        let name = device == "/dev/watchdog" ? "watchdog0" : String(device.split(separator: "/").last ?? "watchdog0")
        guard let watchdog = system.watchdog(name) else {
            guard isAppliance else {
                return [DoctorFinding(.ok, "hardware watchdog", "none on this machine (no /sys/class/watchdog/\(name)): nothing for systemd to arm")]
            }
            return [DoctorFinding(
                .warn, "hardware watchdog", "no /sys/class/watchdog/\(name): a hung board stays hung instead of resetting itself",
                fix: "the Pi's watchdog is bcm2835-wdt: `sudo modprobe bcm2835_wdt`; `dmesg | grep -i watchdog` says why it did not load"
            )]
        }
        var findings: [DoctorFinding] = []
        let limit = watchdog.maxTimeout.map { ", at most \($0) s" } ?? ""
        findings.append(DoctorFinding(.ok, "hardware watchdog", "\(name): \(watchdog.identity ?? "unnamed")\(limit)"))

        let subject = "systemd watchdog"
        let suggested = min(ApplianceSettings.watchdogSeconds, watchdog.maxTimeout ?? ApplianceSettings.watchdogSeconds)
        let fix = ApplianceSettings.dropInCommand(
            ApplianceSettings.watchdogDropIn, section: "Manager", ApplianceSettings.watchdog(seconds: suggested),
            then: "sudo systemctl daemon-reexec"
        )
        let configured = manager["Manager.RuntimeWatchdogSec"]
        let active = watchdog.state.map { $0 == "active" }
        let deviceState = watchdog.state.map { "\(name) \($0)\(watchdog.timeout.map { ", timeout \($0) s" } ?? "")" }
            ?? "the kernel does not say whether \(name) is active"
        // "default": the driver's own timeout.
        let seconds = configured.flatMap { $0.value == "default" ? Double(watchdog.timeout ?? 1) : SystemdValue.seconds($0.value) } ?? 0
        guard let configured, seconds > 0 else {
            if active == true {
                findings.append(DoctorFinding(.ok, subject, "RuntimeWatchdogSec is off, but \(deviceState): another program (watchdog(8)?) feeds it"))
            } else if isAppliance {
                findings.append(DoctorFinding(
                    .warn, subject, "not armed: RuntimeWatchdogSec is off, so nothing resets the board when the kernel or systemd hangs",
                    fix: fix
                ))
            } else {
                findings.append(DoctorFinding(.ok, subject, "not armed (RuntimeWatchdogSec is off)"))
            }
            return findings
        }
        let setting = "RuntimeWatchdogSec=\(configured.value) (\(configured.file))"
        if let maximum = watchdog.maxTimeout, seconds > Double(maximum) {
            findings.append(DoctorFinding(
                .warn, subject, "\(setting) is above \(name)'s maximum of \(maximum) s: the device refuses it and systemd gives the watchdog up",
                fix: fix
            ))
        } else if active == false {
            findings.append(DoctorFinding(
                .warn, subject, "\(setting), but \(deviceState): systemd reads the setting when it starts",
                fix: "`sudo systemctl daemon-reexec` (or reboot); if it stays inactive, `journalctl -b | grep -i watchdog` says why"
            ))
        } else {
            findings.append(DoctorFinding(.ok, subject, "\(setting); \(deviceState)"))
        }
        return findings
    }

    /// blecontrol-safe-outputs.service: installed with the package, pulled
    /// in by sysinit.target. Reported where it is installed, and missed on
    /// the image and a Pi.
    private func safeOutputsFinding() -> DoctorFinding? {
        let unit = ApplianceSettings.safeOutputsUnit
        let why = "the PCA9685 keeps the pulses it held through a reboot or a watchdog reset until it runs"
        switch system.unitState(unit, defaultTarget: "sysinit.target") {
        case .notInstalled:
            guard isAppliance else { return nil }
            return DoctorFinding(.warn, unit, "not installed: \(why)", fix: "install the current package: `sudo apt install --reinstall blecontrol`")
        case .masked(let file):
            return DoctorFinding(.warn, unit, "masked (\(file) → /dev/null): \(why)",
                                 fix: "`sudo systemctl unmask \(unit) && sudo systemctl enable \(unit)`")
        case .disabled:
            return DoctorFinding(.warn, unit, "installed but not enabled: \(why)", fix: "`sudo systemctl enable \(unit)`")
        case .enabled(let link):
            return DoctorFinding(.ok, unit, "enabled (\(link)): every output off early at boot")
        }
    }

    // MARK: Journal

    /// Where journald keeps the log and how much of the disk it may take
    /// (journald.conf(5): Storage=auto is persistent once /var/log/journal
    /// exists; SystemMaxUse= defaults to 10% of the file system, at most 4G).
    private func journalFindings() -> [DoctorFinding] {
        let settings = system.systemdSettings("journald.conf")
        let storage = settings["Journal.Storage"]?.value ?? "auto"
        let persistent = storage == "persistent" || (storage == "auto" && system.exists("/var/log/journal"))
        let fix = ApplianceSettings.dropInCommand(
            ApplianceSettings.journalDropIn, section: "Journal", ApplianceSettings.journal,
            then: "sudo systemctl restart systemd-journald"
        )
        if storage == "none" {
            return [DoctorFinding(.warn, "journal", "Storage=none (\(settings["Journal.Storage"]?.file ?? "")): journald keeps no log at all, blecontrold's included", fix: fix)]
        }
        guard persistent else {
            let used = SystemdValue.size(Double(system.diskUsage("/run/log/journal")))
            let detail = "in memory only (Storage=\(storage)), \(used) in /run/log/journal: the log of the boot before a reset is lost"
            // The image keeps its log on the card; elsewhere that is the owner's choice.
            guard system.isBLEControlImage() else { return [DoctorFinding(.ok, "journal", detail)] }
            return [DoctorFinding(.warn, "journal", detail, fix: fix)]
        }
        let used = SystemdValue.size(Double(system.diskUsage("/var/log/journal")))
        var findings = [DoctorFinding(.ok, "journal", "persistent (Storage=\(storage)), \(used) in /var/log/journal")]
        if let limit = settings["Journal.SystemMaxUse"] {
            findings.append(DoctorFinding(.ok, "journal limit", "SystemMaxUse=\(limit.value) (\(limit.file))"))
        } else {
            let size = system.fileSystemSize("/var/log/journal").map { SystemdValue.size(min(Double($0) / 10, 4 * 1024 * 1024 * 1024)) + " " }
            let implicit = "\(size ?? "")(10% of the file system, at most 4G)"
            if isAppliance {
                findings.append(DoctorFinding(
                    .warn, "journal limit", "no SystemMaxUse: the log may grow to \(implicit) on the SD card",
                    fix: fix
                ))
            } else {
                findings.append(DoctorFinding(.ok, "journal limit", "journald's default: up to \(implicit)"))
            }
        }
        return findings
    }

    // MARK: File systems

    /// The root and /boot/firmware mounted as /etc/fstab says, and the errors
    /// each mounted ext4 file system has recorded.
    private func fileSystemFindings() -> [DoctorFinding] {
        var findings: [DoctorFinding] = []
        let fstab = system.fstab()
        let checkFix = fileSystemCheckFix(fstab)
        var mountPoints = ["/"]
        if isAppliance || fstab.contains(where: { $0.mountPoint == "/boot/firmware" }) { mountPoints.append("/boot/firmware") }
        // Without mountinfo (a made-up machine) nothing is known to be missing.
        let mounts = system.mounts()
        for mountPoint in mountPoints where !mounts.isEmpty {
            let entry = fstab.last { $0.mountPoint == mountPoint }
            // The last mount at a point hides those under it.
            guard let mount = mounts.last(where: { $0.mountPoint == mountPoint }) else {
                if let entry, !entry.options.contains("noauto") {
                    findings.append(DoctorFinding(
                        .warn, mountPoint, "not mounted, although /etc/fstab mounts \(entry.source) there",
                        fix: "`sudo mount \(mountPoint)`; `journalctl -b | grep -i \(mountPoint)` says why it was not"
                    ))
                } else if isAppliance {
                    findings.append(DoctorFinding(
                        .warn, mountPoint, "not mounted: kernel and firmware upgrades write config.txt and the kernel there",
                        fix: system.isBLEControlImage()
                            ? "put the image's line back in /etc/fstab: `LABEL=RASPIFIRM /boot/firmware vfat rw,umask=0077,shortname=mixed 0 2`, then `sudo mount /boot/firmware`"
                            : "add the boot partition (the card's first, FAT, partition) to /etc/fstab, then `sudo mount /boot/firmware`"
                    ))
                }
                continue
            }
            let state = mount.isReadOnly ? "read-only" : "read-write"
            let detail = "\(mount.type) on \(mount.source), \(state)"
            if mount.isReadOnly, let entry, !entry.options.contains("ro") {
                findings.append(DoctorFinding(
                    .warn, mountPoint, "\(detail) although /etc/fstab mounts it read-write: the kernel remounted it after errors",
                    fix: "`dmesg | grep -i -e ext4 -e mmc -e 'I/O error'` shows them; then \(checkFix)"
                ))
            } else {
                findings.append(DoctorFinding(.ok, mountPoint, detail))
            }
        }
        for ext4 in system.ext4Errors() {
            let subject = "ext4 \(ext4.device)\(ext4.mountPoint.map { " (\($0))" } ?? "")"
            if ext4.count > 0 {
                findings.append(DoctorFinding(
                    .warn, subject, "\(ext4.count) error\(ext4.count == 1 ? "" : "s") recorded since the file system was last checked",
                    fix: checkFix
                ))
            } else {
                findings.append(DoctorFinding(.ok, subject, "no errors recorded"))
            }
        }
        return findings
    }

    /// How to have every file system checked and repaired at the next boot.
    /// systemd-fsck (and initramfs-tools' fsck of the root) obey
    /// `fsck.mode=force` on the kernel command line; the old /forcefsck
    /// file is not read any more, and `tune2fs -C` only forces a check
    /// where the file system has a maximum mount count, which mke2fs leaves
    /// off.
    private func fileSystemCheckFix(_ fstab: [SystemInspector.FstabEntry]) -> String {
        let place = system.cmdlineTxtPath().map { "to the line in \($0)" } ?? "to the kernel command line (at the boot loader)"
        var fix = "reboot once with `fsck.mode=force fsck.repair=yes` added \(place), then take them out again: every file system /etc/fstab gives a pass number is checked and repaired before it is mounted read-write"
        let unchecked = fstab.filter { $0.pass == 0 && ($0.mountPoint == "/" || $0.mountPoint == "/boot/firmware") && $0.type != "swap" }
        if !unchecked.isEmpty {
            fix += " (first give \(unchecked.map(\.mountPoint).joined(separator: " and ")) a pass number in /etc/fstab: 1 for /, 2 for the others)"
        }
        return fix
    }
}
