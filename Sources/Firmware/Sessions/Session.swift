import BLEControlProtocol

/// How a session reaches the board.
public enum TransportKind: String, Sendable, CaseIterable, CustomStringConvertible {
    case tcp, ble, serial, mqtt
    /// `blecontrol` on the control socket: drives the outputs like a
    /// central, but is an operator, not a central (it neither keeps the
    /// board out of failsafe nor ends it).
    case control

    /// BLE, TCP, serial and MQTT sessions are centrals; the CLI is not.
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
    }

    public let id: Int
    public let transport: TransportKind
    /// Who is on the other end (address, device path).
    public let peer: String
    public let connectedAt: ContinuousClock.Instant
    public private(set) var counters = Counters()
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
        decoder.decode(bytes, at: now) { event in
            if let reply = record(event, at: now) { replies.append(reply) }
        }
        for reply in replies { send(FrameEncoder.encode(reply)) }
    }

    /// When the partial frame being assembled will be discarded, if any.
    public var deadline: ContinuousClock.Instant? { decoder.deadline }

    /// Discards a partial frame that has been idle past the timeout; its
    /// ERROR reply (if the decoder gives one) goes to the central.
    public func expire(at now: ContinuousClock.Instant = .now) {
        if let event = decoder.expire(at: now), let reply = record(event, at: now) {
            send(FrameEncoder.encode(reply))
        }
    }

    /// The end of a message that holds whole frames (MQTT): a frame it cut
    /// short is discarded, as if idle past the timeout.
    public func endOfMessage(at now: ContinuousClock.Instant = .now) {
        if let event = decoder.reset(), let reply = record(event, at: now) {
            send(FrameEncoder.encode(reply))
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
        let reply = dispatcher.handle(event, receivedAt: now, central: transport.isCentral ? id : nil)
        if case .message = event {
            if reply == nil { counters.accepted += 1 } else { counters.errors += 1 }
        }
        return reply
    }
}
