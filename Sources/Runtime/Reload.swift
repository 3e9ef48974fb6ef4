import Board
import Control
import Logging
import Reactor

extension BoardRuntime {
    /// SIGHUP: reads the board file again and applies it without a restart.
    ///
    /// The new file is validated first; an invalid one is logged and the
    /// running configuration kept. What can change in place: the channel
    /// table (unchanged channels keep their outputs exactly; a changed one
    /// starts over stopped; a removed one's output is switched off), flush
    /// pacing, the failsafe and protocol timeouts, and the BLE and TCP
    /// transports (restarted: their sessions end). What a live board cannot
    /// change under its own feet (the buses, the chips' addresses and
    /// frequency, the LCD, the LED, the control socket, real-time settings,
    /// the board's name) refuses the whole reload, with the reason, and the
    /// running configuration stays. Every outcome is logged and shown in
    /// status (`configuration.last_reload`). Call from any thread.
    public func reload(path: String?) {
        let newConfiguration: BoardConfiguration
        do {
            if let path {
                newConfiguration = try BoardFile.load(path: path)
            } else {
                newConfiguration = try BoardFile.parse(EmbeddedBoards.simulator, path: EmbeddedBoards.simulatorPath)
            }
        } catch {
            let first = error.problems.first.map(\.description) ?? "\(error)"
            logger.error("reload refused, running configuration kept: \(error)")
            recordReload("refused: \(first)")
            return
        }
        let work: @Sendable () -> Void = { [self] in apply(newConfiguration) }
        if loop.inLoop { work() } else { loop.execute(work) }
    }

    private func recordReload(_ outcome: String) {
        let work: @Sendable () -> Void = { [self] in
            reloads += 1
            lastReload = outcome
        }
        if loop.inLoop { work() } else { loop.execute(work) }
    }

    /// On the loop.
    private func apply(_ new: BoardConfiguration) {
        let old = configuration
        var restartOnly: [String] = []
        if new.name != old.name { restartOnly.append("name") }
        if new.buses != old.buses { restartOnly.append("buses") }
        if new.servo?.chips != old.servo?.chips { restartOnly.append("servo chips (bus, address, frequency, oscillator, output drive)") }
        if new.servo?.outputEnable != old.servo?.outputEnable { restartOnly.append("servo.output_enable") }
        // The lines' names change in place (status and discovery read them
        // from the configuration); the display itself needs a restart.
        let wiring = { (lcd: LCDConfiguration?) in lcd.map { item -> LCDConfiguration in
            var copy = item
            copy.lineNames = []
            return copy
        } }
        if wiring(new.lcd) != wiring(old.lcd) { restartOnly.append("lcd") }
        if new.led != old.led { restartOnly.append("led") }
        if new.serial != old.serial { restartOnly.append("transports.serial") }
        if new.mqtt != old.mqtt { restartOnly.append("transports.mqtt") }
        if new.controlSocketPath != old.controlSocketPath { restartOnly.append("control.socket") }
        // Names change in place; the switches' wiring needs a restart.
        let unnamed = { (switches: [SwitchConfiguration]) in switches.map { item -> SwitchConfiguration in
            var copy = item
            copy.name = nil
            return copy
        } }
        if unnamed(new.switches) != unnamed(old.switches) { restartOnly.append("switches") }
        if new.realtimePriority != old.realtimePriority || new.lockMemory != old.lockMemory { restartOnly.append("realtime") }
        guard restartOnly.isEmpty else {
            let reason = "refused: \(restartOnly.joined(separator: ", ")) changed; those need `systemctl restart blecontrold`"
            logger.error("reload \(reason); running configuration kept")
            reloads += 1
            lastReload = reason
            return
        }

        var applied: [String] = []
        if let servo = parts.servo, let channels = new.servo?.channels, let pacing = new.servo?.maxFlushesPerPeriod,
           channels != old.servo?.channels || pacing != old.servo?.maxFlushesPerPeriod {
            let touched = servo.reconfigure(channels: channels, maxFlushesPerPeriod: pacing)
            // A channel that starts over (stopped) or is gone obeys no one.
            dispatcher.forget(touched.map { .channel($0) })
            applied.append(touched.isEmpty ? "servo pacing" : "channels \(touched.map(String.init).joined(separator: ", "))")
        }
        if new.silenceTimeout != old.silenceTimeout || new.stallTimeout != old.stallTimeout {
            watch?.silenceTimeout = new.silenceTimeout
            watch?.stallTimeout = new.stallTimeout
            applied.append("failsafe timeouts")
        }
        if new.protocolIdleTimeout != old.protocolIdleTimeout {
            hub.idleTimeout = new.protocolIdleTimeout
            applied.append("protocol.idle_timeout_ms (new sessions)")
        }
        if new.tcp != old.tcp {
            tcp.stop()
            if let endpoint = new.tcp {
                do {
                    try tcp.start(host: endpoint.host, port: endpoint.port)
                    transportState.tcp = "\(endpoint.host):\(tcp.port ?? endpoint.port)"
                } catch {
                    transportState.tcp = "cannot listen on \(endpoint.host):\(endpoint.port): \(error)"
                    logger.error("reload: TCP: \(error)")
                }
            } else {
                transportState.tcp = "disabled in the board file"
            }
            applied.append("tcp")
        }
        if new.switches != old.switches {
            parts.switches?.rename(new.switches)
            applied.append("switch names")
        }
        if new.lcd?.lineNames != old.lcd?.lineNames { applied.append("LCD line names") }
        var restartBLE = false
        if new.ble != old.ble {
            restartBLE = true
            applied.append("ble")
        }
        configuration = new
        mqtt?.boardChanged(new)
        reloads += 1
        lastReload = applied.isEmpty ? "applied: nothing changed" : "applied: \(applied.joined(separator: "; "))"
        logger.notice("reload \(lastReload ?? "")")
        if restartBLE {
            // Off the loop, on the transport's one restart thread: stopping
            // the peripheral waits for its D-Bus loop, and reloads in a row
            // must never restart BLE two at a time (issue 36).
            let enabled = new.ble.enabled
            ble.restart(configuration: new.ble, boardName: new.name, version: BLEControlVersion.string) { [self] failure in
                if let failure { logger.error("reload: BLE: \(failure)") }
                loop.execute { [self] in transportState.ble = enabled ? nil : "disabled in the board file" }
            }
        }
    }
}
