import Control
import Reactor

#if canImport(Glibc)
import Glibc
#endif

/// The running daemon, through its control socket: the chips and the LCD it
/// drives, the LED, its transports.
extension Context {
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
