#if canImport(Glibc)
import Glibc
#endif
import Reactor
import Synchronization

/// One daemon per board: an exclusive flock(2) on a file named after the
/// board in the runtime directory, taken before any device is opened, so a
/// second `blecontrold` for the same board exits without writing to a bus
/// (it would otherwise switch off the outputs of the daemon in control).
/// The kernel drops the lock when the holder exits, however it exits.
final class InstanceLock: Sendable {
    // Immutable after init but for `released`, which only the runtime's
    // single stop() path sets.
    let path: String
    private let fd: Int32

    struct Held: Error, CustomStringConvertible {
        var path: String
        var holder: String
        var description: String {
            "another blecontrold\(holder) already runs this board (lock \(path) is held); stop it first, or give this one another board name"
        }
    }

    /// - Parameters:
    ///   - directory: the runtime directory (systemd's RuntimeDirectory, or
    ///     the control socket's directory).
    ///   - board: the board's name.
    init(directory: String, board: String) throws {
        let safeName = String(board.map { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" ? $0 : "_" })
        path = (directory.isEmpty ? "." : directory) + "/blecontrold-\(safeName).lock"
        Files.makeDirectories(directory.isEmpty ? "." : directory)
        // A directory anyone may write (a socket in /tmp) is refused: there
        // anyone could take the lock's name first and keep the daemon from
        // starting, or plant a file for it to write (as the simulator's
        // socket directory is refused).
        if let problem = UserRuntime.problem(ownDirectory: directory.isEmpty ? "." : directory) {
            throw BoardBuses.SetupError(description: "the control socket's directory \(directory.isEmpty ? "." : directory) \(problem): the instance lock beside it could be anyone's; put the control socket (--socket) in a directory only this user can write")
        }
        // Never through a symlink, and never someone else's file: in a
        // directory others can write (a socket in /tmp), a name made there
        // first must not get a root daemon to truncate and write its target.
        var descriptor = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o644)
        if descriptor < 0, errno == EEXIST {
            descriptor = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)
        }
        guard descriptor >= 0 else {
            let reason = errno == ELOOP ? "it is a symbolic link" : String(cString: strerror(errno))
            throw BoardBuses.SetupError(description: "cannot create the instance lock \(path): \(reason)")
        }
        var file = stat()
        guard fstat(descriptor, &file) == 0, file.st_mode & S_IFMT == S_IFREG, file.st_uid == geteuid() else {
            close(descriptor)
            throw BoardBuses.SetupError(description: "the instance lock \(path) is not a file of this user's (uid \(file.st_uid)): someone else made it; remove it, or put the control socket in a directory only this user can write")
        }
        fd = descriptor
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let holder = Files.text(path, limit: 64)?.trimmed
            close(fd)
            throw Held(path: path, holder: holder.map { $0.isEmpty ? "" : " (pid \($0))" } ?? "")
        }
        // The holder's pid, for the message a second instance prints.
        ftruncate(fd, 0)
        let pid = Array("\(getpid())\n".utf8)
        _ = pid.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
    }

    private let released = Atomic(false)

    /// Lets the next daemon in (stop calls it; deinit does it anyway).
    func release() {
        guard !released.exchange(true, ordering: .acquiringAndReleasing) else { return }
        flock(fd, LOCK_UN)
        close(fd)
    }

    deinit { release() }
}
