import BLEControlProtocol
import Board
import Control
import Devices
import Firmware
import Hardware
import Logging
import Reactor

/// A board brought to life from its board file: the parts
/// (``BoardAssembly``), the event loop with its transports and the control
/// socket, the failsafe watch and the status LED. Start and stop run in a
/// fixed order: outputs are all off before any transport accepts a frame,
/// and transports close before the outputs are switched off at the end.
///
/// Who owns what: the servo path owns the failsafe state (the one source of
/// truth); the LCD service owns everything shown on the display, the
/// board's own messages included; this type only wires events between
/// them, on the event loop.
public final class BoardRuntime: @unchecked Sendable {
    // Everything mutable is loop-confined, except `stopped` (under `stopLock`).
    public internal(set) var configuration: BoardConfiguration
    public let loop: EventLoop
    let logger: Logger
    private let startedAt = ContinuousClock.now
    private let instanceLock: InstanceLock
    let parts: BoardAssembly
    let dispatcher: Dispatcher
    let hub: SessionHub
    let tcp: TCPTransport
    let ble: BLETransport
    let serial: SerialTransport?
    let mqtt: MQTTTransport?
    private let control: ControlServer
    private let controlSocketPath: String
    var watch: FailsafeWatch?
    /// A commander that left or went silent, and the outputs it was in
    /// control of: a central's command of one of them ends this hold.
    struct FailsafeHold {
        var reason: String
        var outputs: Set<Dispatcher.Output>
    }
    /// Who the failsafe holds for, oldest first; the failsafe ends when the
    /// last one does. Their outputs never overlap (taking an output over
    /// ends its hold), so there are at most as many as outputs. A failsafe
    /// that holds with none is one for a fault, a stall or a signal, which
    /// any central's command ends.
    var failsafeHolds: [FailsafeHold] = []
    private var indicator: StatusIndicator?
    var transportState = StatusReport.Transports()
    /// The pairing passkey on display (nil: none): never published, shown
    /// only to trusted control-socket callers.
    private var passkey: String?
    var reloads = 0
    var lastReload: String?
    private let stopLock = Lock()
    private var stopped = false
    /// systemd's notification socket (READY, STATUS, WATCHDOG), if any.
    public let notifier: SystemdNotifier

    /// The emulated chips of a simulator board (nil on real hardware).
    public var emulators: BoardEmulators? { parts.emulators.isEmpty ? nil : parts.emulators }

    /// Takes the board's instance lock, then builds every device the board
    /// file names. Nothing touches a bus yet.
    ///
    /// - Parameters:
    ///   - controlSocketPath: overrides the board file's control socket;
    ///     the instance lock lives beside it.
    ///   - notifier: systemd's notification socket (tests pass their own).
    ///   - outputsRecord: where to record the chips and line this daemon
    ///     drives (``OutputsRecord``), once the instance lock is ours and
    ///     before any device is opened, for `blecontrold safe-outputs`.
    public init(configuration: BoardConfiguration, logger: Logger, controlSocketPath: String? = nil, notifier: SystemdNotifier = SystemdNotifier(),
                outputsRecord: String? = nil) throws {
        self.configuration = configuration
        self.logger = logger
        self.notifier = notifier
        let socketPath = controlSocketPath ?? configuration.controlSocketPath
        self.controlSocketPath = socketPath
        // Before any device is opened: a second daemon must not touch the chips.
        instanceLock = try InstanceLock(directory: Files.environment("RUNTIME_DIRECTORY") ?? Files.directory(of: socketPath), board: configuration.name)
        if let outputsRecord {
            // Without it the crash cleanup falls back to the board file: a
            // warning, not a reason to leave the board off.
            do {
                try OutputsRecord.write(DrivenOutputs(configuration), to: outputsRecord)
            } catch {
                logger.error("the outputs record was not written (safe-outputs will read the board file instead): \(error)")
            }
        }
        loop = try EventLoop(name: "blecontrol-io")
        parts = try BoardAssembly(configuration: configuration, watchdogInterval: notifier.watchdogInterval, logger: logger)
        dispatcher = parts.dispatcher(logger: logger)
        hub = SessionHub(loop: loop, dispatcher: dispatcher, idleTimeout: configuration.protocolIdleTimeout, logger: logger)
        tcp = TCPTransport(loop: loop, hub: hub, maxConnections: configuration.tcp?.maxConnections ?? 64, logger: logger)
        ble = BLETransport(loop: loop, hub: hub, dispatcher: dispatcher, logger: logger)
        let (loop, hub, logger) = (loop, hub, logger)
        let hardware: MQTTDiscovery.Hardware = parts.emulators.isEmpty ? .fromDeviceTree(fallback: "BLEControl board") : .init(model: "BLEControl simulator")
        serial = configuration.serial.map { SerialTransport(loop: loop, hub: hub, configuration: $0, logger: logger) }
        mqtt = configuration.mqtt.map {
            MQTTTransport(loop: loop, hub: hub, configuration: $0, board: configuration, version: BLEControlVersion.string,
                          hardware: hardware,
                          logger: logger)
        }
        control = ControlServer(loop: loop, hub: hub, dispatcher: dispatcher, logger: logger)
        control.statusProvider = { [unowned self] in self.statusOnLoop() }
        control.pollProvider = { [unowned self] in self.pollOnLoop() }
        control.secretProvider = { [unowned self] in self.passkey }
        if configuration.ble.enabled {
            control.bondsForgetter = { [unowned self] done in self.ble.forgetBonds(done) }
        }
        wire()
    }

