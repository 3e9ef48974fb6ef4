import Board
import Control
import Devices
import Firmware
import Hardware
import Reactor

/// Builds the status report from the board's parts, at one instant on the
/// loop. On a simulator board, pulses, LCD text and the LED are what the
/// emulated chips decoded from the bus traffic.
struct StatusAssembler {
    let configuration: BoardConfiguration
    let parts: BoardAssembly
    let hub: SessionHub
    let dispatcher: Dispatcher
    let refusedConnections: Int
    let transports: StatusReport.Transports
    let reloads: Int
    let lastReload: String?

    func report(now: ContinuousClock.Instant, startedAt: ContinuousClock.Instant) -> StatusReport {
        var channels: [StatusReport.Channel] = []
        var servoStatus: StatusReport.Servo?
        if let servo = parts.servo {
            let snapshot = servo.snapshot()
            for state in snapshot.channels {
                let channel = state.configuration
                var command: String?
                var value: Int?
                switch state.lastCommand {
                case .servo(let v)?: command = "servo"; value = Int(v)
                case .pwm(let v)?: command = "pwm"; value = Int(v)
                case nil: break
                }
                let produced = Self.produced(state, parts: parts)
                let setpoint = Self.setpoint(state)
                // Motion is shown for a channel with limits, and for any
                // channel while a timed move carries it.
                let showsMotion = !channel.motion.isUnlimited || state.moving
                channels.append(StatusReport.Channel(
                    channel: channel.channel, output: channel.output, chip: parts.servoFrequencies.count > 1 ? "\(channel.chip)" : nil, role: "\(channel.role)",
                    enabled: state.enabled, command: command, value: value,
                    pulseUs: (produced.pulse * 10).rounded() / 10, duty: (produced.duty * 10000).rounded() / 10000,
                    latched: state.latched, name: channel.name,
                    setpointUs: setpoint.us.map { ($0 * 10).rounded() / 10 }, setpointPercent: setpoint.percent.map { ($0 * 10).rounded() / 10 },
                    moving: showsMotion ? state.moving : nil,
                    position: showsMotion && channel.role != .pwm && produced.pulse > 0
                        ? Int(channel.servoValue(forPulse: Microseconds(produced.pulse))) : nil,
                    released: channel.releaseAfter == nil ? nil : state.released
                ))
            }
            let metrics = snapshot.metrics
            servoStatus = StatusReport.Servo(
                online: snapshot.online, error: snapshot.lastError, frequencyHz: ((parts.servoFrequencies.first?.value ?? 0) * 100).rounded() / 100,
                updates: metrics.updates, coalesced: metrics.coalesced, flushes: metrics.flushes,
                busWrites: metrics.busTransactions, failedFlushes: metrics.failedFlushes,
                latencyP50Us: snapshot.latency.p50, latencyP99Us: snapshot.latency.p99, latencyMaxUs: snapshot.latency.maximum,
                deadlineMisses: metrics.deadlineMisses, failsafe: snapshot.failsafe?.reason,
                failsafeSeconds: snapshot.failsafe.map { ($0.since.duration(to: now).inSeconds * 10).rounded() / 10 },
                failsafeAppliedMs: snapshot.failsafe?.appliedAfter.map { ($0.inSeconds * 10_000).rounded() / 10 },
                failsafes: metrics.failsafes, scheduling: snapshot.scheduling,
                maxLcdChunksWaited: parts.servoArbiters.map(\.statistics.maxDisplayTransactionsWaited).max() ?? 0,
                maxBusWaitUs: parts.servoArbiters.map(\.statistics.maxServoWaitMicroseconds).max() ?? 0,
                motionPeriods: metrics.motionPeriods == 0 ? nil : metrics.motionPeriods,
                motionPeriodsMissed: metrics.motionPeriods == 0 ? nil : metrics.motionPeriodsMissed,
                motionLatenessP50Us: snapshot.motionLateness.p50, motionLatenessP99Us: snapshot.motionLateness.p99,
                motionLatenessMaxUs: snapshot.motionLateness.maximum
            )
        }
        var lcdStatus: StatusReport.LCD?
        if let lcd = parts.lcd, let lcdConfiguration = configuration.lcd {
            let snapshot = lcd.snapshot()
            lcdStatus = StatusReport.LCD(
                online: snapshot.online, error: snapshot.lastError,
                columns: lcdConfiguration.columns, rows: lcdConfiguration.rows,
                lines: parts.observer?.displayLines() ?? snapshot.lines,
                overlay: snapshot.message?.name, busWrites: snapshot.busTransactions,
                lineNames: lcdConfiguration.lineNames.isEmpty ? nil : lcdConfiguration.lineNames
            )
        }
        let ledStatus = parts.led.map { led in
            StatusReport.LED(pattern: "\(led.pattern)", lit: parts.observer?.ledLit() ?? led.isLit)
        }
        var switchStatus = parts.switches?.report ?? []
        // On the simulator, what the emulated line shows.
        for index in switchStatus.indices {
            if let line = parts.emulators.switches[switchStatus[index].switch] { switchStatus[index].on = line.isActive }
        }
        let sessions = hub.sessions.map { session in
            StatusReport.SessionInfo(
                id: session.id, transport: session.transport.rawValue, peer: session.peer,
                bytes: session.counters.bytes, frames: session.counters.frames, errors: session.counters.errors,
                connectedSeconds: session.connectedAt.duration(to: now).inSeconds,
                inControlOf: session.transport.isCentral ? dispatcher.outputs(commandedBy: session.id).map(\.description) : nil,
                repliesDropped: session.transport.isCentral ? session.counters.repliesDropped : nil
            )
        }
        let counters = dispatcher.counters
        return StatusReport(
            board: configuration.name, version: BLEControlVersion.string,
            uptimeSeconds: (startedAt.duration(to: now).inSeconds * 10).rounded() / 10,
            simulated: parts.observer != nil, channels: channels, switches: switchStatus, servo: servoStatus, lcd: lcdStatus, led: ledStatus,
            sessions: sessions,
            counters: StatusReport.Counters(frames: counters.frames, errors: counters.errors, discardedPartials: counters.discardedPartials,
                                            sessionsTotal: hub.totalOpened, refusedConnections: refusedConnections),
            transports: transports,
            configuration: StatusReport.Configuration(path: configuration.sourcePath, reloads: reloads, lastReload: lastReload)
        )
    }

