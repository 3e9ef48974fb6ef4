import Reactor

#if canImport(Glibc)
import Glibc
#endif

/// The installed service: its unit, its user and groups, and whose sandbox
/// its connections go through.
extension Context {
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
}
