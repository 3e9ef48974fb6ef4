import BLEControlProtocol
import Board
import Control
import Hardware
import Logging
import MQTT
import Reactor

/// The board as a client of an MQTT broker (docs/protocol.md, "MQTT"),
/// through ``MQTTClient`` on the event loop.
///
/// The broker connection is one central: while it is up, frames from
/// `PREFIX/BOARD/frames` and the per-output `…/set` topics drive the
/// outputs through one session, under the same failsafe rules as a BLE
/// central; losing the broker ends the session, as a BLE link loss does.
/// Nothing the broker kept is applied: subscriptions ask for no retained
/// messages (MQTT 5 "retain handling" 2), and a message flagged retained
/// is dropped all the same; the session is clean, so nothing queued while
/// the board was away is delivered either.
public final class MQTTTransport: @unchecked Sendable {
    // Loop-confined: used only on the event loop.
    private let loop: EventLoop
    private let hub: SessionHub
    private let configuration: MQTTConfiguration
    private let logger: Logger
    /// The topics of this board.
    public let topics: MQTTTopics
    private let version: String
    private var client: MQTTClient?
    private var retry: LoopToken?
    private var statusTimer: LoopToken?
    private var backoff = MQTTTransport.firstBackoff
    private var session: Session?
    private var running = false
    private var refusedReason: String?
    /// SUBSCRIBEs of this connection not acknowledged yet.
    private var pendingSubscriptions: Set<Int32> = []
    private var lastStatus: [UInt8]?
    private var lastStatusAt: ContinuousClock.Instant?
    /// What `…/failsafe` says now (published when it changes).
    private var lastFailsafe: String?
    /// Until when the status is looked at again (``statusMayHaveChanged()``).
    private var settleUntil: ContinuousClock.Instant?
    /// The board's channels (for `…/pulse/N/set`) and what discovery says of the hardware.
    private var channels: [ChannelConfiguration] = []
    private let hardware: MQTTDiscovery.Hardware
    /// How long after the last change the status is still watched: what a
    /// command sets off can take this long to show (an ESC's failsafe dwell,
    /// up to 10 s, ends in its outputs going off with no frame).
    private var settleWindow: Duration = .seconds(2)
    private var state = "" { didSet { if state != oldValue { onState(state) } } }
    /// Called with a one-line state for status whenever it changes.
    public var onState: (String) -> Void = { _ in }
    /// The board's status, published retained on `…/status` when it changes.
    public var statusProvider: (() -> StatusReport)?
    /// What Home Assistant discovery announces (nil: discovery off).
    private var discovery: MQTTDiscovery?
    /// Config topics of this board's node published now.
    private var announced: Set<String> = []
    static let firstBackoff: Duration = .seconds(1)
    static let maxBackoff: Duration = .seconds(30)
    /// The Maximum Packet Size the board announces in CONNECT: the broker
    /// drops a larger message for it (docs/protocol.md, "Limits"). Room for
    /// a few dozen frames, the longest topic and this node's discovery
    /// configs; a message of garbage costs the board at most this much
    /// decoding.
    public static let maximumPacketSize: UInt32 = 16 * 1024
    /// Bytes of a refused payload quoted back (escaped) in a reply or a log line.
    static let quotedPayload = 32

    /// - Parameter hardware: the model and serial Home Assistant's device
    ///   page shows.
    public init(loop: EventLoop, hub: SessionHub, configuration: MQTTConfiguration, board: BoardConfiguration, version: String,
                hardware: MQTTDiscovery.Hardware, logger: Logger) {
        self.loop = loop
        self.hub = hub
        self.configuration = configuration
        self.logger = logger
        self.version = version
        self.hardware = hardware
        topics = MQTTTopics(prefix: configuration.topicPrefix, board: MQTTConfiguration.topicName(board.name))
        adopt(board)
    }

    /// What the transport takes from the board file (at start and on reload).
    private func adopt(_ board: BoardConfiguration) {
        let channelList = board.servo?.channels ?? []
        channels = channelList
        let dwell = channelList.map(\.failsafeDwell).max() ?? .zero
        settleWindow = max(.seconds(2), dwell + .seconds(1))
        discovery = configuration.discovery
            ? MQTTDiscovery(configuration: board, topics: topics, prefix: configuration.discoveryPrefix, version: version,
                            hardware: hardware, configurationURL: configuration.configurationURL)
            : nil
    }

