import BLEControlProtocol
import Board
import CMosquitto
import Control
import Glibc
import Logging
import Reactor

/// The board as a client of an MQTT broker (docs/protocol.md, "MQTT"),
/// through libmosquitto on the event loop: no thread of libmosquitto's own
/// (its socket is watched by the loop; `mosquitto_loop_read`,
/// `_loop_write` and `_loop_misc` run there).
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
    private var api: UnsafePointer<bc_mosquitto_api>?
    private var client: OpaquePointer?
    private var socket: (fd: Int32, token: LoopToken)?
    private var tick: LoopToken?
    private var retry: LoopToken?
    private var backoff = MQTTTransport.firstBackoff
    private var session: Session?
    private var running = false
    private var lastStatus: [UInt8]?
    private var lastStatusAt: ContinuousClock.Instant?
    private var state = "" { didSet { if state != oldValue { onState(state) } } }
    /// Called with a one-line state for status whenever it changes.
    public var onState: (String) -> Void = { _ in }
    /// The board's status, published retained on `…/status` when it changes.
    public var statusProvider: (() -> StatusReport)?
    /// What Home Assistant discovery announces (nil: discovery off).
    private var discovery: MQTTDiscovery?
    /// Config topics of this board's node seen on the broker (its own from
    /// an earlier run, retained) or published now.
    private var announced: Set<String> = []
    /// Counters for status and tests.
    public private(set) var statistics = Statistics()

    public struct Statistics: Sendable, Equatable {
        public var connects = 0
        public var losses = 0
        /// Messages dropped because the broker flagged them retained.
        public var retainedIgnored = 0
        /// Messages on a topic or with a payload the board does not take.
        public var rejected = 0
    }

    static let firstBackoff: Duration = .seconds(1)
    static let maxBackoff: Duration = .seconds(30)
    /// Messages read per wakeup: an MQTT flood yields the loop to the BLE
    /// and TCP centrals between batches (the loop is level-triggered).
    static let readBatch = 32

    public init(loop: EventLoop, hub: SessionHub, configuration: MQTTConfiguration, board: BoardConfiguration, version: String, logger: Logger) {
        self.loop = loop
        self.hub = hub
        self.configuration = configuration
        self.logger = logger
        self.version = version
        topics = MQTTTopics(prefix: configuration.topicPrefix, board: MQTTConfiguration.topicName(board.name))
        if configuration.discovery {
            discovery = MQTTDiscovery(configuration: board, topics: topics, prefix: configuration.discoveryPrefix, version: version)
        }
    }

    private let version: String

    /// The board file was reloaded: Home Assistant's entities follow its
    /// channels, switches and display (removed ones are deleted).
    public func boardChanged(_ board: BoardConfiguration) {
        loop.assertInLoop()
        guard configuration.discovery else { return }
        discovery = MQTTDiscovery(configuration: board, topics: topics, prefix: configuration.discoveryPrefix, version: version)
        if session != nil { announce() }
    }

    /// Publishes every entity's config and deletes (an empty retained
    /// message) each config of this node that is no longer one.
    private func announce() {
        guard let discovery else { return }
        let current = Set(discovery.entities.map(\.topic))
        for topic in announced.subtracting(current).sorted() {
            publish(topic, [], qos: 1, retain: true)
        }
        for entity in discovery.entities {
            publish(entity.topic, entity.payload, qos: 1, retain: true)
        }
        announced = current
    }

    deinit {
        if let client, let api { api.pointee.destroy(client) }
    }

    /// Connects (on the loop). A missing library, a broker that cannot be
    /// reached or refuses are states, reported and (but for the library)
    /// tried again with a back-off of 1 s doubling to 30 s.
    public func start() {
        loop.assertInLoop()
        running = true
        var error = [CChar](repeating: 0, count: 256)
        guard let api = bc_mosquitto_load(&error, error.count) else {
            state = String(decoding: error.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            logger.error("MQTT: \(state)")
            return
        }
        self.api = api
        do {
            try makeClient(api)
        } catch {
            state = "\(error)"
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
        if let tick { loop.cancel(tick) }
        tick = nil
        if let api, let client, session != nil {
            // A clean disconnect does not send the will: say it ourselves.
            publish(topics.availability, Array("offline".utf8), qos: 1, retain: true)
            _ = api.pointee.loop_write(client, 1)
            _ = api.pointee.disconnect(client)
            _ = api.pointee.loop_write(client, 1)
        }
        endSession(reason: nil)
        unwatch()
        state = "stopped"
    }

    private var endpoint: String { "\(configuration.host):\(configuration.port)" }

    private func makeClient(_ api: UnsafePointer<bc_mosquitto_api>) throws {
        let clientID = configuration.clientID ?? "blecontrol-\(topics.board)"
        guard let client = api.pointee.new_(clientID, true, Unmanaged.passUnretained(self).toOpaque()) else {
            throw MQTTError("mosquitto_new failed (out of memory)")
        }
        self.client = client
        _ = api.pointee.int_option(client, Int32(BC_MOSQ_OPT_PROTOCOL_VERSION), Int32(BC_MQTT_PROTOCOL_V5))
        // Small frames, one at a time: no Nagle delay on the errors topic.
        _ = api.pointee.int_option(client, Int32(BC_MOSQ_OPT_TCP_NODELAY), 1)
        let offline = Array("offline".utf8)
        try check(api.pointee.will_set(client, topics.availability, Int32(offline.count), offline, 1, true), "the will")
        if let username = configuration.username {
            var password: String?
            if let file = configuration.passwordFile {
                guard let text = try? Files.read(file) else {
                    throw MQTTError("cannot read the password file \(file) (it must be readable by the service user)")
                }
                password = String(decoding: text, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).first.map(String.init) ?? ""
            }
            try check(api.pointee.username_pw_set(client, username, password), "the user name")
        }
        if let ca = configuration.caFile {
            try check(api.pointee.tls_set(client, ca, nil, configuration.certFile, configuration.keyFile, nil), "TLS (\(ca))")
        }
        api.pointee.connect_callback_set(client) { _, object, code in
            guard let object else { return }
            Unmanaged<MQTTTransport>.fromOpaque(object).takeUnretainedValue().connected(code: code)
        }
        api.pointee.disconnect_callback_set(client) { _, object, code in
            guard let object else { return }
            Unmanaged<MQTTTransport>.fromOpaque(object).takeUnretainedValue().disconnected(code: code)
        }
        api.pointee.message_callback_set(client) { _, object, message in
            guard let object, let message else { return }
            Unmanaged<MQTTTransport>.fromOpaque(object).takeUnretainedValue().received(message.pointee)
        }
    }

    private func check(_ code: Int32, _ what: String) throws {
        guard code == 0 else { throw MQTTError("\(what): \(describe(code))") }
    }

    private func describe(_ code: Int32) -> String {
        guard let api, let text = api.pointee.strerror(code) else { return "error \(code)" }
        if code == Int32(BC_MOSQ_ERR_ERRNO) { return String(cString: strerror(errno)) }
        return String(cString: text)
    }

    // MARK: Connection

    private func connect() {
        guard running, let api, let client else { return }
        state = "connecting to \(endpoint)"
        // The host name is resolved here, blocking the loop for as long as
        // the resolver takes (libmosquitto has no asynchronous lookup); an
        // address or /etc/hosts name costs nothing.
        let code = connectCalled
            ? api.pointee.reconnect_async(client)
            : api.pointee.connect_async(client, configuration.host, Int32(configuration.port), Int32(configuration.keepalive))
        connectCalled = true
        guard code == 0 else {
            failed("cannot connect to \(endpoint): \(describe(code))")
            return
        }
        watch()
        if tick == nil { scheduleTick() }
    }

    /// connect_async sets the host, port and keepalive; later attempts reconnect.
    private var connectCalled = false

    private func failed(_ reason: String) {
        unwatch()
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

    /// Watches libmosquitto's socket: readable always, writable while it
    /// has output queued (or a connection in progress).
    private func watch() {
        guard let api, let client else { return }
        let fd = api.pointee.socket(client)
        if let socket, socket.fd != fd { unwatch() }
        guard fd >= 0 else { return }
        let interest: EventLoop.Interest = api.pointee.want_write(client) ? [.readable, .writable] : [.readable]
        if let socket {
            loop.setInterest(socket.token, interest)
            return
        }
        do {
            let token = try loop.register(fd, interest: interest) { [weak self] readiness in self?.ready(readiness) }
            socket = (fd, token)
        } catch {
            logger.error("MQTT: cannot watch the socket: \(error)")
        }
    }

    private func unwatch() {
        if let socket { loop.unregister(socket.token) }
        socket = nil
    }

    private func ready(_ readiness: EventLoop.Readiness) {
        guard let api, let client else { return }
        if readiness.contains(.writable) {
            _ = api.pointee.loop_write(client, 1)
        }
        if readiness.contains(.readable) || readiness.contains(.closed) {
            drain(api, client, limit: Self.readBatch)
        }
        watch()
    }

    /// Reads up to `limit` packets: libmosquitto reads one per call when it
    /// has nothing queued. Without TLS the kernel says what is left; with
    /// TLS, OpenSSL may hold whole records the socket no longer signals, so
    /// the batch is read out (a call with nothing there returns at once).
    private func drain(_ api: UnsafePointer<bc_mosquitto_api>, _ client: OpaquePointer, limit: Int) {
        for _ in 0..<limit {
            let fd = api.pointee.socket(client)
            guard fd >= 0 else { return }
            if api.pointee.loop_read(client, 1) != 0 { return }
            if !configuration.tls {
                var pending: Int32 = 0
                if ioctl(fd, UInt(FIONREAD), &pending) != 0 || pending == 0 { return }
            }
        }
    }

    /// Keepalive pings and their timeout (libmosquitto's loop_misc), the
    /// retained status, and TLS records left in OpenSSL's buffer.
    private func scheduleTick() {
        tick = loop.schedule(after: .milliseconds(250)) { [weak self] in
            guard let self, self.running else { return }
            self.tick = nil
            if let api = self.api, let client = self.client, self.socket != nil {
                _ = api.pointee.loop_misc(client)
                if self.configuration.tls, self.session != nil { self.drain(api, client, limit: Self.readBatch) }
                self.publishStatus(force: false)
                self.watch()
            }
            self.scheduleTick()
        }
    }

    private func connected(code: Int32) {
        guard code == 0 else {
            let reason = api.flatMap { $0.pointee.reason_string(code) }.map { String(cString: $0) } ?? "code \(code)"
            // The broker closes the connection; the disconnect callback
            // follows and retries.
            state = "\(endpoint) refused the connection: \(reason)"
            logger.error("MQTT: \(state)")
            refusedReason = state
            return
        }
        statistics.connects += 1
        backoff = Self.firstBackoff
        refusedReason = nil
        // One session for the broker connection: the central is the broker.
        session = hub.open(transport: .mqtt, peer: endpoint) { [weak self] bytes in
            guard let self else { return }
            self.publish(self.topics.errors, bytes, qos: 0, retain: false)
        }
        let options = Int32(BC_MQTT_SUB_OPT_SEND_RETAIN_NEVER | BC_MQTT_SUB_OPT_NO_LOCAL)
        for filter in [topics.frames, topics.setFilter] {
            // QoS 0: a servo command is worth only its newest value, and a
            // redelivered old one (QoS 1 after a reconnect) would move an
            // output backwards; TCP keeps one publisher's messages in order.
            let code = api!.pointee.subscribe_v5(client, nil, filter, 0, options, nil)
            if code != 0 { logger.error("MQTT: subscribing to \(filter): \(describe(code))") }
        }
        if let discovery {
            // Retained ones wanted here: this node's configs from an earlier
            // run, so the entities of removed outputs can be deleted.
            let filter = MQTTDiscovery.filter(prefix: configuration.discoveryPrefix, node: discovery.node)
            let code = api!.pointee.subscribe_v5(client, nil, filter, 0, 0, nil)
            if code != 0 { logger.error("MQTT: subscribing to \(filter): \(describe(code))") }
            announce()
        }
        publish(topics.availability, Array("online".utf8), qos: 1, retain: true)
        lastStatus = nil
        publishStatus(force: true)
        state = "connected to \(endpoint) as \(topics.base)"
        logger.info("MQTT: \(state)")
        watch()
    }

    private var refusedReason: String?

    private func disconnected(code: Int32) {
        let hadSession = session != nil
        endSession(reason: code == 0 ? nil : describe(code))
        unwatch()
        guard running else { return }
        if hadSession { statistics.losses += 1 }
        failed(refusedReason ?? (hadSession ? "lost the broker \(endpoint): \(describe(code))" : "cannot reach \(endpoint): \(describe(code))"))
    }

    private func endSession(reason: String?) {
        guard let session else { return }
        self.session = nil
        if let reason { logger.notice("MQTT: broker \(endpoint) gone: \(reason)") }
        hub.close(session)
    }

    // MARK: Messages

    private func received(_ message: mosquitto_message) {
        guard let session, let topicPointer = message.topic else { return }
        let topic = String(cString: topicPointer)
        if let discovery, topic.hasPrefix(configuration.discoveryPrefix + "/") {
            // One of this node's configs: an output that is gone is deleted.
            if message.payloadlen > 0, !announced.contains(topic), topic.contains("/\(discovery.node)/") {
                logger.info("MQTT: deleting Home Assistant's \(topic): no such output now")
                publish(topic, [], qos: 1, retain: true)
            }
            return
        }
        // The broker flags what it kept; a command it kept must never move
        // an output (a retained …/set at boot would start a motor).
        if message.retain {
            statistics.retainedIgnored += 1
            return
        }
        let payload = message.payload.map {
            Array(UnsafeRawBufferPointer(start: $0, count: Int(max(message.payloadlen, 0))))
        } ?? []
        switch topics.command(topic: topic, payload: payload) {
        case .frames(let bytes):
            hub.receive(bytes, for: session)
            // A message is whole frames: a frame cut at its end is not
            // continued by the next message (which may be another client's).
            hub.endOfMessage(session)
        case .message(let message):
            hub.receive(FrameEncoder.encode(message), for: session)
        case .invalid(let why):
            statistics.rejected += 1
            logger.warning("MQTT: \(topic): \(why)")
            publish(topics.errors, Array("\(topic): \(why)".utf8), qos: 0, retain: false)
        case .ignored:
            break
        }
    }

    private func publish(_ topic: String, _ payload: [UInt8], qos: Int32, retain: Bool) {
        guard let api, let client else { return }
        let code = payload.withUnsafeBytes { api.pointee.publish(client, nil, topic, Int32($0.count), $0.baseAddress, qos, retain) }
        if code != 0, code != Int32(BC_MOSQ_ERR_NO_CONN) {
            logger.warning("MQTT: publishing on \(topic): \(describe(code))")
        }
    }

    /// The status as `blecontrol status --json` shows it, retained, when it
    /// changed (the uptime aside) and at most every `status_interval_ms`.
    public func publishStatus(force: Bool) {
        guard session != nil, let status = statusProvider?() else { return }
        let now = loop.now
        if !force, let at = lastStatusAt, now - at < configuration.statusInterval { return }
        // What only the clock changes does not count as a change.
        var comparable = status
        comparable.uptimeSeconds = 0
        for index in comparable.sessions.indices { comparable.sessions[index].connectedSeconds = 0 }
        guard let key = try? JSONEncoderLite().encode(comparable) else { return }
        if !force, key == lastStatus { return }
        lastStatus = key
        lastStatusAt = now
        guard let bytes = try? JSONEncoderLite().encode(status) else { return }
        publish(topics.status, bytes, qos: 0, retain: true)
        let failsafe = status.servo?.failsafe == nil ? "OFF" : "ON"
        publish(topics.failsafe, Array(failsafe.utf8), qos: 0, retain: true)
    }
}

struct MQTTError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
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
        guard let index = UInt8(levels[1]) else { return .invalid("\(levels[1]) is not a channel number (0…255)") }
        let text = String(decoding: payload, as: UTF8.self).trimmingCharacters(in: [" ", "\n", "\r", "\t"])
        switch levels[0] {
        case "servo", "pwm":
            guard let value = UInt16(text), value <= 1000 else { return .invalid("\"\(text)\" is not a value 0…1000") }
            return .message(levels[0] == "servo" ? .servo(channel: index, value: value) : .pwm(channel: index, value: value))
        case "switch", "enable":
            let on: Bool
            switch text.uppercased() {
            case "ON", "1", "TRUE": on = true
            case "OFF", "0", "FALSE": on = false
            default: return .invalid("\"\(text)\" is not ON or OFF")
            }
            return .message(levels[0] == "switch" ? .switchValue(index: index, on: on) : .enable(channel: index, on: on))
        case "lcd":
            guard payload.count <= Message.maximumTextLength else { return .invalid("text longer than \(Message.maximumTextLength) bytes") }
            return .message(.lcdText(line: index, text: payload.filter { $0 != 0 }))
        default:
            return .invalid("\(levels[0]) is not an output kind (servo, pwm, switch, enable, lcd)")
        }
    }
}

private extension String {
    func trimmingCharacters(in set: Set<Character>) -> String {
        var slice = Substring(self)
        while let first = slice.first, set.contains(first) { slice = slice.dropFirst() }
        while let last = slice.last, set.contains(last) { slice = slice.dropLast() }
        return String(slice)
    }
}
