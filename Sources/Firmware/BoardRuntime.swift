import BLEControlProtocol
import DeviceEmulators
import Devices
import Foundation
import Hardware
import LinuxHardware
import Logging

/// A board brought to life from its board file: buses and devices, the
/// servo path, the LCD service, the LED, the event loop with its transports
/// and the control socket. Start and stop run in a fixed order: outputs are
/// all off before any transport accepts a frame, and transports close before
/// the outputs are switched off at the end.
///
/// The simulator is just a board whose buses are emulated: the emulators are
/// attached here and nothing above this type knows the difference.
public final class BoardRuntime: @unchecked Sendable {
    /// A board file that names hardware this build cannot drive.
    public struct SetupError: Error, CustomStringConvertible {
        public var description: String
    }

    public let configuration: BoardConfiguration
    public let loop: EventLoop
    private let logger: Logger
    private let startedAt = ContinuousClock.now
    private let servo: ServoPath?
    private let servoFrequency: Hertz
    private let lcd: LCDService?
    private let led: StatusLED?
    private let dispatcher: Dispatcher
    private let hub: SessionHub
    private let tcp: TCPTransport
    private let ble: BLETransport
    private let control: ControlServer
    private let observer: EmulatorObserver?
    private var transportState: [String: String] = [:]
    private var ledTimer: EventLoop.Token?
    private var controlSocketOverride: String?
    private var failsafeTimer: EventLoop.Token?
    private let servoArbiter: BusArbiter?
    private let stopLock = NSLock()
    private var stopped = false
    /// The last frame instant a silence failsafe fired for (fires once per silence).
    private var silencedAt: ContinuousClock.Instant?
    /// systemd's notification socket (READY, STATUS, WATCHDOG), if any.
    public let notifier = SystemdNotifier()

    /// The emulated devices of a simulator board (nil on real hardware).
    public struct Emulators: @unchecked Sendable {
        public var buses: [String: EmulatedI2CBus] = [:]
        public var pca9685: PCA9685Emulator?
        public var lcd: LCDBackpackEmulator?
        public var led: EmulatedDigitalOutput?
    }

    public let emulators: Emulators?

