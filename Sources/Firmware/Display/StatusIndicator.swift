import Devices
import Reactor

/// The status LED's pattern, driven on the event loop: fast blink while the
/// servo controller is offline or in failsafe, a heartbeat while a central
/// is connected, a slow blink while waiting for one. The LED's own timing
/// says when its level next changes, and that is the only timer armed: the
/// pattern is re-evaluated at each change and whenever something it
/// depends on changes (``refresh()``), never by polling.
public final class StatusIndicator: @unchecked Sendable {
    // Loop-confined.
    private let loop: any Scheduler
    private let led: StatusLED
    private let pattern: () -> StatusLED.Pattern
    private var timer: LoopToken?
    private var running = false

    /// `pattern`: what the LED should show now, read on the loop.
    public init(loop: any Scheduler, led: StatusLED, pattern: @escaping () -> StatusLED.Pattern) {
        self.loop = loop
        self.led = led
        self.pattern = pattern
    }

    /// Shows the current pattern and follows it from now on.
    public func start() {
        running = true
        refresh()
    }

    /// Something the pattern depends on changed: show it now.
    public func refresh() {
        guard running else { return }
        if let timer { loop.cancel(timer) }
        timer = nil
        led.pattern = pattern()
        if let next = led.update(at: loop.now) {
            timer = loop.schedule(at: next) { [weak self] in
                self?.timer = nil
                self?.refresh()
            }
        }
    }

    /// Cancels the LED's timer; the LED keeps its last level.
    public func stop() {
        running = false
        if let timer { loop.cancel(timer) }
        timer = nil
    }
}
