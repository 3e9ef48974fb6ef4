import CMosquitto
import Glibc
import Reactor

/// How to reach a broker: what the board file's `transports.mqtt` and the
/// CLI's `--mqtt` options say.
public struct MQTTEndpoint: Sendable, Equatable {
    public var host: String
    public var port: UInt16
    public var clientID: String
    public var keepalive = 15
    public var username: String?
    public var password: String?
    /// TLS: the CA certificate the broker's must chain to (nil: no TLS).
    public var caFile: String?
    public var certFile: String?
    public var keyFile: String?

    public init(host: String, port: UInt16, clientID: String) {
        self.host = host
        self.port = port
        self.clientID = clientID
    }

    public var description: String { "\(host):\(port)" }

    /// The first line of a password file, or a clear error.
    public static func password(from file: String) throws(MQTTError) -> String {
        guard let text = try? Files.read(file) else {
            throw MQTTError("cannot read the password file \(file) (it must be readable by this user)")
        }
        return String(decoding: text, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).first.map(String.init) ?? ""
    }
}

/// A failure of the MQTT client, said plainly.
public struct MQTTError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// One connection to a broker through libmosquitto (MQTT 5), on a
/// `Reactor` event loop: no thread of libmosquitto's own. Its socket is
/// watched by the loop and `mosquitto_loop_read`, `_write` and `_misc` run
/// there; every callback runs on the loop. Used by the daemon's transport
/// and by `blecontrol --mqtt`.
public final class MQTTClient: @unchecked Sendable {
    // Loop-confined: used only on `loop`.
    private let loop: EventLoop
    private let endpoint: MQTTEndpoint
    private let api: UnsafePointer<bc_mosquitto_api>
    private let client: OpaquePointer
    private var socket: (fd: Int32, token: LoopToken)?
    private var tick: LoopToken?
    private var connectCalled = false

    /// CONNACK: 0 when accepted, else the reason (MQTT 5 reason codes).
    public var onConnect: (Int32) -> Void = { _ in }
    /// The connection ended (0: we asked); the socket is closed.
    public var onDisconnect: (Int32) -> Void = { _ in }
    /// A message: topic, payload, and whether the broker flagged it retained.
    public var onMessage: (String, [UInt8], Bool) -> Void = { _, _, _ in }
    /// A message larger than `maximumPacketSize` that the broker sent all
    /// the same (one that ignores the CONNECT property): its topic and
    /// payload size. Its payload is never copied.
    public var onOversize: (String, Int) -> Void = { _, _ in }
    /// SUBACK for the subscription with this message id (``subscribe``'s).
    public var onSubscribed: (Int32) -> Void = { _ in }
    /// The Maximum Packet Size this client announced, if any.
    public let maximumPacketSize: UInt32?

    /// Subscription options (MQTT 5): the broker sends no retained message
    /// on subscribing, and none of this client's own.
    public static let noRetainedNoLocal = Int32(BC_MQTT_SUB_OPT_SEND_RETAIN_NEVER | BC_MQTT_SUB_OPT_NO_LOCAL)
    /// Messages read per wakeup: a flood on the broker yields the loop to
    /// its other descriptors between batches (the loop is level-triggered).
    public static let readBatch = 32
    /// Payload bytes handed to `onMessage` per wakeup, at most (one message
    /// may pass it): a batch of the largest messages a broker lets through
    /// would otherwise hold the loop for as long as they take to handle.
    public static let readBytes = 16 * 1024
    /// Payload bytes delivered since the current wakeup's drain began.
    private var drained = 0