    /// The poll snapshot: cheap enough for a tight loop.
    static func poll(parts: BoardAssembly, dispatcher: Dispatcher) -> PollReport {
        guard let servo = parts.servo else {
            return PollReport(frames: dispatcher.counters.frames, pulsesUs: [], failsafe: nil, busWrites: 0)
        }
        let snapshot = servo.snapshot(latency: false)
        return PollReport(
            frames: dispatcher.counters.frames,
            pulsesUs: snapshot.channels.map { (produced($0, parts: parts).pulse * 10).rounded() / 10 },
            failsafe: snapshot.failsafe?.reason,
            busWrites: snapshot.metrics.busTransactions
        )
    }

    /// What a channel's output produces: read back from the emulated chip,
    /// or on hardware what the driver was asked for.
    static func produced(_ state: ServoPath.ChannelState, parts: BoardAssembly) -> (pulse: Double, duty: Double) {
        let channel = state.configuration
        if let observed = parts.observer?.output(chip: channel.chip, output: channel.output) { return observed }
        guard state.enabled, var output = state.output else { return (0, 0) }
        // A move shows where it has got to, not where it is heading.
        if let current = state.currentPulse, case .pulse = output { output = .pulse(Microseconds(current)) }
        let frequency = parts.servoFrequencies.indices.contains(channel.chip) ? parts.servoFrequencies[channel.chip].value : 50
        let period = 1_000_000 / frequency
        switch output {
        case .pulse(let width): return (width.value, width.value / period)
        case .duty(let duty): return (duty * period, duty)
        }
    }

    /// What the channel's last command asks for, in its unit: µs for a
    /// servo or ESC channel, % for a PWM one (docs/protocol.md's arithmetic,
    /// calibration included, as ``ChannelConfiguration`` does it).
    static func setpoint(_ state: ServoPath.ChannelState) -> (us: Double?, percent: Double?) {
        let configuration = state.configuration
        let output: PCA9685.Output
        switch state.lastCommand {
        case .servo(let value)?: output = configuration.output(forServoValue: value)
        case .pwm(let value)?: output = configuration.output(forPWMValue: value)
        case nil: return (nil, nil)
        }
        switch (configuration.role, output) {
        case (.servo, .pulse(let width)), (.esc, .pulse(let width)): return (width.value, nil)
        case (.servo, .duty), (.esc, .duty): return (nil, nil)
        case (.pwm, .duty(let duty)): return (nil, duty * 100)
        // SERVO_VAL on a PWM channel: that width of the original 20 ms period.
        case (.pwm, .pulse(let width)): return (nil, width.value / ChannelConfiguration.originalPeriod.value * 100)
        }
    }
}
