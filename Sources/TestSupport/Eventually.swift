import Reactor

/// How long a test waits for something another thread or process will do
/// (an output applied by the servo thread, text drawn by the LCD thread, a
/// reply from the daemon, a message from the broker).
///
/// A wait is bounded by tries, never by reading a clock: on a busy machine,
/// or under qemu-user, every try takes longer and the wait stretches with
/// it, so only an outcome that never comes fails a test, however loaded the
/// machine. The pause between tries grows from 1 ms to ``longestPause``:
/// what is quick is seen at once, and what is slow is not polled hard while
/// the thread it waits for needs the CPU. ``tries`` such pauses add up to
/// about two minutes (``time``) even when every try itself takes no time.
public enum Patience {
    /// Tries before a wait gives up (and the test fails).
    public static let tries = 6_000
    /// The longest pause between two tries.
    public static let longestPause: Duration = .milliseconds(20)

    /// What the pauses of ``tries`` tries add up to: for a bound that only a
    /// duration can express (a D-Bus call's timeout, a helper program's own
    /// timer), the same patience.
    public static let time: Duration = (0..<tries - 1).reduce(.zero) { $0 + pause(after: $1) }

    /// The pause after try `attempt` (counted from 0).
    static func pause(after attempt: Int) -> Duration {
        attempt < 5 ? .milliseconds(1 << attempt) : longestPause
    }
}

/// Polls `condition` until it holds; false if it did not within `tries`
/// tries (``Patience``). No test asserts how long that took.
public func eventually(tries: Int = Patience.tries, _ condition: () throws -> Bool) rethrows -> Bool {
    try eventuallyValue(tries: tries) { try condition() ? true : nil } ?? false
}

/// Polls `produce` until it gives a value, and returns that value; nil if
/// it gave none within `tries` tries (``Patience``).
public func eventuallyValue<Value>(tries: Int = Patience.tries, _ produce: () throws -> Value?) rethrows -> Value? {
    for attempt in 0..<max(1, tries) {
        if attempt > 0 { sleepThread(Patience.pause(after: attempt - 1)) }
        if let value = try produce() { return value }
    }
    return nil
}
