import Logging
import Reactor

/// Opens, feeds and closes sessions for every transport, and keeps the idle
/// timer of each session's partial frame. Lives on a loop (``Scheduler``):
/// the event loop in the daemon, a ``ManualLoop`` in tests, so partial-frame
/// expiry is tested on virtual time.
public final class SessionHub: @unchecked Sendable {
    // Loop-confined: used only on `loop` (checked).
    private let loop: any Scheduler
    private let dispatcher: Dispatcher
    /// The decoder idle timeout of sessions opened from now on.
    public var idleTimeout: Duration?
    private let logger: Logger
    private var nextID = 0
    private var open: [Int: (session: Session, timer: LoopToken?)] = [:]
    /// Sessions opened since start.
    public private(set) var totalOpened = 0
    /// When the last frame from a commander arrived: a central whose
    /// command is the last of some output (the silence watch follows the
    /// centrals in control, not observers nor the control socket).
    public private(set) var lastFrameAt: ContinuousClock.Instant?
    /// When each commander's own last frame arrived: silence is judged per
    /// commander, so a busy central cannot keep a frozen one's outputs alive.
    private var heardFrom: [Int: ContinuousClock.Instant] = [:]
    /// A central that is still connected had an output command accepted
    /// (ANALOG_OUT_EN, SERVO_VAL, PWM_VAL or SWITCH_VAL): it is in control,
    /// with the outputs it took over by it (those it did not command
    /// before). The failsafe ends here, and only here. Text, CLEAR and INIT
    /// end nothing: an observer cannot end a failsafe.
    public var onCentralInControl: ((Session, Set<Dispatcher.Output>) -> Void)?
    /// A commander sent nothing for the silence timeout while its
    /// connection stayed open: it takes the failsafe with it as one that
    /// leaves does, and commands nothing until its next output command.
    public var onCommanderSilent: ((Session, [Dispatcher.Output]) -> Void)?
    /// A frame arrived from a commander (the silence watch).
    public var onFrame: (() -> Void)?
    /// A central connected or left (the LED pattern follows).
    public var onCentralsChanged: ((Int) -> Void)?
    /// A central left while it was the commander of these outputs (their
    /// last command was its own): the disconnect failsafe, whatever other
    /// centrals are still connected. A central that never commanded an
    /// output (an observer) leaves without it.
    public var onCommanderLeft: ((Session, [Dispatcher.Output]) -> Void)?
    /// A session opened or closed, or had frames dispatched (any session,
    /// the control socket's too): what the status shows may have changed.
    public var onActivity: (() -> Void)?

    public init(loop: any Scheduler, dispatcher: Dispatcher, idleTimeout: Duration?, logger: Logger) {
        self.loop = loop
        self.dispatcher = dispatcher
        self.idleTimeout = idleTimeout
        self.logger = logger
    }

    /// The sessions open now, oldest first.
    public var sessions: [Session] { open.values.map(\.session).sorted { $0.id < $1.id } }

    /// Sessions that are centrals (every transport but the control socket).
    public var centrals: [Session] { sessions.filter(\.transport.isCentral) }

    /// How many centrals are connected.
    public var centralCount: Int { open.values.reduce(0) { $0 + ($1.session.transport.isCentral ? 1 : 0) } }

    /// A new central connected.
    public func open(transport: TransportKind, peer: String, send: @escaping ([UInt8]) -> Void) -> Session {
        loop.assertInLoop()
        nextID += 1
        totalOpened += 1
        let session = Session(id: nextID, transport: transport, peer: peer, dispatcher: dispatcher, idleTimeout: idleTimeout, connectedAt: loop.now, send: send)
        open[session.id] = (session, nil)
        logger.info("session \(session.id) opened (\(transport) \(peer))")
        if transport.isCentral { onCentralsChanged?(centralCount) }
        onActivity?()
        return session
    }

    /// Bytes arrived for `session`.
    public func receive<C: Collection>(_ bytes: C, for session: Session) where C.Element == UInt8 {
        loop.assertInLoop()
        guard open[session.id] != nil else { return }
        let now = loop.now
        let before = session.counters
        let commandsBefore = dispatcher.centralCommands
        dispatcher.clearNewlyTaken()
        session.receive(bytes, at: now)
        if session.counters.frames != before.frames {
            if session.transport.isCentral, dispatcher.commands(session.id) {
                lastFrameAt = now
                heardFrom[session.id] = now
                onFrame?()
            }
            onActivity?()
        }
        // Replying may have failed and closed the session (a reset right
        // after a frame that drew an ERROR): a central that is gone is not
        // in control, whatever it sent last.
        if dispatcher.centralCommands != commandsBefore, session.transport.isCentral, open[session.id] != nil {
            // What it took over with this write: usually nothing (an empty
            // set allocates nothing), so a stream of writes costs no sets.
            onCentralInControl?(session, dispatcher.newlyTaken.isEmpty ? [] : Set(dispatcher.newlyTaken))
        }
        rearm(session)
    }