    /// Builds every device the board file names. Nothing touches a bus yet.
    public init(configuration: BoardConfiguration, logger: Logger) throws {
        self.configuration = configuration
        self.logger = logger
        loop = try EventLoop()

        var emulators = Emulators()
        var arbiters: [String: BusArbiter] = [:]
        for (name, bus) in try BoardBuses.open(configuration, logger: logger) {
            if let emulated = bus as? EmulatedI2CBus { emulators.buses[name] = emulated }
            arbiters[name] = BusArbiter(bus: bus)
        }

        servoArbiter = configuration.servo.flatMap { arbiters[$0.bus] }
        if let servoConfiguration = configuration.servo, let arbiter = arbiters[servoConfiguration.bus] {
            if let emulated = emulators.buses[servoConfiguration.bus] {
                let chip = PCA9685Emulator(oscillator: servoConfiguration.oscillator)
                emulated.attach(chip, at: servoConfiguration.address)
                emulators.pca9685 = chip
            }
            let driver = PCA9685(
                bus: arbiter.client(.servo),
                configuration: PCA9685.Configuration(
                    address: servoConfiguration.address,
                    frequency: servoConfiguration.frequency,
                    oscillator: servoConfiguration.oscillator,
                    totemPole: servoConfiguration.totemPole
                ),
                logger: logger
            )
            servoFrequency = driver.actualFrequency
            var timing = ServoPath.Timing()
            timing.period = .microseconds(Int64(1_000_000 / servoFrequency.value))
            timing.faultFailsafeAfter = configuration.faultTimeout
            timing.maxFlushesPerPeriod = servoConfiguration.maxFlushesPerPeriod
            servo = ServoPath(
                driver: driver, channels: servoConfiguration.channels, timing: timing,
                realtime: configuration.realtimePriority > 0 ? ServoPath.Realtime(priority: configuration.realtimePriority) : nil,
                logger: logger
            )
        } else {
            servoFrequency = Hertz(50)
            servo = nil
        }

        if let lcdConfiguration = configuration.lcd, let arbiter = arbiters[lcdConfiguration.bus] {
            let geometry = LCDGeometry(columns: lcdConfiguration.columns, rows: lcdConfiguration.rows)
            if let emulated = emulators.buses[lcdConfiguration.bus] {
                let display = LCDBackpackEmulator(columns: lcdConfiguration.columns, rows: lcdConfiguration.rows, pinMap: lcdConfiguration.pins)
                emulated.attach(display, at: lcdConfiguration.address)
                emulators.lcd = display
            }
            let driver = HD44780(
                bus: arbiter.client(.display),
                backpack: PCF8574Backpack(address: lcdConfiguration.address, pinMap: lcdConfiguration.pins),
                geometry: geometry,
                charactersPerTransaction: lcdConfiguration.charsPerTransaction,
                logger: logger
            )
            lcd = LCDService(driver: driver, geometry: geometry, logger: logger)
        } else {
            lcd = nil
        }

        switch configuration.led {
        case .emulated?:
            let output = EmulatedDigitalOutput()
            emulators.led = output
            led = StatusLED(output: output, logger: logger)
        case .gpio(let chip, let line, let lineName, let activeLow)?:
            do {
                led = StatusLED(output: try GPIODLine(chip: chip, offset: line, lineName: lineName, activeLow: activeLow), logger: logger)
            } catch {
                throw SetupError(description: "led: \(error)")
            }
        case nil:
            led = nil
        }

        let isSimulated = !emulators.buses.isEmpty || emulators.led != nil
        self.emulators = isSimulated ? emulators : nil
        observer = isSimulated ? EmulatorObserver(emulators: emulators, servo: configuration.servo) : nil
        dispatcher = Dispatcher(servo: servo, lcd: lcd, logger: logger)
        hub = SessionHub(loop: loop, dispatcher: dispatcher, idleTimeout: configuration.protocolIdleTimeout, logger: logger)
        tcp = TCPTransport(loop: loop, hub: hub, logger: logger)
        ble = BLETransport(loop: loop, hub: hub, dispatcher: dispatcher, lcd: lcd, logger: logger)
        control = ControlServer(loop: loop, hub: hub, dispatcher: dispatcher, logger: logger)
        control.statusProvider = { [unowned self] in self.statusOnLoop() }
        wireFailsafe()
    }

    /// Starts everything in order. A device that does not answer is not an
    /// error here: it is reported and retried; a transport that cannot bind is.
    public func start(controlSocketPath: String? = nil, tcpOverride: (host: String, port: UInt16)? = nil) throws {
        // Outputs first: the servo thread switches every output off before it
        // applies anything, and no transport exists yet to submit anything.
        servo?.start()
        lcd?.start()
        loop.start()
        let socketPath = controlSocketPath ?? configuration.controlSocketPath
        try loop.submitAndWait { [self] in
            if let endpoint = tcpOverride ?? configuration.tcp.map({ ($0.host, $0.port) }) {
                try tcp.start(host: endpoint.0, port: endpoint.1)
                transportState["tcp"] = "\(endpoint.0):\(tcp.port ?? endpoint.1)"
            } else {
                transportState["tcp"] = "disabled in the board file"
            }
            if configuration.ble.enabled {
                // Never fails: no bus or no BlueZ is a state in status, retried.
                ble.start(configuration: configuration.ble, boardName: configuration.name)
            } else {
                transportState["ble"] = "disabled in the board file"
            }
            try control.start(path: socketPath)
            transportState["control"] = socketPath
            led?.pattern = .slowBlink
            scheduleLED()
            scheduleFailsafeWatch()
        }
        notifier.notify("READY=1\nSTATUS=board \(configuration.name) running")
    }