    /// Starts everything in order. A device that does not answer is not an
    /// error here: it is reported and retried; a transport that cannot bind is.
    ///
    /// - Parameter loopStarted: runs on the loop before any transport
    ///   accepts (the daemon attaches its signal source there).
    public func start(tcpOverride: (host: String, port: UInt16)? = nil, loopStarted: (@Sendable (EventLoop) throws -> Void)? = nil) throws {
        // Outputs first: the servo thread switches every output off before it
        // applies anything, and no transport exists yet to submit anything.
        parts.servo?.start()
        parts.lcd?.start()
        loop.start()
        try loop.submitAndWait { [self] in
            try loopStarted?(loop)
            if let endpoint = tcpOverride ?? configuration.tcp.map({ ($0.host, $0.port) }) {
                try tcp.start(host: endpoint.0, port: endpoint.1)
                transportState.tcp = "\(endpoint.0):\(tcp.port ?? endpoint.1)"
            } else {
                transportState.tcp = "disabled in the board file"
            }
            if configuration.ble.enabled {
                // Never fails for a missing BlueZ: that is a state in status, retried.
                try ble.start(configuration: configuration.ble, boardName: configuration.name, version: BLEControlVersion.string)
            } else {
                transportState.ble = "disabled in the board file"
            }
            if let serial {
                serial.onState = { [unowned self] state in transportState.serial = state }
                serial.start()
            }
            if let mqtt {
                mqtt.onState = { [unowned self] state in transportState.mqtt = state }
                // What the broker keeps is read by anyone who may subscribe:
                // no passkey, or `ble.security: authenticated` means nothing.
                mqtt.statusProvider = { [unowned self] in self.statusOnLoop().hiding(self.passkey) }
                mqtt.start()
            }
            try control.start(path: controlSocketPath)
            transportState.control = controlSocketPath
            indicator?.start()
        }
        notifier.notify("READY=1\nSTATUS=board \(configuration.name) running")
    }

    /// Stops in reverse order: transports (sessions end), then the LCD, then
    /// the servo path, which switches every output off. Idempotent.
    public func stop() {
        let first = stopLock.withLock { () -> Bool in
            defer { stopped = true }
            return !stopped
        }
        guard first else { return }
        notifier.notify("STOPPING=1\nSTATUS=stopping: outputs off")
        if !loop.inLoop {
            _ = try? loop.submitAndWait { [self] in
                tcp.stop()
                serial?.stop()
                mqtt?.stop()
                control.stop()
                watch?.cancel()
                indicator?.stop()
            }
        }
        ble.stop()
        loop.stop()
        parts.lcd?.stop()
        parts.servo?.stop()
        if let led = parts.led {
            led.pattern = .off
            _ = led.update(at: .now)
        }
        instanceLock.release()
    }

