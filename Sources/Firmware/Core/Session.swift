import BLEControlProtocol

/// One connected central (or TCP client, or CLI connection): its own frame
/// decoder, so two centrals never share a reassembly buffer, and its own
/// counters. Lives on the event loop.
public final class Session: @unchecked Sendable {
    // Loop-confined: used only on the event loop thread (other threads hop
    // back with `loop.execute`), which makes the unchecked Sendable sound.
    /// Per-session counters, shown in status.
    public struct Counters: Sendable, Equatable {
        public var bytes = 0
        public var frames = 0
        public var errors = 0
    }

    public let id: Int
    /// "tcp", "control", "ble", …
    public let transport: String
    /// Who is on the other end (address, device path).
    public let peer: String
    public let connectedAt: ContinuousClock.Instant
    public private(set) var counters = Counters()
    private var decoder: FrameDecoder
    private let dispatcher: Dispatcher
    private let send: ([UInt8]) -> Void

    /// - Parameter send: delivers a board → central frame (notification).
    public init(id: Int, transport: String, peer: String, dispatcher: Dispatcher, idleTimeout: Duration?, send: @escaping ([UInt8]) -> Void) {
        self.id = id
        self.transport = transport
        self.peer = peer
        self.dispatcher = dispatcher
        self.send = send
        self.connectedAt = .now
        self.decoder = FrameDecoder(configuration: FrameDecoder.Configuration(idleTimeout: idleTimeout))
    }

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

    /// Discards a partial frame that has been idle past the timeout.
    public func expire(at now: ContinuousClock.Instant = .now) {
        if let event = decoder.expire(at: now) { _ = record(event, at: now) }
    }

    /// The central is gone: its partial frame goes with it.
    public func close() {
        if let event = decoder.reset() { _ = record(event, at: .now) }
    }

    private func record(_ event: DecoderEvent, at now: ContinuousClock.Instant) -> Message? {
        switch event {
        case .message: counters.frames += 1
        case .error(let error):
            if case .partialFrameDiscarded = error {} else { counters.errors += 1 }
        }
        let reply = dispatcher.handle(event, receivedAt: now)
        if case .message = event, reply != nil { counters.errors += 1 }
        return reply
    }
}