    /// Stops in reverse order: transports (sessions end), then the LCD, then
    /// the servo path, which switches every output off.
    public func stop() {
        // Idempotent: a signal handler and a deinit may both ask.
        let first = stopLock.withLock { () -> Bool in
            defer { stopped = true }
            return !stopped
        }
        guard first else { return }
        notifier.notify("STOPPING=1\nSTATUS=stopping: outputs off")
        if loop.isOnLoop == false {
            try? loop.submitAndWait { [self] in
                ble.stop()
                tcp.stop()
                control.stop()
                if let ledTimer { loop.cancelTimer(ledTimer) }
                if let failsafeTimer { loop.cancelTimer(failsafeTimer) }
            }
        }
        loop.stop()
        lcd?.stop()
        servo?.stop()
        led?.pattern = .off
        _ = led?.update(at: .now)
    }

    /// The TCP port actually bound (for tests that ask for port 0).
    public var tcpPort: UInt16? {
        try? loop.submitAndWait { [self] in tcp.port }
    }

    /// The status report, gathered on the loop thread.
    public func status() throws -> StatusReport {
        try loop.submitAndWait { [self] in statusOnLoop() }
    }

    /// Clears servo latency figures (benchmarks measure phases separately).
    public func resetServoMetrics() { servo?.resetMetrics() }

    /// Engages the failsafe from outside (tests, signals).
    public func engageFailsafe(reason: String) {
        servo?.engageFailsafe(reason: reason)
    }

    // MARK: Failsafe triggers

    /// One place wires every trigger to the servo path's failsafe engine:
    /// the last central leaving, silence, a stalled servo thread (watched
    /// here), a lasting I2C fault (watched by the servo path itself).
    private func wireFailsafe() {
        guard let servo else { return }
        let notifier = self.notifier
        let lcd = self.lcd
        servo.onHeartbeat = { notifier.watchdogPing() }
        servo.onFailsafe = { reason in
            notifier.notify("STATUS=failsafe: \(reason)")
            // A short reason where a human looks; the next LCD_TEXT replaces it.
            lcd?.setLine(0, text: Array("FAILSAFE".utf8))
            lcd?.setLine(1, text: Array(reason.utf8))
        }
        hub.onFrames = { servo.clearFailsafe() }
        hub.onLastCentralClosed = { session in
            servo.engageFailsafe(reason: "last central disconnected (\(session.transport) \(session.peer))")
        }
    }

    /// A loop timer for the silence timeout and the stall watch, and the
    /// watchdog ping when there is no servo thread to send it.
    private func scheduleFailsafeWatch() {
        let now = ContinuousClock.now
        if let servo {
            if let busy = servo.busyFor(at: now), busy >= configuration.stallTimeout {
                servo.engageFailsafe(reason: "servo thread stalled in a bus write for \(Int(busy.inSeconds * 1000)) ms")
            }
            if let silence = configuration.silenceTimeout, let last = hub.lastFrameAt, last.duration(to: now) >= silence,
               servo.snapshot().failsafe == nil, hub.lastFrameAt != silencedAt {
                silencedAt = hub.lastFrameAt
                servo.engageFailsafe(reason: "no frame for \(Int(silence.inSeconds * 1000)) ms")
            }
        } else {
            notifier.watchdogPing(at: now)
        }
        // A tenth of the shortest timeout keeps the reaction within 10 %.
        var interval = configuration.stallTimeout / 10
        if let silence = configuration.silenceTimeout { interval = min(interval, silence / 10) }
        interval = max(interval, .milliseconds(5))
        failsafeTimer = loop.schedule(at: now + interval) { [weak self] in self?.scheduleFailsafeWatch() }
    }

    // MARK: Loop thread

