import Foundation

/// The dedicated thread of a device service (servo path, LCD) and the
/// condition that guards the service's state: started once, asked to stop
/// through the condition, joined on stop. Keeps the start/stop/join dance in
/// one place.
final class ServiceThread: @unchecked Sendable {
    private let name: String
    /// The service's lock and wake-up: its state is read and written with
    /// it locked, and its loop waits on it.
    let condition = NSCondition()
    private var thread: Thread?
    private var stopping = false
    private let finished = DispatchSemaphore(value: 0)

    init(name: String) {
        self.name = name
    }

    /// True once stop was requested. Read it with the condition locked.
    var isStopping: Bool { stopping }

    /// Runs `body` on a new thread named `name` (visible in `ps -L`).
    func start(_ body: @escaping @Sendable () -> Void) {
        let finished = self.finished
        let thread = Thread {
            body()
            finished.signal()
        }
        thread.name = name
        self.thread = thread
        thread.start()
    }

    /// Requests the stop, wakes the loop and waits for it to end.
    /// Idempotent: a second stop finds no thread to wait for.
    func stop() {
        condition.withLock {
            stopping = true
            condition.broadcast()
        }
        if thread != nil {
            finished.wait()
            thread = nil
        }
    }
}
