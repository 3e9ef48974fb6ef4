import Foundation
import Hardware

/// Blocks the calling thread for `duration`: the default `sleep` of the
/// drivers, which take it as a parameter so tests need not wait.
public func threadSleep(_ duration: Duration) {
    let seconds = duration.inSeconds
    if seconds > 0 { Thread.sleep(forTimeInterval: seconds) }
}