    /// Loads libmosquitto and sets the client up (nothing is sent yet).
    /// - Parameter will: published by the broker if the connection dies
    ///   without a DISCONNECT: (topic, payload), retained, QoS 1.
    /// - Parameter maximumPacketSize: announced in CONNECT (MQTT 5 §3.1.2.11.4):
    ///   a broker must not send this client a larger packet (Mosquitto drops
    ///   it and logs "Dropping too large outgoing PUBLISH"); one that does
    ///   anyway is refused here (`onOversize`), though libmosquitto has
    ///   already read it whole (it has no limit of its own on a client).
    public init(loop: EventLoop, endpoint: MQTTEndpoint, cleanSession: Bool = true, will: (String, [UInt8])? = nil,
                maximumPacketSize: UInt32? = nil) throws(MQTTError) {
        var error = [CChar](repeating: 0, count: 256)
        guard let api = bc_mosquitto_load(&error, error.count) else {
            throw MQTTError(String(nulTerminated: error))
        }
        guard let client = api.pointee.new_(endpoint.clientID, cleanSession, nil) else { throw MQTTError("mosquitto_new failed (out of memory)") }
        self.loop = loop
        self.endpoint = endpoint
        self.api = api
        self.client = client
        self.maximumPacketSize = maximumPacketSize
        let object = Unmanaged.passUnretained(self).toOpaque()
        api.pointee.user_data_set(client, object)
        _ = api.pointee.int_option(client, Int32(BC_MOSQ_OPT_PROTOCOL_VERSION), Int32(BC_MQTT_PROTOCOL_V5))
        // Small frames, one at a time: no Nagle delay.
        _ = api.pointee.int_option(client, Int32(BC_MOSQ_OPT_TCP_NODELAY), 1)
        if let maximumPacketSize {
            try check(bc_mosquitto_set_maximum_packet_size(api, client, maximumPacketSize), "the maximum packet size")
        }
        if let will {
            try check(api.pointee.will_set(client, will.0, Int32(will.1.count), will.1, 1, true), "the will")
        }
        if let username = endpoint.username {
            try check(api.pointee.username_pw_set(client, username, endpoint.password), "the user name")
        }
        if let ca = endpoint.caFile {
            try check(api.pointee.tls_set(client, ca, nil, endpoint.certFile, endpoint.keyFile, nil), "TLS (\(ca))")
        }
        api.pointee.connect_callback_set(client) { _, object, code in
            guard let object else { return }
            Unmanaged<MQTTClient>.fromOpaque(object).takeUnretainedValue().onConnect(code)
        }
        api.pointee.disconnect_callback_set(client) { _, object, code in
            guard let object else { return }
            Unmanaged<MQTTClient>.fromOpaque(object).takeUnretainedValue().ended(code)
        }
        api.pointee.subscribe_callback_set(client) { _, object, mid, _, _ in
            guard let object else { return }
            Unmanaged<MQTTClient>.fromOpaque(object).takeUnretainedValue().onSubscribed(mid)
        }
        api.pointee.message_callback_set(client) { _, object, message in
            guard let object, let message = message?.pointee, let topic = message.topic else { return }
            let this = Unmanaged<MQTTClient>.fromOpaque(object).takeUnretainedValue()
            let size = Int(max(message.payloadlen, 0))
            // The payload alone over the packet limit: the packet was too.
            if let limit = this.maximumPacketSize, size > Int(limit) {
                return this.onOversize(String(cString: topic), size)
            }
            let payload = message.payload.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? []
            this.drained += size
            this.onMessage(String(cString: topic), payload, message.retain)
        }
    }

    deinit {
        api.pointee.destroy(client)
    }

    /// Starts connecting (the first time) or reconnecting. The host name is
    /// resolved here, blocking the loop for as long as the resolver takes
    /// (libmosquitto has no asynchronous look-up); an address or a name in
    /// /etc/hosts costs nothing. The outcome comes through `onConnect` or
    /// `onDisconnect`.
    public func connect() throws(MQTTError) {
        loop.assertInLoop()
        let code = noted(connectCalled
            ? api.pointee.reconnect_async(client)
            : api.pointee.connect_async(client, endpoint.host, Int32(endpoint.port), Int32(endpoint.keepalive)))
        connectCalled = true
        guard code == 0 else { throw MQTTError("cannot connect to \(endpoint.description): \(describe(code))") }
        watch()
        if tick == nil { scheduleTick() }
    }

    /// Sends DISCONNECT (no will) and closes.
    public func disconnect() {
        loop.assertInLoop()
        if let tick { loop.cancel(tick) }
        tick = nil
        _ = api.pointee.loop_write(client, 1)
        _ = api.pointee.disconnect(client)
        _ = api.pointee.loop_write(client, 1)
        unwatch()
    }

    /// Queues a message; false when it could not be (no connection).
    @discardableResult
    public func publish(_ topic: String, _ payload: [UInt8], qos: Int32 = 0, retain: Bool = false) -> Bool {
        loop.assertInLoop()
        let code = payload.withUnsafeBytes { api.pointee.publish(client, nil, topic, Int32($0.count), $0.baseAddress, qos, retain) }
        watch()
        return code == 0
    }

    /// Sends SUBSCRIBE; returns its message id (``onSubscribed`` says when
    /// the broker has it: until then, messages on `filter` may pass by).
    @discardableResult
    public func subscribe(_ filter: String, qos: Int32 = 0, options: Int32 = 0) throws(MQTTError) -> Int32 {
        loop.assertInLoop()
        var mid: Int32 = 0
        let code = api.pointee.subscribe_v5(client, &mid, filter, qos, options, nil)
        guard code == 0 else { throw MQTTError("subscribing to \(filter): \(describe(code))") }
        watch()
        return mid
    }

