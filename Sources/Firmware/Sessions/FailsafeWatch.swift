import Hardware
import Reactor

/// The failsafe triggers that need a clock: a commander silent for the
/// silence timeout (each commander on its own frames), and the servo thread stuck in one bus transfer for the stall
/// timeout (seen twice, ``stallGrace`` apart). Deadline-driven on the event loop (a ``Scheduler``): it arms at
/// most one timer per trigger, at the instant the trigger could fire, and
/// none at all while the board is idle and already silent, so it costs no
/// wake-ups when nothing happens (the old watch polled 26 times a second).
/// On a ``ManualLoop`` the same code is tested on virtual time.
public final class FailsafeWatch: @unchecked Sendable {
    // Loop-confined.
    private let loop: any Scheduler
    /// A commander silent this long is failsafed (nil: never); a reload may change it.
    public var silenceTimeout: Duration?
    /// The servo thread in one bus transfer this long (seen twice,
    /// ``stallGrace`` apart) engages the failsafe.
    public var stallTimeout: Duration
    /// When the quietest commander's last frame arrived (the hub's).
    private let lastFrame: () -> ContinuousClock.Instant?
    /// Silences every commander quiet for the timeout (the hub's
    /// silenceCommanders); returns how many it silenced.
    private let silence: (Duration) -> Int
    /// How long the servo thread has been in its current transfer.
    private let busyFor: (ContinuousClock.Instant) -> Duration?
    private let engage: (String) -> Void
    private let acknowledgeBusy: () -> Void
    /// How long the servo thread has been on a CPU or waiting for one, in
    /// all (nil: the kernel does not say).
    private let runnableTime: () -> Duration?
    private var silenceTimer: LoopToken?
    private var stallTimer: LoopToken?

    /// The closures are the hub's and the servo path's, called on the loop;
    /// `engage` puts the outputs in failsafe with its reason.
    public init(loop: any Scheduler, silenceTimeout: Duration?, stallTimeout: Duration,
                lastFrame: @escaping () -> ContinuousClock.Instant?, silence: @escaping (Duration) -> Int, busyFor: @escaping (ContinuousClock.Instant) -> Duration?,
                acknowledgeBusy: @escaping () -> Void, runnableTime: @escaping () -> Duration? = { nil }, engage: @escaping (String) -> Void) {
        self.loop = loop
        self.silenceTimeout = silenceTimeout
        self.stallTimeout = stallTimeout
        self.lastFrame = lastFrame
        self.silence = silence
        self.busyFor = busyFor
        self.acknowledgeBusy = acknowledgeBusy
        self.runnableTime = runnableTime
        self.engage = engage
    }

    /// A frame arrived: make sure a silence timer is armed.
    public func frameArrived() {
        guard silenceTimeout != nil, silenceTimer == nil, let last = lastFrame() else { return }
        armSilence(from: last)
    }

    /// The servo thread entered a transfer at `since` (reported once per
    /// armed period): check it at the stall deadline.
    public func servoBusy(since: ContinuousClock.Instant) {
        guard stallTimer == nil else { return }
        stallTimer = loop.schedule(at: since + stallTimeout) { [weak self] in self?.checkStall() }
    }

    /// Disarms both timers (the runtime stops).
    public func cancel() {
        if let silenceTimer { loop.cancel(silenceTimer) }
        if let stallTimer { loop.cancel(stallTimer) }
        silenceTimer = nil
        stallTimer = nil
    }

    private func armSilence(from last: ContinuousClock.Instant) {
        guard let silenceTimeout else { return }
        silenceTimer = loop.schedule(at: last + silenceTimeout) { [weak self] in self?.checkSilence() }
    }

    private func checkSilence() {
        silenceTimer = nil
        guard let silenceTimeout, let last = lastFrame() else { return }
        if last.duration(to: loop.now) >= silenceTimeout {
            // The silenced commanders command nothing now: the next quietest
            // one, if any, sets the next deadline.
            _ = silence(silenceTimeout)
            if let next = lastFrame() { armSilence(from: next) }
        } else {
            // Frames came meanwhile: look again at the new deadline.
            armSilence(from: last)
        }
    }

    /// How long after a first sight of a stall the watch looks again
    /// before it engages.
    ///
    /// A pause of the whole process (a VM whose vCPUs the host did not run,
    /// SIGSTOP, a suspend) stops the servo thread in whatever transfer it
    /// was in and wakes it together with the loop: at that instant the
    /// transfer looks as old as the pause. Given a moment it finishes; a
    /// hung adapter does not. The second look engages only on the transfer
    /// the first one saw (by its start), however late either look fires.
    var stallGrace: Duration { stallTimeout / 5 }

    /// How old a transfer may grow while the servo thread is starved (see
    /// ``checkStall(sighted:)``) before the watch engages all the same: a
    /// driver spinning in a transfer is on a CPU all the while too.
    static let starvedLimit = 10

    /// One look at a transfer past the stall timeout: its start, when the
    /// look was, and the servo thread's runnable time then.
    private struct Sighting {
        var start: ContinuousClock.Instant
        var at: ContinuousClock.Instant
        var runnable: Duration?
    }

    /// `sighted`: an earlier look that found a transfer stuck.
    ///
    /// Between two looks at the same transfer, a thread blocked in it (the
    /// kernel waiting for the adapter) is asleep: the kernel counts it
    /// neither on a CPU nor waiting for one. A thread the host or a busier
    /// thread kept from running (a starved VM guest: the likeliest cause of
    /// the failsafe CI's VM tier once saw engage in the middle of a phone's
    /// session, a stall timeout after its last write) waits in a run
    /// queue, or looks, in a guest whose vCPU the host paused, as if on a
    /// CPU. When it was runnable for at least half the time between the
    /// looks, it is starved, not stuck: the watch looks again, up to
    /// ``starvedLimit`` stall timeouts; where the kernel does not say, it
    /// engages as before.
    private func checkStall(sighted: Sighting? = nil) {
        stallTimer = nil
        let now = loop.now
        guard let busy = busyFor(now) else {
            // Idle: the next transfer reports itself again.
            acknowledgeBusy()
            return
        }
        // Exact: instants and durations are whole attoseconds.
        let start = now - busy
        guard busy >= stallTimeout else {
            // A newer transfer: check it at its own deadline.
            stallTimer = loop.schedule(at: start + stallTimeout) { [weak self] in self?.checkStall() }
            return
        }
        let sighting = Sighting(start: start, at: now, runnable: runnableTime())
        guard let sighted, sighted.start == start else {
            stallTimer = loop.schedule(at: now + stallGrace) { [weak self] in self?.checkStall(sighted: sighting) }
            return
        }
        if let before = sighted.runnable, let after = sighting.runnable, (after - before) * 2 >= sighted.at.duration(to: now),
           busy < stallTimeout * Self.starvedLimit {
            stallTimer = loop.schedule(at: now + stallGrace) { [weak self] in self?.checkStall(sighted: sighting) }
            return
        }
        engage("servo thread stalled in a bus write for \(Int(busy.inSeconds * 1000)) ms")
        // Keep watching the same transfer: it may never end.
        stallTimer = loop.schedule(at: now + stallTimeout) { [weak self] in self?.checkStall(sighted: sighting) }
    }
}