    private func scheduleLED() {
        guard let led else { return }
        let anySession = !hub.sessions.filter { $0.transport != "control" }.isEmpty
        let servoDown = servo.map { let snapshot = $0.snapshot(); return !snapshot.online || snapshot.failsafe != nil } ?? false
        led.pattern = servoDown ? .fastBlink : (anySession ? .heartbeat : .slowBlink)
        let next = led.update(at: .now) ?? ContinuousClock.now.advanced(by: .milliseconds(500))
        // Re-evaluate at least twice a second so the pattern follows connects.
        let deadline = min(next, ContinuousClock.now.advanced(by: .milliseconds(500)))
        ledTimer = loop.schedule(at: deadline) { [weak self] in self?.scheduleLED() }
    }

    private func statusOnLoop() -> StatusReport {
        let now = ContinuousClock.now
        var channels: [StatusReport.Channel] = []
        var servoStatus: StatusReport.Servo?
        if let servo {
            let snapshot = servo.snapshot()
            for state in snapshot.channels {
                let configuration = state.configuration
                var command: String?
                var value: Int?
                switch state.lastCommand {
                case .servo(let v)?: command = "servo"; value = Int(v)
                case .pwm(let v)?: command = "pwm"; value = Int(v)
                case nil: break
                }
                let produced = observer?.output(configuration.output) ?? intendedOutput(state)
                channels.append(StatusReport.Channel(
                    channel: configuration.channel, output: configuration.output, role: "\(configuration.role)",
                    enabled: state.enabled, command: command, value: value,
                    pulseUs: (produced.pulse * 10).rounded() / 10, duty: (produced.duty * 10000).rounded() / 10000,
                    latched: state.latched
                ))
            }
            let metrics = snapshot.metrics
            servoStatus = StatusReport.Servo(
                online: snapshot.online, error: snapshot.lastError, frequencyHz: (servoFrequency.value * 100).rounded() / 100,
                updates: metrics.updates, coalesced: metrics.coalesced, flushes: metrics.flushes,
                busWrites: metrics.busTransactions, failedFlushes: metrics.failedFlushes,
                latencyP50Us: metrics.latency.percentile(0.5), latencyP99Us: metrics.latency.percentile(0.99),
                latencyMaxUs: metrics.latency.count > 0 ? metrics.latency.maximumMicroseconds : nil,
                deadlineMisses: metrics.deadlineMisses, failsafe: snapshot.failsafe?.reason,
                failsafeSeconds: snapshot.failsafe.map { ($0.since.duration(to: now).inSeconds * 10).rounded() / 10 },
                failsafeAppliedMs: snapshot.failsafe?.appliedAfter.map { ($0.inSeconds * 10_000).rounded() / 10 },
                failsafes: metrics.failsafes, scheduling: snapshot.scheduling,
                maxLcdChunksWaited: servoArbiter?.statistics.maxDisplayTransactionsWaited ?? 0,
                maxBusWaitUs: servoArbiter?.statistics.maxServoWaitMicroseconds ?? 0
            )
        }
        var lcdStatus: StatusReport.LCD?
        if let lcd, let lcdConfiguration = configuration.lcd {
            let snapshot = lcd.snapshot()
            lcdStatus = StatusReport.LCD(
                online: snapshot.online, error: snapshot.lastError,
                columns: lcdConfiguration.columns, rows: lcdConfiguration.rows,
                lines: observer?.displayLines() ?? snapshot.lines, busWrites: snapshot.busTransactions
            )
        }
        let ledStatus = led.map { led in
            StatusReport.LED(pattern: "\(led.pattern)", lit: observer?.ledLit() ?? led.isLit, error: nil)
        }
        let sessions = hub.sessions.map { session in
            StatusReport.SessionInfo(
                id: session.id, transport: session.transport, peer: session.peer,
                bytes: session.counters.bytes, frames: session.counters.frames, errors: session.counters.errors,
                connectedSeconds: session.connectedAt.duration(to: now).inSeconds
            )
        }
        let counters = dispatcher.counters
        return StatusReport(
            board: configuration.name, version: BLEControlVersion.string,
            uptimeSeconds: (startedAt.duration(to: now).inSeconds * 10).rounded() / 10,
            simulated: observer != nil, channels: channels, servo: servoStatus, lcd: lcdStatus, led: ledStatus,
            sessions: sessions,
            counters: StatusReport.Counters(frames: counters.frames, errors: counters.errors, discardedPartials: counters.discardedPartials, sessionsTotal: hub.totalOpened),
            transports: configuration.ble.enabled ? transportState.merging(["ble": ble.state]) { $1 } : transportState
        )
    }