    /// The TCP port actually bound (for tests that ask for port 0).
    public var tcpPort: UInt16? {
        try? loop.submitAndWait { [self] in tcp.port }
    }

    /// The status report, gathered on the loop.
    public func status() throws -> StatusReport {
        try loop.submitAndWait { [self] in statusOnLoop() }
    }

    /// Clears servo latency figures (benchmarks measure phases separately).
    public func resetServoMetrics() { parts.servo?.resetMetrics() }

    /// Engages the failsafe from outside (tests, signals).
    public func engageFailsafe(reason: String) {
        parts.servo?.engageFailsafe(reason: reason)
    }

    // MARK: Wiring

    /// Every failsafe trigger to the servo path's engine, and its outcome to
    /// the LCD, the LED and systemd: a central leaving while in control of
    /// an output, silence from the centrals in control, a stalled servo
    /// thread, a lasting I2C fault (the servo path's own).
    private func wire() {
        let notifier = self.notifier
        hub.onActivity = { [unowned self] in self.mqtt?.statusMayHaveChanged() }
        if let led = parts.led {
            indicator = StatusIndicator(loop: loop, led: led) { [unowned self] in self.ledPattern() }
        }
        guard let servo = parts.servo else {
            hub.onCentralsChanged = { [unowned self] _ in self.indicator?.refresh() }
            return
        }
        servo.onHeartbeat = { notifier.watchdogPing() }
        servo.onFailsafe = { [weak self] reason in
            notifier.notify("STATUS=failsafe: \(reason)")
            guard let self else { return }
            self.loop.execute { self.failsafeEngaged(reason) }
        }
        let watch = FailsafeWatch(
            loop: loop, silenceTimeout: configuration.silenceTimeout, stallTimeout: configuration.stallTimeout,
            lastFrame: { [unowned self] in self.hub.quietestCommanderFrameAt },
            silence: { [unowned self] timeout in self.hub.silenceCommanders(quietFor: timeout) },
            busyFor: { servo.busyFor(at: $0) },
            acknowledgeBusy: { servo.acknowledgeBusy() },
            runnableTime: { servo.runnableTime() },
            engage: { reason in servo.engageFailsafe(reason: reason) }
        )
        self.watch = watch
        // Built once: the servo thread hands the loop this same closure at
        // each report, and allocates nothing (a closure capturing `since`
        // would be a heap allocation on the real-time path at every report,
        // through the one malloc arena the event loop uses too: issue #29).
        // The loop reads the transfer's start back from the servo path.
        let reportBusy: @Sendable () -> Void = { [weak self] in
            guard let self else { return }
            let now = self.loop.now
            self.watch?.servoBusy(since: now - (servo.busyFor(at: now) ?? .zero))
        }
        servo.onBusy = { [loop] _ in loop.execute(reportBusy) }
        hub.onFrame = { watch.frameArrived() }
        hub.onCentralInControl = { [unowned self] _, taken in
            // A failsafe a commander took with it (left, or went silent)
            // ends when a central takes one of those outputs over; another
            // central's commands of its own outputs end nothing (issue 36).
            // Any other failsafe (a fault, a stall) ends with any command.
            let left = failsafeHolds.filter { $0.outputs.isDisjoint(with: taken) }
            if !failsafeHolds.isEmpty, left.count == failsafeHolds.count { return }
            guard let oldest = left.first else {
                endFailsafe()
                return
            }
            // Another commander's outputs still hold it: under its reason now.
            failsafeHolds = left
            parts.servo?.holdFailsafe(reason: oldest.reason)
        }
        control.channelsProvider = { [unowned self] in self.configuration.servo?.channels ?? [] }
        control.failsafeClearer = { [unowned self] who in
            let cleared = endFailsafe()
            if let cleared {
                logger.notice("failsafe cleared by \(who) (was: \(cleared.reason)); the outputs stay as it left them until a command moves them")
            }
            return cleared?.reason
        }
        hub.onCentralsChanged = { [unowned self] _ in self.indicator?.refresh() }
        hub.onCommanderLeft = { [unowned self] session, outputs in
            commanderFailsafe(Self.commanderLeftReason(session, outputs), outputs)
        }
        hub.onCommanderSilent = { [unowned self] session, outputs in
            commanderFailsafe(Self.commanderLeftReason(session, outputs, silent: true), outputs)
        }
        ble.onPasskey = { [unowned self] passkey in
            self.passkey = passkey
            defer { mqtt?.statusMayHaveChanged() }
            guard let lcd = parts.lcd else { return }
            lcd.show(.passkey, passkey.map { passkey in
                // The passkey on the bottom line; the rows above show through.
                Array(repeating: nil, count: max(lcd.rows - 1, 0)) + ["PIN \(passkey)"]
            })
        }
    }

