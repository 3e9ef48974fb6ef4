#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Runs helper programs (`bluetoothd --version`, …) for the doctor and
/// tests: posix_spawn with stdout and stderr on a pipe, stdin from
/// /dev/null, bounded by a timeout.
public enum Subprocess {
    /// The program's output (stdout and stderr, trimmed), or nil when it
    /// cannot be started or does not finish within `timeout` (it is killed).
    public static func output(of executable: String, _ arguments: [String], timeout: Duration = .seconds(3)) -> String? {
        guard access(executable, X_OK) == 0 else { return nil }
        var pipe: [Int32] = [-1, -1]
        guard Glibc.pipe(&pipe) == 0 else { return nil }
        defer { close(pipe[0]) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, pipe[1], 1)
        posix_spawn_file_actions_adddup2(&actions, pipe[1], 2)
        posix_spawn_file_actions_addclose(&actions, pipe[0])
        var argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) }
        argv.append(nil)
        defer { for pointer in argv { free(pointer) } }
        // The caller's threads block the signals its signalfd takes
        // (SIGTERM, SIGALRM, …), and a child inherits that mask: a helper
        // could then neither be stopped nor use alarm(). It starts with none
        // blocked and every handler at its default.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t()
        sigemptyset(&none)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attributes, &none)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        var pid: pid_t = 0
        let status = posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
        close(pipe[1])
        guard status == 0 else { return nil }

        var output: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        let deadline = ContinuousClock.now + timeout
        _ = fcntl(pipe[0], F_SETFL, fcntl(pipe[0], F_GETFL) | O_NONBLOCK)
        var finished = false
        while !finished {
            var descriptor = pollfd(fd: pipe[0], events: Int16(POLLIN), revents: 0)
            let remaining = ContinuousClock.now.duration(to: deadline)
            if remaining <= .zero {
                kill(pid, SIGKILL)
                var ignored: Int32 = 0
                waitpid(pid, &ignored, 0)
                return nil
            }
            _ = poll(&descriptor, 1, Int32(clamping: remaining.nanoseconds / 1_000_000 + 1))
            while true {
                let count = buffer.withUnsafeMutableBytes { read(pipe[0], $0.baseAddress, $0.count) }
                if count > 0 {
                    output.append(contentsOf: buffer[0..<count])
                    if output.count > 1 << 20 { break }
                    continue
                }
                if count == 0 { finished = true }
                break
            }
        }
        var exitStatus: Int32 = 0
        while waitpid(pid, &exitStatus, 0) < 0 && errno == EINTR {}
        return String(decoding: output, as: UTF8.self).trimmed
    }
}