    /// On hardware, what the driver was asked to produce.
    private func intendedOutput(_ state: ServoPath.ChannelState) -> (pulse: Double, duty: Double) {
        guard state.enabled, let output = state.output else { return (0, 0) }
        let period = 1_000_000 / servoFrequency.value
        switch output {
        case .pulse(let width): return (width.value, width.value / period)
        case .duty(let duty): return (duty * period, duty)
        }
    }
}

/// Reads what the emulated chips decoded from the bus traffic, so status on
/// the simulator checks the drivers, not the daemon's intentions.
struct EmulatorObserver: @unchecked Sendable {
    let emulators: BoardRuntime.Emulators
    let servo: ServoConfiguration?

    func output(_ output: Int) -> (pulse: Double, duty: Double)? {
        guard let chip = emulators.pca9685 else { return nil }
        let produced = chip.output(channel: output)
        return (produced.pulseWidth.value, produced.duty)
    }

    func displayLines() -> [String]? {
        emulators.lcd.map { $0.lcd.lines }
    }

    func ledLit() -> Bool? {
        emulators.led?.isActive
    }
}

/// Opens the I2C buses a board file names: one place for the emulated and
/// the Linux backends, used by the daemon and by `safe-outputs`.
public enum BoardBuses {
    public static func open(_ configuration: BoardConfiguration, logger: Logger) throws -> [String: any I2CBus] {
        var buses: [String: any I2CBus] = [:]
        for (name, bus) in configuration.buses {
            switch bus.kind {
            case .emulated:
                buses[name] = EmulatedI2CBus(maxWriteLength: bus.maxWriteLength, byteTime: bus.byteTime)
            case .device(let path):
                do {
                    // On an SMBus-only adapter the PCF8574's port bytes go out
                    // as I2C block writes: the "command" byte is just the
                    // first port byte on the wire, and the PCF8574 latches
                    // every byte it receives (NXP PCF8574 datasheet §8.2), so
                    // a 33-byte block equals a plain write (the HD44780 driver
                    // keeps writes within maxWriteLength): 4 transfers per
                    // LCD line instead of 68 send-bytes.
                    buses[name] = try LinuxI2CBus(path: path, logger: logger)
                } catch {
                    throw BoardRuntime.SetupError(description: "bus \(name): \(error)")
                }
            }
        }
        return buses
    }

    /// Switches every PCA9685 output off with one write, without starting
    /// or sleeping the chip: what `blecontrold safe-outputs` does after a
    /// crash (systemd's ExecStopPost=). Returns what it did, per chip.
    public static func safeOutputs(_ configuration: BoardConfiguration, logger: Logger) throws -> String {
        guard let servo = configuration.servo, let kind = configuration.buses[servo.bus]?.kind else {
            return "no servo controller on this board: nothing to switch off"
        }
        if kind == .emulated { return "the servo bus is emulated: nothing outlives the daemon, nothing to switch off" }
        let buses = try open(configuration, logger: logger)
        guard let bus = buses[servo.bus] else { return "no bus \(servo.bus)" }
        let driver = PCA9685(bus: bus, configuration: PCA9685.Configuration(address: servo.address, frequency: servo.frequency, oscillator: servo.oscillator, totemPole: servo.totemPole), logger: logger)
        try driver.allOff()
        return "PCA9685 \(servo.address) on \(servo.bus): every output off"
    }
}

/// The firmware's version, shown in status and `--version`.
public enum BLEControlVersion {
    public static let string = "0.1.0"
}