    private var endpointText: String { "\(configuration.host):\(configuration.port)" }

    /// Connects (on the loop). A missing library or password file is a
    /// state, said in status and the log; a broker that cannot be reached
    /// or refuses is tried again with a back-off of 1 s doubling to 30 s.
    public func start() {
        loop.assertInLoop()
        running = true
        var endpoint = MQTTEndpoint(host: configuration.host, port: configuration.port,
                                    clientID: configuration.clientID ?? "blecontrol-\(topics.board)")
        endpoint.keepalive = configuration.keepalive
        endpoint.username = configuration.username
        endpoint.caFile = configuration.caFile
        endpoint.certFile = configuration.certFile
        endpoint.keyFile = configuration.keyFile
        do {
            if let file = configuration.passwordFile { endpoint.password = try MQTTEndpoint.password(from: file) }
            let client = try MQTTClient(loop: loop, endpoint: endpoint, will: (topics.availability, Array("offline".utf8)),
                                        maximumPacketSize: Self.maximumPacketSize)
            client.onConnect = { [weak self] code in self?.connected(code: code) }
            client.onDisconnect = { [weak self] code in self?.disconnected(code: code) }
            client.onMessage = { [weak self] topic, payload, retained in self?.received(topic, payload, retained: retained) }
            client.onOversize = { [weak self] topic, size in self?.oversize(topic, size) }
            client.onSubscribed = { [weak self] mid in
                guard let self, self.pendingSubscriptions.remove(mid) != nil, self.pendingSubscriptions.isEmpty else { return }
                self.subscribed()
            }
            self.client = client
        } catch {
            state = error.description
            logger.error("MQTT: \(error)")
            return
        }
        connect()
    }

    /// Says offline and disconnects; the session ends.
    public func stop() {
        loop.assertInLoop()
        running = false
        if let retry { loop.cancel(retry) }
        retry = nil
        if let statusTimer { loop.cancel(statusTimer) }
        statusTimer = nil
        if let client, session != nil {
            // A clean disconnect does not send the will: say it ourselves.
            client.publish(topics.availability, Array("offline".utf8), qos: 1, retain: true)
            client.disconnect()
        }
        endSession(reason: nil)
        state = "stopped"
    }

    /// The board file was reloaded: Home Assistant's entities follow its
    /// channels, switches and display. In this order, so that no entity
    /// ever reads a status without its output: the configs of removed
    /// outputs are deleted, then the status of the new board is published,
    /// then the configs of the new board (a new entity reads the retained
    /// status the moment it subscribes).
    public func boardChanged(_ board: BoardConfiguration) {
        loop.assertInLoop()
        adopt(board)
        guard session != nil else { return }
        let current = Set(discovery?.entities.map(\.topic) ?? [])
        withdraw(keeping: current)
        publishStatus(force: true)
        announce()
    }

    // MARK: Connection

    private func connect() {
        guard running, let client else { return }
        state = "connecting to \(endpointText)"
        do {
            try client.connect()
        } catch {
            failed(error.description)
        }
    }

    private func failed(_ reason: String) {
        let wait = backoff
        state = "\(reason) (retrying in \(wait))"
        logger.warning("MQTT: \(reason); retrying in \(wait)")
        backoff = min(backoff * 2, Self.maxBackoff)
        if let retry { loop.cancel(retry) }
        retry = loop.schedule(after: wait) { [weak self] in
            guard let self else { return }
            self.retry = nil
            self.connect()
        }
    }