    /// On the loop: the failsafe is over (a central took control, or the
    /// operator said so); the LCD, LED, systemd and the broker are told.
    @discardableResult
    private func endFailsafe() -> ServoPath.Failsafe? {
        failsafeHolds = []
        guard let cleared = parts.servo?.clearFailsafe() else { return nil }
        notifier.notify("STATUS=board \(configuration.name) running (failsafe cleared: \(cleared.reason))")
        parts.lcd?.show(.failsafe, nil)
        indicator?.refresh()
        mqtt?.statusMayHaveChanged()
        return cleared
    }

    /// On the loop: a commander left or went silent with `outputs`. Its
    /// hold ends only when a central takes one of them over, also when it
    /// joins a failsafe that any command would end (a stall, a fault): the
    /// failsafe holds for this commander from then on, or the next command
    /// another central gave its own outputs would end it (issue 36). Beside
    /// another commander's hold, each ends on its own outputs; the oldest
    /// one's reason is the failsafe's.
    private func commanderFailsafe(_ reason: String, _ outputs: [Dispatcher.Output]) {
        guard let servo = parts.servo else { return }
        if servo.failsafeReason == nil { failsafeHolds = [] }
        failsafeHolds.append(FailsafeHold(reason: reason, outputs: Set(outputs)))
        servo.holdFailsafe(reason: failsafeHolds[0].reason)
    }

    /// "central left: tcp 127.0.0.1:40000 (channels 0, 4; switch 1)": what
    /// it was, and what it was in control of. The first 16 characters are
    /// what a 16×2 LCD shows under FAILSAFE.
    static func commanderLeftReason(_ session: Session, _ outputs: [Dispatcher.Output], silent: Bool = false) -> String {
        var channels: [String] = []
        var switches: [String] = []
        for output in outputs {
            switch output {
            case .channel(let channel): channels.append("\(channel)")
            case .switch(let index): switches.append("\(index)")
            }
        }
        var parts: [String] = []
        if !channels.isEmpty { parts.append("\(channels.count == 1 ? "channel" : "channels") \(channels.joined(separator: ", "))") }
        if !switches.isEmpty { parts.append("\(switches.count == 1 ? "switch" : "switches") \(switches.joined(separator: ", "))") }
        return "\(silent ? "central silent" : "central left"): \(session.transport) \(session.peer) (\(parts.joined(separator: "; ")))"
    }

    /// On the loop: the board's own message on the LCD while the failsafe
    /// holds (the centrals' text comes back when it ends), and the LED.
    private func failsafeEngaged(_ reason: String) {
        parts.switches?.failsafe()
        parts.lcd?.show(.failsafe, ["FAILSAFE", reason])
        indicator?.refresh()
        mqtt?.statusMayHaveChanged()
    }

    private func ledPattern() -> StatusLED.Pattern {
        if parts.servo?.offlineOrInFailsafe == true { return .fastBlink }
        return hub.centralCount > 0 ? .heartbeat : .slowBlink
    }

    // MARK: Status

    private func statusOnLoop() -> StatusReport {
        let ble = configuration.ble.enabled ? self.ble.stateDescription : nil
        var transports = transportState
        if let ble { transports.ble = ble }
        return StatusAssembler(
            configuration: configuration, parts: parts, hub: hub, dispatcher: dispatcher,
            refusedConnections: tcp.statistics.refused, transports: transports,
            reloads: reloads, lastReload: lastReload
        ).report(now: .now, startedAt: startedAt)
    }

    private func pollOnLoop() -> PollReport {
        StatusAssembler.poll(parts: parts, dispatcher: dispatcher)
    }
}
