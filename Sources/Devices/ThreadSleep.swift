import Hardware
import Reactor

/// Blocks the calling thread for `duration`: the default `sleep` of the
/// drivers, which take it as a parameter so tests need not wait.
public func threadSleep(_ duration: Duration) {
    sleepThread(duration)
}
