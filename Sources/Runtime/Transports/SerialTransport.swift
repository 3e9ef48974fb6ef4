import Board
import Firmware
import LinuxHardware
import Logging
import Reactor
import SystemPackage

/// BLEControl frames through an HM-10 BLE module on a UART, as the original
/// board had them: the module is the peripheral (FFE0/FFE1), the UART
/// carries FFE1's bytes both ways. At start the module is set up with AT
/// commands (connection notices on, the name) when the board file asks; its
/// `OK+CONN` opens a session and `OK+LOST` closes it, so the failsafe works
/// as with BLE through bluetoothd. A module that does not notify (or did not
/// answer AT) still works: the first data opens the session. A missing or
/// lost device is reported in status and tried again every two seconds.
/// Lives on the event loop.
public final class SerialTransport: @unchecked Sendable {
    // Loop-confined: used only on the event loop.
    private let loop: EventLoop
    private let hub: SessionHub
    private let configuration: SerialConfiguration
    private let logger: Logger
    private var connection: StreamConnection?
    private var session: Session?
    private var stream = HM10Stream()
    /// Releases what `stream` holds once the line has been quiet.
    private var holdTimer: LoopToken?
    private var setup: Setup?
    private var retryTimer: LoopToken?
    private var stopped = false
    private var lastOpenError: String?
    private var moduleAnswered: Bool?
    /// Replies dropped because the line was a second behind.
    public private(set) var droppedReplies = 0
    /// One line per 10 s for replies dropped (a peer can make it happen at will).
    private let droppedReplyLog = LogLimiter(burst: 1, window: .seconds(10))
    /// Called with a one-line state for status whenever it changes.
    public var onState: (String) -> Void = { _ in }

    /// The AT conversation at start: one command at a time, each answered
    /// by exactly its reply (HM-10 commands have no line ending).
    private struct Setup {
        var steps: [(command: String, reply: String)]
        var received: [UInt8] = []
        var timer: LoopToken?
    }

    /// How long the module may take to answer one AT command.
    static let replyTimeout: Duration = .seconds(1)
    static let retryInterval: Duration = .seconds(2)

    public init(loop: EventLoop, hub: SessionHub, configuration: SerialConfiguration, logger: Logger) {
        self.loop = loop
        self.hub = hub
        self.configuration = configuration
        self.logger = logger
    }

    /// Opens the port and starts (on the loop). Never throws for a missing
    /// device: that is a state, tried again.
    public func start() {
        loop.assertInLoop()
        stopped = false
        open()
    }

    /// Closes the port; a connected central's session ends.
    public func stop() {
        loop.assertInLoop()
        stopped = true
        if let timer = retryTimer { loop.cancel(timer) }
        retryTimer = nil
        cancelHoldTimer()
        if let timer = setup?.timer { loop.cancel(timer) }
        setup = nil
        endSession(reason: nil)
        connection?.close()
        connection = nil
    }

    private var where_: String { "\(configuration.device) at \(configuration.baud) baud" }

    private func open() {
        let fd: Int32
        do {
            fd = try SerialPort.open(configuration.device, baud: configuration.baud)
        } catch {
            let text = "\(error)"
            if text != lastOpenError { logger.error("serial: \(text); trying again every \(Self.retryInterval)") }
            lastOpenError = text
            onState("\(text) (retrying)")
            retryTimer = loop.schedule(after: Self.retryInterval) { [weak self] in
                guard let self, !self.stopped else { return }
                self.retryTimer = nil
                self.open()
            }
            return
        }
        lastOpenError = nil
        // Bytes held from a device that went away are not this one's.
        stream = HM10Stream()
        let connection = StreamConnection(fd: FileDescriptor(rawValue: fd), loop: loop)
        self.connection = connection
        connection.onData = { [weak self] bytes in self?.received(bytes) }
        connection.onClose = { [weak self] reason in self?.lost(reason: reason) }
        do {
            try connection.start()
        } catch {
            logger.error("serial: \(where_): \(error)")
            connection.close()
            return
        }
        logger.info("serial transport on \(where_)")
        if configuration.atSetup {
            var steps = [(command: "AT", reply: "OK"), (command: "AT+NOTI1", reply: "OK+Set:1")]
            if let name = configuration.name { steps.append((command: "AT+NAME\(name)", reply: "OK+Set:\(name)")) }
            setup = Setup(steps: steps)
            onState("\(where_): setting up the HM-10")
            sendNextCommand()
        } else {
            ready()
        }
    }

    // MARK: AT set-up

    private func sendNextCommand() {
        guard var current = setup, let step = current.steps.first else { return ready() }
        current.received.removeAll()
        current.timer = loop.schedule(after: Self.replyTimeout) { [weak self] in self?.setupTimedOut() }
        setup = current
        connection?.send(Array(step.command.utf8))
    }

    private func setupReceived(_ bytes: ArraySlice<UInt8>) {
        guard var current = setup, let step = current.steps.first else { return }
        current.received += bytes
        let expected = Array(step.reply.utf8)
        if current.received == expected {
            if let timer = current.timer { loop.cancel(timer) }
            if step.command == "AT" { moduleAnswered = true }
            current.steps.removeFirst()
            setup = current
            sendNextCommand()
        } else if !expected.starts(with: current.received) {
            // Not the module answering: a central is connected already and
            // these are its bytes (and our AT went to it). Set-up stops.
            if let timer = current.timer { loop.cancel(timer) }
            logger.warning("serial: unexpected bytes while setting up the HM-10 on \(where_) (a central already connected?); set-up skipped")
            setup = nil
            ready(leftover: current.received)
        } else {
            setup = current
        }
    }