    private func connected(code: Int32) {
        guard let client else { return }
        guard code == 0 else {
            // The broker closes the connection; the disconnect callback
            // follows and retries.
            refusedReason = "\(endpointText) refused the connection: \(client.reason(code))"
            state = refusedReason ?? state
            logger.error("MQTT: \(state)")
            return
        }
        backoff = Self.firstBackoff
        refusedReason = nil
        // One session for the broker connection: the central is the broker.
        session = hub.open(transport: .mqtt, peer: endpointText) { [weak self] bytes in
            guard let self else { return }
            self.client?.publish(self.topics.errors, bytes)
        }
        pendingSubscriptions = []
        do {
            for filter in [topics.frames, topics.setFilter] {
                // QoS 0: a servo command is worth only its newest value, and a
                // redelivered old one (QoS 1 after a reconnect) would move an
                // output backwards; TCP keeps one publisher's messages in order.
                pendingSubscriptions.insert(try client.subscribe(filter, options: MQTTClient.noRetainedNoLocal))
            }
            if let discovery {
                // Retained ones wanted here: this node's configs from an
                // earlier run, so the entities of removed outputs can go.
                pendingSubscriptions.insert(try client.subscribe(MQTTDiscovery.filter(prefix: configuration.discoveryPrefix, node: discovery.node)))
            }
        } catch {
            logger.error("MQTT: \(error)")
        }
        state = "subscribing at \(endpointText)"
        if pendingSubscriptions.isEmpty { subscribed() }
    }

    /// Every subscription acknowledged (SUBACK): only now can a command
    /// published by someone else reach the board, so only now does it say
    /// `online`, and status says connected.
    private func subscribed() {
        guard let client, session != nil else { return }
        client.publish(topics.availability, Array("online".utf8), qos: 1, retain: true)
        // The status before the configs: an entity reads it as it subscribes.
        lastStatus = nil
        publishStatus(force: true)
        announce()
        statusMayHaveChanged()
        state = "connected to \(endpointText) as \(topics.base)"
        logger.info("MQTT: \(state)")
    }

    private func disconnected(code: Int32) {
        let hadSession = session != nil
        let why = client?.describe(code) ?? "code \(code)"
        endSession(reason: code == 0 ? nil : why)
        guard running else { return }
        failed(refusedReason ?? (hadSession ? "lost the broker \(endpointText): \(why)" : "cannot reach \(endpointText): \(why)"))
    }

    private func endSession(reason: String?) {
        guard let session else { return }
        self.session = nil
        if let reason { logger.notice("MQTT: broker \(endpointText) gone: \(reason)") }
        hub.close(session)
    }

    // MARK: Messages

    private func received(_ topic: String, _ payload: [UInt8], retained: Bool) {
        guard let session else { return }
        if let discovery, topic.hasPrefix(configuration.discoveryPrefix + "/") {
            // One of this node's configs: an output that is gone is deleted.
            if !payload.isEmpty, !announced.contains(topic), topic.contains("/\(discovery.node)/") {
                logger.info("MQTT: deleting Home Assistant's \(topic): no such output now")
                client?.publish(topic, [], qos: 1, retain: true)
            }
            return
        }
        // The broker flags what it kept; a command it kept must never move
        // an output (a retained …/set at boot would start a motor).
        if retained {
            return
        }
        switch topics.command(topic: topic, payload: payload) {
        case .frames(let bytes):
            hub.receive(bytes, for: session)
            // A message is whole frames: a frame cut at its end is not
            // continued by the next message (which may be another client's).
            hub.endOfMessage(session)
        case .message(let message):
            hub.receive(FrameEncoder.encode(message), for: session)
        case .pulse(let channel, let microseconds):
            // µs (Home Assistant's number) to the SERVO_VAL that gives it on
            // this channel, calibration and inversion undone.
            switch PulseRequest.servoValue(microseconds, channel: Int(channel), of: channels, clamp: true) {
            case .success(let value):
                hub.receive(FrameEncoder.encode(.servo(channel: channel, value: value)), for: session)
            case .failure(let refusal):
                let hint = refusal == .pwmChannel(Int(channel)) ? " (…/pwm/\(channel)/set)" : ""
                refuse("\(topic): \(refusal)\(hint)", session: session)
            }
        case .invalid(let why):
            refuse("\(topic): \(why)", session: session)
        case .ignored:
            break
        }
    }

    /// A message the broker should not have sent (it ignored the Maximum
    /// Packet Size): dropped unread, counted, answered once.
    private func oversize(_ topic: String, _ size: Int) {
        guard let session else { return }
        refuse("\(topic): a message of \(size) bytes, more than \(Self.maximumPacketSize): dropped", session: session)
    }

