import Control
import Reactor

/// The human-readable status (also the `watch` screen). Every string in a
/// status is the board's (or, with --mqtt, whoever publishes on its topic)
/// and is printed through ``Swift/String/printable``.
enum StatusText {
    static func render(_ status: StatusReport) -> String {
        var out = "board \(status.board.printable) \(status.simulated ? "(simulated) " : "")· blecontrold \(status.version.printable) · up \(status.uptimeSeconds) s\n"
        if let lcd = status.lcd {
            out += "\nLCD \(lcd.columns)×\(lcd.rows) \(lcd.online ? "" : "OFFLINE\(lcd.error.map { ": \($0.printable)" } ?? "")")"
            if let overlay = lcd.overlay { out += " (showing the board's \(overlay.printable) message)" }
            out += "\n"
            let border = "+" + String(repeating: "-", count: lcd.columns) + "+\n"
            out += border
            for (row, line) in lcd.lines.enumerated() {
                out += "|\(line.printable.padded(to: lcd.columns))|"
                if let names = lcd.lineNames, row < names.count { out += " \(names[row].printable)" }
                out += "\n"
            }
            out += border
        }
        if !status.channels.isEmpty {
            if let servo = status.servo {
                out += "\nPCA9685 \(servo.frequencyHz) Hz \(servo.online ? "online" : "OFFLINE\(servo.error.map { ": \($0.printable)" } ?? "")")"
                if let p50 = servo.latencyP50Us, let p99 = servo.latencyP99Us { out += " · latency p50 \(p50) µs p99 \(p99) µs" }
                out += " · \(servo.scheduling.printable)\n"
                if let failsafe = servo.failsafe { out += "FAILSAFE: \(failsafe.printable)\n" }
                out += "  \(servo.flushes) flushes, \(servo.busWrites) bus writes, \(servo.coalesced) coalesced, \(servo.deadlineMisses) deadline misses, \(servo.failsafes) failsafes\n"
            }
            out += "  ch out role   enabled  last          pulse µs   duty    name\n"
            for channel in status.channels {
                let last = channel.command.map { "\($0.printable) \(channel.value ?? 0)" } ?? "-"
                out += "  " + "\(channel.channel)".padded(left: 2) + " " + "\(channel.output)".padded(left: 3) + " " + channel.role.printable.padded(to: 6)
                out += " " + (channel.latched ? "latched" : channel.enabled ? "yes" : "no ").padded(to: 8)
                out += " " + last.padded(to: 13)
                out += " " + channel.pulseUs.fixed(1).padded(left: 8) + "  " + ((channel.duty * 100).fixed(1) + "%").padded(left: 6)
                if let name = channel.name { out += "  \(name.printable)" }
                if channel.moving == true, let setpoint = channel.setpointUs { out += "  → \(setpoint.fixed(1)) µs" }
                out += "\n"
            }
        }
        if !status.switches.isEmpty {
            out += "\nswitches:\n"
            for item in status.switches {
                out += "  " + "\(item.switch)".padded(left: 2) + " " + (item.on ? "on " : "off") + "  \(item.output.printable)"
                if let name = item.name { out += "  \(name.printable)" }
                if let error = item.error { out += " (\(error.printable))" }
                out += "\n"
            }
        }
        if let led = status.led { out += "\nLED \(led.pattern.printable) (\(led.lit ? "lit" : "dark"))\n" }
        out += "\nsessions: \(status.sessions.count)"
        for session in status.sessions {
            out += "\n  #\(session.id) \(session.transport.printable) \(session.peer.printable): \(session.frames) frames, \(session.errors) errors"
            if let dropped = session.repliesDropped, dropped > 0 { out += " (\(dropped) not answered: over its reply budget)" }
            if let outputs = session.inControlOf, !outputs.isEmpty { out += "; in control of \(outputs.joined(separator: ", ").printable)" }
        }
        out += "\ncounters: \(status.counters.frames) frames, \(status.counters.errors) errors, \(status.counters.discardedPartials) partial frames discarded"
        if status.counters.refusedConnections > 0 { out += ", \(status.counters.refusedConnections) connections refused (cap)" }
        out += "\n"
        for (name, state) in status.transports.named { out += "\(name): \(state.printable)\n" }
        if let configuration = status.configuration, configuration.reloads > 0 {
            out += "board file \(configuration.path.printable): \(configuration.reloads) reload\(configuration.reloads == 1 ? "" : "s"), last \((configuration.lastReload ?? "-").printable)\n"
        }
        return out
    }
}