    private func setupTimedOut() {
        guard var current = setup, let step = current.steps.first else { return }
        current.timer = nil
        if step.command == "AT" {
            moduleAnswered = false
            logger.warning("serial: the HM-10 on \(where_) did not answer AT (not an HM-10, another baud rate, or a central connected): frames work, but a lost central is only noticed by failsafe.silence_timeout_ms")
            setup = nil
            return ready(leftover: current.received)
        }
        logger.warning("serial: the HM-10 on \(where_) did not answer \(step.command)")
        current.steps.removeFirst()
        setup = current
        sendNextCommand()
    }

    private func ready(leftover: [UInt8] = []) {
        setup = nil
        publishState()
        if !leftover.isEmpty { dispatch(leftover[...]) }
    }

    // MARK: Transparent mode

    private func received(_ bytes: ArraySlice<UInt8>) {
        if setup != nil { return setupReceived(bytes) }
        dispatch(bytes)
    }

    private func dispatch(_ bytes: ArraySlice<UInt8>) {
        stream.feed(bytes, at: loop.now, atFrameBoundary: { [self] in !(session?.hasPartialFrame ?? false) }) { [self] event in handle(event) }
        if !stream.pending.isEmpty, let session { hub.bytesHeld(for: session) }
        armHoldTimer()
    }

    private func handle(_ event: HM10Stream.Event) {
        switch event {
        case .connected:
            if session == nil { openSession(reason: "OK+CONN") }
        case .lost:
            endSession(reason: "OK+LOST")
        case .data(let data):
            // Data without a notice: the module does not notify, or the
            // central was there before we started. It is a central.
            if session == nil { openSession(reason: "data") }
            if let session { hub.receive(data, for: session) }
        }
    }

    /// A timer for what `stream` holds. A new byte only moves the deadline
    /// later, so a timer already armed is kept and re-armed when it fires.
    private func armHoldTimer() {
        guard holdTimer == nil, let deadline = stream.deadline else { return }
        holdTimer = loop.schedule(at: deadline + .nanoseconds(1)) { [weak self] in
            // Timers run before the loop reads its descriptors: a loop that
            // woke late would judge the line quiet with the rest of a notice
            // waiting unread in the tty. The hop lets this round's reads in
            // first.
            self?.loop.execute { [weak self] in self?.releaseHeld() }
        }
    }

    private func releaseHeld() {
        holdTimer = nil
        guard connection != nil else { return }
        stream.expire(at: loop.now) { [self] event in handle(event) }
        armHoldTimer()
    }

    private func cancelHoldTimer() {
        if let timer = holdTimer { loop.cancel(timer) }
        holdTimer = nil
    }

    private func openSession(reason: String) {
        session = hub.open(transport: .serial, peer: "HM-10 on \(configuration.device)") { [weak self] bytes in self?.reply(bytes) }
        logger.info("serial: central connected (\(reason))")
        publishState()
    }

    /// Sends a reply to the central, unless a second of the line's time is
    /// queued already: the UART (no flow control) drains at the baud rate
    /// whatever comes, and a central that sends bad frames at the line rate
    /// draws one and a half times as many bytes of ERROR. Queueing them all
    /// would delay every reply without end and, at the connection's bound,
    /// close the port under the central; a dropped ERROR is a notification
    /// lost, as BLE may lose one.
    private func reply(_ bytes: [UInt8]) {
        guard let connection else { return }
        guard connection.queuedBytes + bytes.count <= replyBacklog else {
            droppedReplies += 1
            if case .log(let heldBack) = droppedReplyLog.admit("", at: loop.now) {
                logger.warning("serial: a reply to the central dropped: a second of \(where_) is queued already\(LogLimiter.more(heldBack))")
            }
            return
        }
        connection.send(bytes)
    }

    /// A second of the line (10 bits a byte, 8N1): 960 bytes at 9600 baud.
    private var replyBacklog: Int { configuration.baud / 10 }

    private func endSession(reason: String?) {
        guard let session else { return }
        self.session = nil
        if let reason { logger.info("serial: central gone (\(reason))") }
        hub.close(session)
        publishState()
    }

    private func lost(reason: String?) {
        connection = nil
        setup = nil
        cancelHoldTimer()
        endSession(reason: "the device went away")
        guard !stopped else { return }
        logger.error("serial: \(where_) closed\(reason.map { ": \($0)" } ?? ""); trying again every \(Self.retryInterval)")
        onState("\(where_): device lost (retrying)")
        retryTimer = loop.schedule(after: Self.retryInterval) { [weak self] in
            guard let self, !self.stopped else { return }
            self.retryTimer = nil
            self.open()
        }
    }

    private func publishState() {
        let module: String
        switch (configuration.atSetup, moduleAnswered) {
        case (false, _): module = "AT set-up off"
        case (true, true?): module = "HM-10 set up"
        case (true, false?): module = "HM-10 did not answer AT"
        case (true, nil): module = "HM-10 set-up skipped"
        }
        onState("\(where_), \(module), \(session == nil ? "no central" : "central connected")")
    }
}