    /// A message refused before it reached the session: counted as the
    /// session's error, logged (rate-limited by the log), and answered on
    /// `…/errors` within the session's reply budget. `why` quotes at most
    /// ``quotedPayload`` bytes of the payload; the log escapes it, and so
    /// does the reply (the topic is bounded by the packet size).
    private func refuse(_ why: String, session: Session) {
        logger.warning("MQTT: \(why)")
        guard session.refused(at: loop.now) else { return }
        client?.publish(topics.errors, Array(why.escaped(maximumLength: 512).utf8))
    }

    /// Publishes every entity's config and deletes (an empty retained
    /// message) each config of this node that is no longer one.
    private func announce() {
        guard let discovery, let client else { return }
        withdraw(keeping: Set(discovery.entities.map(\.topic)))
        for entity in discovery.entities {
            client.publish(entity.topic, entity.payload, qos: 1, retain: true)
        }
        announced = Set(discovery.entities.map(\.topic))
    }

    /// Deletes the configs announced that are not in `current`.
    private func withdraw(keeping current: Set<String>) {
        guard let client else { return }
        for topic in announced.subtracting(current).sorted() {
            client.publish(topic, [], qos: 1, retain: true)
        }
        announced.formIntersection(current)
    }

    /// Something a user sees may have changed (a frame applied, a central
    /// came or went, the failsafe, the display's own message, a reload):
    /// the status is looked at every quarter second, and published when
    /// what it shows changed, until it has been still for the settle
    /// window. An idle board arms no timer: it publishes nothing, and wakes
    /// for nothing (the broker's keepalive aside).
    public func statusMayHaveChanged() {
        loop.assertInLoop()
        guard running else { return }
        settleUntil = loop.now + settleWindow
        armStatus()
    }

    private func armStatus() {
        guard statusTimer == nil, session != nil else { return }
        var at = loop.now + .milliseconds(250)
        if let last = lastStatusAt { at = max(at, last + configuration.statusInterval) }
        statusTimer = loop.schedule(at: at) { [weak self] in
            guard let self, self.running else { return }
            self.statusTimer = nil
            self.publishStatus(force: false)
            if let until = self.settleUntil, self.loop.now < until { self.armStatus() } else { self.settleUntil = nil }
        }
    }

    /// The status as `blecontrol status --json` shows it, retained, when
    /// what a user sees in it changed, at most every `status_interval_ms`.
    public func publishStatus(force: Bool) {
        guard session != nil, let client, let status = statusProvider?() else { return }
        let now = loop.now
        if !force, let at = lastStatusAt, now - at < configuration.statusInterval { return }
        guard let key = try? JSONEncoderLite().encode(Self.visible(status)) else { return }
        if !force, key == lastStatus { return }
        lastStatus = key
        lastStatusAt = now
        // A change seen: keep watching what may follow from it.
        settleUntil = now + settleWindow
        guard let bytes = try? JSONEncoderLite().encode(status) else { return }
        client.publish(topics.status, bytes, retain: true)
        let failsafe = status.servo?.failsafe == nil ? "OFF" : "ON"
        if force || failsafe != lastFailsafe {
            client.publish(topics.failsafe, Array(failsafe.utf8), retain: true)
            lastFailsafe = failsafe
        }
    }

    /// What a user sees in a status: the outputs, the display, the failsafe,
    /// who is connected, the transports. Not the clock, the counters, the
    /// servo path's figures or the LED (its heartbeat blinks every second:
    /// publishing each blink was 0.6 messages a second, forever).
    static func visible(_ status: StatusReport) -> StatusReport {
        var shown = status
        shown.uptimeSeconds = 0
        shown.led = nil
        shown.counters = StatusReport.Counters(frames: 0, errors: 0, discardedPartials: 0, sessionsTotal: 0)
        for index in shown.sessions.indices {
            shown.sessions[index].connectedSeconds = 0
            shown.sessions[index].bytes = 0
            shown.sessions[index].frames = 0
            shown.sessions[index].errors = 0
            shown.sessions[index].repliesDropped = nil
        }
        if var servo = shown.servo {
            servo.updates = 0
            servo.coalesced = 0
            servo.flushes = 0
            servo.busWrites = 0
            servo.failedFlushes = 0
            servo.latencyP50Us = nil
            servo.latencyP99Us = nil
            servo.latencyMaxUs = nil
            servo.deadlineMisses = 0
            servo.failsafeSeconds = nil
            servo.maxLcdChunksWaited = 0
            servo.maxBusWaitUs = 0
            shown.servo = servo
        }
        if var lcd = shown.lcd {
            lcd.busWrites = 0
            shown.lcd = lcd
        }
        return shown
    }
}

