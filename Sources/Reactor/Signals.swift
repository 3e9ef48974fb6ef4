#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CReactor

/// Signals delivered as events on a loop (signalfd(2)), not as handlers that
/// interrupt whatever a thread was doing.
///
/// ``init(signals:)`` blocks the signals in the calling thread; call it
/// first thing in `main`, before any other thread exists, so every thread
/// inherits the mask and no signal can take its default action (end the
/// process with the outputs still pulsing) on some thread. A signal that
/// arrives before the source is attached to a loop waits, pending, in the
/// descriptor: nothing is lost between start-up and the first poll.
public final class SignalSource: @unchecked Sendable {
    // `fd` is immutable; `token` is used on the attached loop only.
    public let signals: [Int32]
    private let fd: CInt
    private var token: LoopToken?

    /// Every signal whose default action ends the process and that a
    /// daemon can meaningfully catch (signal(7)): all but the synchronous
    /// faults (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP),
    /// which a signalfd cannot take, and SIGKILL/SIGSTOP, which nobody can.
    public static var terminating: [Int32] {
        var signals: [Int32] = [SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF,
                                SIGXCPU, SIGXFSZ, SIGIO, SIGPWR, SIGSTKFLT]
        signals.append(contentsOf: Array(creactor_sigrtmin()...creactor_sigrtmax()))
        return signals
    }

    /// Blocks `signals` in the calling thread and opens a signalfd for them.
    public init(signals: [Int32]) throws {
        self.signals = signals
        var mask = sigset_t()
        sigemptyset(&mask)
        for signal in signals { sigaddset(&mask, signal) }
        let status = pthread_sigmask(SIG_BLOCK, &mask, nil)
        guard status == 0 else { throw EventLoop.Failure(call: "pthread_sigmask", errno: status) }
        fd = creactor_signalfd(&mask)
        guard fd >= 0 else { throw EventLoop.Failure(call: "signalfd", errno: errno) }
    }

    deinit { close(fd) }

    /// Delivers each signal to `handler` on `loop` (call on the loop), with
    /// the sending process's pid (0 for the kernel).
    public func attach(to loop: EventLoop, handler: @escaping (_ signal: Int32, _ sender: Int32) -> Void) throws {
        token = try loop.register(fd, interest: .readable) { [fd] _ in
            var sender: Int32 = 0
            while true {
                let signal = creactor_signalfd_read(fd, &sender)
                guard signal > 0 else { return }
                handler(signal, sender)
            }
        }
    }

    /// Stops delivering (call on the loop it was attached to).
    public func detach(from loop: EventLoop) {
        if let token { loop.unregister(token) }
        token = nil
    }

    /// A signal's name for logs ("SIGHUP", "SIGRTMIN+3").
    public static func name(_ signal: Int32) -> String {
        switch signal {
        case SIGHUP: return "SIGHUP"
        case SIGINT: return "SIGINT"
        case SIGQUIT: return "SIGQUIT"
        case SIGTERM: return "SIGTERM"
        case SIGUSR1: return "SIGUSR1"
        case SIGUSR2: return "SIGUSR2"
        case SIGALRM: return "SIGALRM"
        case SIGVTALRM: return "SIGVTALRM"
        case SIGPROF: return "SIGPROF"
        case SIGXCPU: return "SIGXCPU"
        case SIGXFSZ: return "SIGXFSZ"
        case SIGIO: return "SIGIO"
        case SIGPWR: return "SIGPWR"
        case SIGSTKFLT: return "SIGSTKFLT"
        case SIGPIPE: return "SIGPIPE"
        default:
            let low = creactor_sigrtmin()
            if signal >= low, signal <= creactor_sigrtmax() { return signal == low ? "SIGRTMIN" : "SIGRTMIN+\(signal - low)" }
            return "signal \(signal)"
        }
    }
}
