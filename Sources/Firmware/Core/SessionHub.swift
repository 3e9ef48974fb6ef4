import Logging

/// Opens, feeds and closes sessions for every transport, and keeps the idle
/// timer of each session's partial frame. Lives on the event loop.
public final class SessionHub: @unchecked Sendable {
    // Loop-confined: used only on the event loop thread (other threads hop
    // back with `loop.execute`), which makes the unchecked Sendable sound.
    private let loop: EventLoop
    private let dispatcher: Dispatcher
    private let idleTimeout: Duration?
    private let logger: Logger
    private var nextID = 0
    private var open: [Int: (session: Session, timer: EventLoop.Token?)] = [:]
    /// Sessions opened since start.
    public private(set) var totalOpened = 0
    /// When the last frame from any session arrived.
    public private(set) var lastFrameAt: ContinuousClock.Instant?
    /// A session delivered at least one frame (a central is in control).
    public var onFrames: (() -> Void)?
    /// The last central (any session but the control socket's) went away.
    public var onLastCentralClosed: ((Session) -> Void)?

    /// Sessions that are centrals: every transport but the CLI's control socket.
    public var centrals: [Session] { sessions.filter { $0.transport != "control" } }

    public init(loop: EventLoop, dispatcher: Dispatcher, idleTimeout: Duration?, logger: Logger) {
        self.loop = loop
        self.dispatcher = dispatcher
        self.idleTimeout = idleTimeout
        self.logger = logger
    }

    /// The sessions open now, oldest first.
    public var sessions: [Session] { open.values.map(\.session).sorted { $0.id < $1.id } }

    /// A new central connected.
    public func open(transport: String, peer: String, send: @escaping ([UInt8]) -> Void) -> Session {
        nextID += 1
        totalOpened += 1
        let session = Session(id: nextID, transport: transport, peer: peer, dispatcher: dispatcher, idleTimeout: idleTimeout, send: send)
        open[session.id] = (session, nil)
        logger.info("session \(session.id) opened (\(transport) \(peer))")
        return session
    }

    /// Bytes arrived for `session`.
    public func receive<C: Collection>(_ bytes: C, for session: Session) where C.Element == UInt8 {
        let before = session.counters.frames
        session.receive(bytes)
        if session.counters.frames != before {
            lastFrameAt = .now
            onFrames?()
        }
        rearm(session)
    }

    /// The central went away.
    public func close(_ session: Session) {
        guard let entry = open.removeValue(forKey: session.id) else { return }
        if let timer = entry.timer { loop.cancelTimer(timer) }
        session.close()
        logger.info("session \(session.id) closed (\(session.transport) \(session.peer)): \(session.counters.frames) frames, \(session.counters.errors) errors")
        if session.transport != "control", centrals.isEmpty { onLastCentralClosed?(session) }
    }

    /// Keeps one timer per session at its decoder's deadline, so a partial
    /// frame is discarded on time even if the central never writes again.
    private func rearm(_ session: Session) {
        guard var entry = open[session.id] else { return }
        if let timer = entry.timer { loop.cancelTimer(timer) }
        entry.timer = session.deadline.map { deadline in
            loop.schedule(at: deadline) { [weak self, weak session] in
                guard let self, let session, self.open[session.id] != nil else { return }
                self.open[session.id]?.timer = nil
                session.expire()
                self.rearm(session)
            }
        }
        open[session.id] = entry
    }
}
