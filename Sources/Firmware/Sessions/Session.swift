import BLEControlProtocol

/// How a session reaches the board.
public enum TransportKind: String, Sendable, CaseIterable, CustomStringConvertible {
    case tcp, ble, serial, mqtt
    /// The control page in a browser, through `blecontrol web`'s bridge: a
    /// central like a phone (its session ends, and the failsafe acts, when
    /// the page goes).
    case web
    /// `blecontrol` on the control socket: drives the outputs like a
    /// central, but is an operator, not a central (it neither keeps the
    /// board out of failsafe nor ends it).
    case control

    /// BLE, TCP, serial, MQTT and web sessions are centrals; the CLI is not.
    public var isCentral: Bool { self != .control }
    public var description: String { rawValue }
}

/// One connected central (or TCP client, or CLI connection): its own frame
/// decoder, so two centrals never share a reassembly buffer, and its own
/// counters. Lives on the event loop.
public final class Session: @unchecked Sendable {
    // Loop-confined: used only on the loop that owns its hub.

    /// Per-session counters, shown in status.
    public struct Counters: Sendable, Equatable {
        public var bytes = 0
        public var frames = 0
        /// Frames applied without an ERROR reply.
        public var accepted = 0
        public var errors = 0
        /// ERROR replies not sent: over the session's reply budget.
        public var repliesDropped = 0
    }

    /// How many ERROR replies (and other answers to refused input) one
    /// central can draw: a burst of ``burst``, then ``perSecond``. A stream
    /// of bad frames costs the board one reply per budget token, not one per
    /// frame: 8 MiB of `09 00` would otherwise be four million replies
    /// queued for a central that may never read them. The original app
    /// never comes near it (at most 8 ERRORs for its 8 channels per slider
    /// move). Beyond it, replies are counted in `repliesDropped`.
    public struct ReplyBudget: Sendable {
        public static let burst = 8.0
        public static let perSecond = 20.0
        private var tokens = burst
        private var at: ContinuousClock.Instant?

        public init() {}

        /// Takes one token if there is one at `now`.
        public mutating func take(at now: ContinuousClock.Instant) -> Bool {
            if let at {
                tokens = min(Self.burst, tokens + max(0, at.duration(to: now).inSeconds) * Self.perSecond)
            }
            at = now
            guard tokens >= 1 else { return false }
            tokens -= 1
            return true
        }
    }

    public let id: Int
    public let transport: TransportKind
    /// Who is on the other end (address, device path).
    public let peer: String
    public let connectedAt: ContinuousClock.Instant
    public private(set) var counters = Counters()
    /// A timed move for the values this session sends now (the control
    /// socket's `over_ms`); nil: the channels' own limits.
    public var moveDuration: Duration?
    private var budget = ReplyBudget()
    private var decoder: FrameDecoder
    private let dispatcher: Dispatcher
    private let send: ([UInt8]) -> Void

    /// - Parameter send: delivers a board → central frame (notification).
    public init(id: Int, transport: TransportKind, peer: String, dispatcher: Dispatcher, idleTimeout: Duration?,
                connectedAt: ContinuousClock.Instant = .now, send: @escaping ([UInt8]) -> Void) {
        self.id = id
        self.transport = transport
        self.peer = peer
        self.dispatcher = dispatcher
        self.send = send
        self.connectedAt = connectedAt
        self.decoder = FrameDecoder(configuration: FrameDecoder.Configuration(idleTimeout: idleTimeout))
    }

    /// Whether the decoder holds part of a frame (a transport that mixes its
    /// own messages into the stream recognises them only between frames).
    public var hasPartialFrame: Bool { decoder.hasPartialFrame }

    /// Bytes from the central, in arrival order.
    public func receive<C: Collection>(_ bytes: C, at now: ContinuousClock.Instant = .now) where C.Element == UInt8 {
        counters.bytes += bytes.count
        var replies: [Message] = []
        // The budget is spent as replies arise, so a flood of bad frames
        // in one write never gathers more than a burst of them here.
        decoder.decode(bytes, at: now) { event in
            if let reply = record(event, at: now), mayReply(at: now) { replies.append(reply) }
        }
        for answer in replies { send(FrameEncoder.encode(answer)) }
    }

    /// Whether an answer to refused input may go out now (the session's
    /// ``ReplyBudget``); a refused one is counted. For a transport's own
    /// refusals too (an MQTT payload that is no value).
    public func mayReply(at now: ContinuousClock.Instant) -> Bool {
        // The control socket is an operator's request and its answer: it
        // gets every reply (its requests are bounded in size).
        if !transport.isCentral || budget.take(at: now) { return true }
        counters.repliesDropped += 1
        return false
    }

    /// The transport refused input before it became frames (an MQTT
    /// payload that is no value): counted as an error; true when the
    /// refusal may be answered (``mayReply(at:)``).
    public func refused(at now: ContinuousClock.Instant) -> Bool {
        counters.errors += 1
        return mayReply(at: now)
    }

    private func reply(_ message: Message, at now: ContinuousClock.Instant) {
        guard mayReply(at: now) else { return }
        send(FrameEncoder.encode(message))
    }

    /// The transport holds bytes of this central's that arrived at `now`
    /// (``FrameDecoder/noteHeldBytes(at:)``).
    public func noteHeldBytes(at now: ContinuousClock.Instant) { decoder.noteHeldBytes(at: now) }

    /// When the partial frame being assembled will be discarded, if any.
    public var deadline: ContinuousClock.Instant? { decoder.deadline }

    /// Discards a partial frame that has been idle past the timeout; its
    /// ERROR reply (if the decoder gives one) goes to the central.
    public func expire(at now: ContinuousClock.Instant = .now) {
        if let event = decoder.expire(at: now), let answer = record(event, at: now) {
            reply(answer, at: now)
        }
    }

    /// The end of a message that holds whole frames (MQTT): a frame it cut
    /// short is discarded, as if idle past the timeout.
    public func endOfMessage(at now: ContinuousClock.Instant = .now) {
        if let event = decoder.reset(), let answer = record(event, at: now) {
            reply(answer, at: now)
        }
    }

    /// The central is gone: its partial frame goes with it.
    public func close(at now: ContinuousClock.Instant = .now) {
        if let event = decoder.reset() { _ = record(event, at: now) }
    }

    private func record(_ event: DecoderEvent, at now: ContinuousClock.Instant) -> Message? {
        switch event {
        case .message: counters.frames += 1
        case .error(let error):
            if case .partialFrameDiscarded = error {} else { counters.errors += 1 }
        case .provisional: break
        }
        let reply = dispatcher.handle(event, receivedAt: now, central: transport.isCentral ? id : nil, over: moveDuration)
        if case .message = event {
            if reply == nil { counters.accepted += 1 } else { counters.errors += 1 }
        }
        return reply
    }
}
