import BLEControlProtocol
import Board
import Control
import Firmware
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
    /// Each channel's transition for the `…/set` commands that give none
    /// (`…/transition/N/set`); kept while the daemon runs, across reloads.
    private var transitions: [UInt8: Duration] = [:]
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
        publishTransitions()
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
            for filter in [topics.frames, topics.setFilter, topics.move] {
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
        publishTransitions()
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
        case .message(let message, let over):
            let channel: UInt8? = switch message {
            case .servo(let channel, _), .pwm(let channel, _): channel
            default: nil
            }
            apply(FrameEncoder.encode(message), over: over ?? channel.flatMap { transitions[$0] }, session: session)
        case .pulse(let channel, let microseconds, let over):
            switch servoFrame(channel: channel, microseconds: microseconds) {
            case .success(let frame): apply(frame, over: over ?? transitions[channel], session: session)
            case .failure(let why): refuse("\(topic): \(why)", session: session)
            }
        case .move(let pulses, let messages, let over):
            // All or nothing: a pulse for a channel that takes none (a PWM
            // channel, one not on the board) refuses the whole move, before
            // any output moves; one outside a servo's calibration is
            // clamped to it, as on …/pulse/N/set.
            var bytes: [UInt8] = []
            for target in pulses {
                switch servoFrame(channel: target.channel, microseconds: target.microseconds) {
                case .success(let frame): bytes += frame
                case .failure(let why): return refuse("\(topic): \(why); nothing moved", session: session)
                }
            }
            for message in messages { bytes += FrameEncoder.encode(message) }
            apply(bytes, over: over, session: session)
        case .transition(let channel, let duration):
            guard channels.contains(where: { $0.channel == Int(channel) && $0.role != .pwm }) else {
                return refuse("\(topic): channel \(channel) is not a servo or ESC channel of this board", session: session)
            }
            transitions[channel] = duration == .zero ? nil : duration
            publishTransition(channel)
        case .invalid(let why):
            refuse("\(topic): \(why)", session: session)
        case .ignored:
            break
        }
    }

    /// Frames from the broker's session, their values moving in `over`
    /// (together) when given.
    private func apply(_ bytes: [UInt8], over: Duration?, session: Session) {
        session.moveDuration = over
        hub.receive(bytes, for: session)
        session.moveDuration = nil
    }

    /// µs (Home Assistant's number) to the SERVO_VAL frame that gives it on
    /// `channel`, calibration and inversion undone (clamped to it).
    private func servoFrame(channel: UInt8, microseconds: Double) -> Result<[UInt8], PulseRefusal> {
        switch PulseRequest.servoValue(microseconds, channel: Int(channel), of: channels, clamp: true) {
        case .success(let value):
            return .success(FrameEncoder.encode(.servo(channel: channel, value: value)))
        case .failure(let refusal):
            return .failure(PulseRefusal(description: "\(refusal)" + (refusal == .pwmChannel(Int(channel)) ? " (…/pwm/\(channel)/set)" : "")))
        }
    }

    struct PulseRefusal: Error, CustomStringConvertible {
        var description: String
    }

    /// `…/transition/N`, retained: the channel's transition in seconds
    /// (0: none), for Home Assistant's number.
    private func publishTransition(_ channel: UInt8) {
        let seconds = transitions[channel]?.inSeconds ?? 0
        client?.publish(topics.transition(Int(channel)), Array(seconds.fixed(1).utf8), retain: true)
    }

    /// Every servo and ESC channel's transition (at connect and after a
    /// reload, which may add channels).
    private func publishTransitions() {
        for channel in channels where channel.role != .pwm { publishTransition(UInt8(channel.channel)) }
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
            servo.motionPeriods = nil
            servo.motionPeriodsMissed = nil
            servo.motionLatenessP50Us = nil
            servo.motionLatenessP99Us = nil
            servo.motionLatenessMaxUs = nil
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
    /// Several outputs in one command (JSON), moved together.
    public var move: String { "\(base)/move/set" }
    /// A channel's transition for the `…/set` commands, retained (seconds).
    public func transition(_ channel: Int) -> String { "\(base)/transition/\(channel)" }

    /// The longest transition a command may ask for, in seconds (as the
    /// control socket's over_ms).
    public static let maximumTransition = 600.0

    /// A pulse a move asks of a channel.
    public struct PulseTarget: Equatable, Sendable {
        public var channel: UInt8
        public var microseconds: Double
    }

    public enum Command: Equatable {
        case frames([UInt8])
        /// `over`: the payload's `transition` (nil: none given).
        case message(Message, over: Duration? = nil)
        /// `…/pulse/N/set`: a servo or ESC channel's pulse in µs.
        case pulse(channel: UInt8, microseconds: Double, over: Duration? = nil)
        /// `…/move/set`: several outputs at once, finishing together when
        /// a transition is given (pulses in µs by channel, then the values).
        case move(pulses: [PulseTarget], messages: [Message], over: Duration?)
        /// `…/transition/N/set`: the channel's transition for the `…/set`
        /// commands that give none (zero: none).
        case transition(channel: UInt8, Duration)
        case invalid(String)
        /// Not a command topic (our own publications).
        case ignored
    }

    /// What a message on `topic` with `payload` asks for.
    public func command(topic: String, payload: [UInt8]) -> Command {
        if topic == frames { return .frames(payload) }
        if topic == move { return Self.move(payload) }
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
            guard case .success(let (number, over)) = Self.value(text) else {
                return .invalid("\(quoted) is not a pulse in µs (such as 1500, or {\"value\": 1500, \"transition\": 1.5})")
            }
            guard number.isFinite, (0...20_000).contains(number) else { return .invalid("\(quoted) is not a pulse in µs (such as 1500)") }
            return .pulse(channel: index, microseconds: number, over: over)
        case "servo", "pwm":
            guard case .success(let (number, over)) = Self.value(text) else {
                return .invalid("\(quoted) is not a value 0…1000 (or {\"value\": 500, \"transition\": 1.5})")
            }
            guard number == number.rounded(), (0...1000).contains(number) else { return .invalid("\(quoted) is not a value 0…1000") }
            let value = UInt16(number)
            return .message(levels[0] == "servo" ? .servo(channel: index, value: value) : .pwm(channel: index, value: value), over: over)
        case "transition":
            guard let duration = Self.transition(seconds: text) else {
                return .invalid("\(quoted) is not a transition in seconds (0…\(Int(Self.maximumTransition)))")
            }
            return .transition(channel: index, duration)
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
            return .invalid("\(levels[0].prefix(16)) is not an output kind (servo, pulse, pwm, switch, enable, lcd, transition)")
        }
    }

    /// Seconds (0…``maximumTransition``, to the millisecond) as a move's
    /// time; nil for anything else.
    static func transition(seconds text: String) -> Duration? {
        guard let seconds = Double(text), seconds.isFinite, (0...maximumTransition).contains(seconds) else { return nil }
        return .milliseconds(Int64((seconds * 1000).rounded()))
    }

    /// A payload's `transition` → the move's time (nil for none: zero, or
    /// absent), or why not.
    static func transition(_ value: JSONValue?) -> Result<Duration?, Invalid> {
        guard let value else { return .success(nil) }
        guard case .number(let text) = value, let duration = transition(seconds: text) else {
            return .failure(Invalid(why: "transition must be seconds, 0…\(Int(maximumTransition))"))
        }
        return .success(duration == .zero ? nil : duration)
    }

    /// A `…/set` payload's number: plain (`1500`), or an object with a
    /// transition (`{"value": 1500, "transition": 1.5}`, seconds: Home
    /// Assistant's light transitions use the same word and unit).
    static func value(_ text: String) -> Result<(Double, Duration?), Invalid> {
        if let number = Double(text) { return .success((number, nil)) }
        guard text.hasPrefix("{"), let object = try? JSONValue.parse(Array(text.utf8)),
              case .number(let numberText)? = object["value"], let number = Double(numberText),
              case .success(let over) = transition(object["transition"]) else { return .failure(Invalid()) }
        return .success((number, over))
    }

    struct Invalid: Error {
        var why = ""
    }

    /// `…/move/set`: `{"pulse": {"0": 1500, "1": 1200}, "servo": {"2": 500},
    /// "pwm": {"4": 250}, "transition": 1.5}`: every output named moves,
    /// and with a transition they all arrive together.
    static func move(_ payload: [UInt8]) -> Command {
        guard let object = try? JSONValue.parse(payload), case .object(let members) = object else {
            return .invalid("a move is a JSON object: {\"pulse\": {\"0\": 1500}, \"servo\": {…}, \"pwm\": {…}, \"transition\": 1.5}")
        }
        var pulses: [PulseTarget] = []
        var messages: [Message] = []
        var over: Duration?
        for (key, value) in members {
            if key == "transition" {
                switch transition(value) {
                case .success(let duration): over = duration
                case .failure(let invalid): return .invalid(invalid.why)
                }
                continue
            }
            guard ["pulse", "servo", "pwm"].contains(key), case .object(let entries) = value else {
                return .invalid("\(key.prefix(16)) is not part of a move (pulse, servo, pwm, transition)")
            }
            for (name, entry) in entries {
                guard let channel = UInt8(name) else { return .invalid("\(name.prefix(16)) is not a channel number (0…255)") }
                guard case .number(let text) = entry, let number = Double(text), number.isFinite else {
                    return .invalid("\(key) \(channel): not a number")
                }
                if key == "pulse" {
                    guard (0...20_000).contains(number) else { return .invalid("pulse \(channel): \(text) is not a pulse in µs") }
                    pulses.append(PulseTarget(channel: channel, microseconds: number))
                } else {
                    guard number == number.rounded(), (0...1000).contains(number) else { return .invalid("\(key) \(channel): \(text) is not a value 0…1000") }
                    messages.append(key == "servo" ? .servo(channel: channel, value: UInt16(number)) : .pwm(channel: channel, value: UInt16(number)))
                }
            }
        }
        guard !pulses.isEmpty || !messages.isEmpty else { return .invalid("a move names no output") }
        return .move(pulses: pulses, messages: messages, over: over)
    }
}