    /// Bytes arrived for `session` that its transport holds for now (the
    /// HM-10's possible notice): its partial frame is not idle. Without
    /// this, bytes held one after another, each within the hold, could add
    /// up to the idle timeout; the decoder would drop the frame, and the
    /// central's text spelling OK+LOST would then be taken for the notice.
    public func bytesHeld(for session: Session) {
        loop.assertInLoop()
        guard open[session.id] != nil else { return }
        session.noteHeldBytes(at: loop.now)
        rearm(session)
    }

    /// `session`'s message ended (MQTT: one message holds whole frames).
    public func endOfMessage(_ session: Session) {
        loop.assertInLoop()
        guard open[session.id] != nil, session.hasPartialFrame else { return }
        session.endOfMessage(at: loop.now)
        rearm(session)
    }

    /// The central went away.
    public func close(_ session: Session) {
        loop.assertInLoop()
        guard let entry = open.removeValue(forKey: session.id) else { return }
        if let timer = entry.timer { loop.cancel(timer) }
        session.close(at: loop.now)
        logger.info("session \(session.id) closed (\(session.transport) \(session.peer)): \(session.counters.frames) frames, \(session.counters.errors) errors")
        onActivity?()
        heardFrom[session.id] = nil
        guard session.transport.isCentral else { return }
        let commanded = dispatcher.relinquish(session.id)
        onCentralsChanged?(centralCount)
        if !commanded.isEmpty { onCommanderLeft?(session, commanded) }
    }

    /// Of the centrals in control now, when the one heard from longest ago
    /// sent its last frame (the silence watch's next deadline).
    public var quietestCommanderFrameAt: ContinuousClock.Instant? {
        loop.assertInLoop()
        var quietest: ContinuousClock.Instant?
        for (id, at) in heardFrom {
            guard dispatcher.commands(id) else {
                // Every output it had obeys another central now.
                heardFrom[id] = nil
                continue
            }
            if quietest.map({ at < $0 }) ?? true { quietest = at }
        }
        return quietest
    }

    /// Every commander silent for `timeout` or longer loses its outputs
    /// (``onCommanderSilent``), connection or not. Returns how many.
    @discardableResult
    public func silenceCommanders(quietFor timeout: Duration) -> Int {
        loop.assertInLoop()
        let now = loop.now
        var silenced = 0
        for (id, at) in heardFrom.sorted(by: { $0.key < $1.key }) where at.duration(to: now) >= timeout {
            heardFrom[id] = nil
            guard let session = open[id]?.session else { continue }
            let outputs = dispatcher.relinquish(id)
            guard !outputs.isEmpty else { continue }
            silenced += 1
            logger.notice("session \(id) (\(session.transport) \(session.peer)) sent nothing for \(Int(timeout.inSeconds * 1000)) ms while in control of \(outputs.count) output(s): failsafe")
            onCommanderSilent?(session, outputs)
        }
        return silenced
    }

    /// Keeps a timer per session with a partial frame, so the frame is
    /// discarded on time even if the central never writes again. A new byte
    /// only moves the decoder's deadline later, so a timer already armed is
    /// kept: when it fires early it finds nothing to expire and re-arms at
    /// the deadline then current (no timer churn per frame).
    private func rearm(_ session: Session) {
        guard var entry = open[session.id], entry.timer == nil else { return }
        // The decoder discards a frame idle for *longer* than the timeout,
        // so the timer fires just after the deadline, not at it.
        entry.timer = session.deadline.map { deadline in
            loop.schedule(at: deadline + .nanoseconds(1)) { [weak self, weak session] in
                guard let self, let session, self.open[session.id] != nil else { return }
                self.open[session.id]?.timer = nil
                // Expiring may send an ERROR, and the send may close the session.
                session.expire(at: self.loop.now)
                self.rearm(session)
            }
        }
        open[session.id] = entry
    }
}