    /// errno when libmosquitto last said MOSQ_ERR_ERRNO: read at once, as
    /// any later call (the close that follows, say) may change errno.
    private var lastErrno: Int32 = 0

    /// Remembers errno if `code` says the answer is in it.
    private func noted(_ code: Int32) -> Int32 {
        if code == Int32(BC_MOSQ_ERR_ERRNO) { lastErrno = errno }
        return code
    }

    /// A libmosquitto error or MQTT 5 reason code, in words.
    public func describe(_ code: Int32) -> String {
        if code == Int32(BC_MOSQ_ERR_ERRNO) { return lastErrno == 0 ? "a system error" : String(cString: strerror(lastErrno)) }
        return api.pointee.strerror(code).map { String(cString: $0) } ?? "error \(code)"
    }

    public func reason(_ code: Int32) -> String {
        api.pointee.reason_string(code).map { String(cString: $0) } ?? "reason \(code)"
    }

    private func check(_ code: Int32, _ what: String) throws(MQTTError) {
        guard code == 0 else { throw MQTTError("\(what): \(describe(code))") }
    }

    // MARK: The socket on the loop

    /// Readable always, writable while libmosquitto has output queued (or a
    /// connection in progress).
    private func watch() {
        let fd = api.pointee.socket(client)
        if let socket, socket.fd != fd { unwatch() }
        guard fd >= 0 else { return }
        let interest: EventLoop.Interest = api.pointee.want_write(client) ? [.readable, .writable] : [.readable]
        if let socket {
            loop.setInterest(socket.token, interest)
            return
        }
        if let token = try? loop.register(fd, interest: interest, handler: { [weak self] readiness in self?.ready(readiness) }) {
            socket = (fd, token)
        }
    }

    private func unwatch() {
        if let socket { loop.unregister(socket.token) }
        socket = nil
    }

    /// The connection is over: said once, however libmosquitto ended it.
    private func ended(_ code: Int32) {
        _ = noted(code)
        guard socket != nil else { return }
        unwatch()
        onDisconnect(code)
    }

    private func ready(_ readiness: EventLoop.Readiness) {
        var code: Int32 = 0
        if readiness.contains(.writable) { code = noted(api.pointee.loop_write(client, 1)) }
        if code == 0, readiness.contains(.readable) || readiness.contains(.closed) { code = drain() }
        // libmosquitto 2.0.11 returns a failed TLS handshake from
        // loop_read without its disconnect callback: the connection is
        // over all the same (the next connect closes what is left of it).
        if code != 0, code != Int32(BC_MOSQ_ERR_NO_CONN) { return ended(code) }
        watch()
    }

    /// Reads up to `readBatch` packets (and `readBytes` of payload):
    /// libmosquitto reads one per call when
    /// it has nothing queued. Without TLS the kernel says what is left; with
    /// TLS, OpenSSL may hold whole records the socket no longer signals, so
    /// the batch is read out (a call with nothing there returns at once).
    @discardableResult
    private func drain() -> Int32 {
        drained = 0
        for _ in 0..<Self.readBatch {
            let fd = api.pointee.socket(client)
            guard fd >= 0 else { return 0 }
            let code = noted(api.pointee.loop_read(client, 1))
            if code != 0 { return code }
            // The rest waits for the next wakeup, after the loop's other
            // descriptors (with TLS, for the next tick).
            if drained >= Self.readBytes { return 0 }
            if endpoint.caFile == nil {
                var pending: Int32 = 0
                if ioctl(fd, UInt(FIONREAD), &pending) != 0 || pending == 0 { return 0 }
            }
        }
        return 0
    }

    /// Keepalive pings and their timeout (loop_misc), and TLS records left
    /// in OpenSSL's buffer, four times a second. Without TLS only the
    /// keepalive needs the tick, and it may wait: libmosquitto pings once
    /// nothing went either way for `keepalive` seconds, and the broker
    /// gives up at 1.5 times that, so the tick has leeway up to a quarter
    /// of the keepalive and rides on the loop's other wake-ups (an idle
    /// board's LED) instead of waking it four times a second (issue #29).
    private func scheduleTick() {
        let leeway = endpoint.caFile == nil ? Duration.milliseconds(max(endpoint.keepalive * 250 - 250, 0)) : .zero
        tick = loop.schedule(after: .milliseconds(250), leeway: leeway) { [weak self] in
            guard let self else { return }
            self.tick = nil
            if self.socket != nil {
                _ = self.api.pointee.loop_misc(self.client)
                if self.endpoint.caFile != nil, self.drain() != 0 { return self.ended(Int32(BC_MOSQ_ERR_CONN_LOST)) }
                self.watch()
            }
            self.scheduleTick()
        }
    }
}