/// A board's topics, and what a message on one of them asks for.
public struct MQTTTopics: Sendable, Equatable {
    /// The board's level (its name, made topic-safe).
    public let board: String
    /// `PREFIX/BOARD`.
    public let base: String

    public init(prefix: String, board: String) {
        self.board = board
        base = "\(prefix)/\(board)"
    }

    /// Raw BLEControl frames, exactly as a BLE central writes them to FFE1.
    public var frames: String { "\(base)/frames" }
    /// ERROR replies (frames) and the reasons a message was refused (text).
    public var errors: String { "\(base)/errors" }
    /// `online` / `offline` (the will), retained.
    public var availability: String { "\(base)/availability" }
    /// `blecontrol status --json`, retained.
    public var status: String { "\(base)/status" }
    /// `ON` while the failsafe holds, retained.
    public var failsafe: String { "\(base)/failsafe" }
    /// The per-output command topics: `…/servo/N/set` and the like.
    public var setFilter: String { "\(base)/+/+/set" }

    public enum Command: Equatable {
        case frames([UInt8])
        case message(Message)
        /// `…/pulse/N/set`: a servo or ESC channel's pulse in µs.
        case pulse(channel: UInt8, microseconds: Double)
        case invalid(String)
        /// Not a command topic (our own publications).
        case ignored
    }

    /// What a message on `topic` with `payload` asks for.
    public func command(topic: String, payload: [UInt8]) -> Command {
        if topic == frames { return .frames(payload) }
        guard topic.hasPrefix(base + "/") else { return .ignored }
        let levels = topic.dropFirst(base.count + 1).split(separator: "/", omittingEmptySubsequences: false)
        guard levels.count == 3, levels[2] == "set" else { return .ignored }
        guard let index = UInt8(levels[1]) else { return .invalid("\(levels[1].prefix(16)) is not a channel number (0…255)") }
        let text = String(decoding: payload, as: UTF8.self).trimmed
        // What is quoted back: a short prefix, never the payload (escaped
        // where it is written: the log, the reply on …/errors).
        let quoted = "\"" + String(decoding: payload.prefix(MQTTTransport.quotedPayload), as: UTF8.self) + (payload.count > MQTTTransport.quotedPayload ? "…" : "") + "\""
        switch levels[0] {
        case "pulse":
            guard let microseconds = Double(text), microseconds.isFinite, (0...20_000).contains(microseconds) else {
                return .invalid("\(quoted) is not a pulse in µs (such as 1500)")
            }
            return .pulse(channel: index, microseconds: microseconds)
        case "servo", "pwm":
            guard let value = UInt16(text), value <= 1000 else { return .invalid("\(quoted) is not a value 0…1000") }
            return .message(levels[0] == "servo" ? .servo(channel: index, value: value) : .pwm(channel: index, value: value))
        case "switch", "enable":
            let on: Bool
            switch text.uppercased() {
            case "ON", "1", "TRUE": on = true
            case "OFF", "0", "FALSE": on = false
            default: return .invalid("\(quoted) is not ON or OFF")
            }
            return .message(levels[0] == "switch" ? .switchValue(index: index, on: on) : .enable(channel: index, on: on))
        case "lcd":
            guard payload.count <= Message.maximumTextLength else { return .invalid("text longer than \(Message.maximumTextLength) bytes") }
            return .message(.lcdText(line: index, text: payload.filter { $0 != 0 }))
        default:
            return .invalid("\(levels[0].prefix(16)) is not an output kind (servo, pulse, pwm, switch, enable, lcd)")
        }
    }
}
