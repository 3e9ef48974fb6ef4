#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Where a program run by an ordinary user (the simulator's daemon, the
/// CLI that talks to it) keeps a socket: somewhere only that user can
/// write. A socket in a shared directory such as /tmp is a name any local
/// user can take first, and then answer every request sent to it.
public enum UserRuntime {
    /// Why a directory cannot be used as a private one.
    public struct Refusal: Error, CustomStringConvertible {
        public var description: String
    }

    /// The simulator board's control socket for the user running this
    /// process: `$XDG_RUNTIME_DIR/blecontrol-simulator.sock` when that is a
    /// private directory of this user (pam_systemd's /run/user/UID), else
    /// `simulator.sock` in ``fallbackDirectory(uid:)``. The daemon and the
    /// CLI compute it alike, so `blecontrol` finds the simulator its own
    /// user started.
    public static func simulatorSocketPath(runtimeDirectory: String? = Files.environment("XDG_RUNTIME_DIR"), uid: uid_t = geteuid()) -> String {
        if let runtimeDirectory, runtimeDirectory.hasPrefix("/"), problem(privateDirectory: runtimeDirectory, uid: uid) == nil {
            return (runtimeDirectory.hasSuffix("/") ? String(runtimeDirectory.dropLast()) : runtimeDirectory) + "/blecontrol-simulator.sock"
        }
        return fallbackDirectory(uid: uid) + "/simulator.sock"
    }

    /// `/tmp/blecontrol-UID`: the private directory the daemon makes (mode
    /// 0700) when there is no `$XDG_RUNTIME_DIR`.
    public static func fallbackDirectory(uid: uid_t = geteuid()) -> String {
        "/tmp/blecontrol-\(uid)"
    }

    /// Makes `path` a private directory of this process's user: creates it
    /// with mode 0700 (its parent must exist), or accepts the one there only
    /// if it is a directory, not a link, owned by this user and writable by
    /// nobody else. Someone else's directory is refused, never repaired: its
    /// owner could still have put a socket in it.
    public static func makePrivateDirectory(_ path: String) throws(Refusal) {
        if mkdir(path, 0o700) != 0, errno != EEXIST {
            throw Refusal(description: "cannot create \(path): \(String(cString: strerror(errno)))")
        }
        if let problem = problem(privateDirectory: path, uid: geteuid()) {
            throw Refusal(description: "\(path) \(problem); remove it (or set XDG_RUNTIME_DIR, or choose another socket with --socket)")
        }
    }

    /// Why `path` is not a directory only `uid` can write, nil when it is.
    public static func problem(privateDirectory path: String, uid: uid_t) -> String? {
        var info = stat()
        guard lstat(path, &info) == 0 else { return "does not exist" }
        guard info.st_mode & S_IFMT == S_IFDIR else { return "is not a directory" }
        guard info.st_uid == uid else { return "belongs to \(userName(info.st_uid)), not \(userName(uid))" }
        guard info.st_mode & 0o022 == 0 else { return "is writable by others (mode \(String(info.st_mode & 0o7777, radix: 8)))" }
        return nil
    }

    /// Why `path` is not a directory only this process's user (or root)
    /// can write, nil when it is: where the daemon keeps a file it will
    /// believe or write as itself (the instance lock, the outputs record).
    /// `anyOwner`: root reading another user's directory (the service
    /// user's) only needs nobody else to be able to write it.
    public static func problem(ownDirectory path: String, anyOwner: Bool = false) -> String? {
        var info = stat()
        guard lstat(path, &info) == 0 else { return "does not exist" }
        guard info.st_mode & S_IFMT == S_IFDIR else { return "is not a directory" }
        guard anyOwner || info.st_uid == geteuid() || info.st_uid == 0 else { return "belongs to \(userName(info.st_uid)), neither root nor \(userName(geteuid()))" }
        guard info.st_mode & 0o022 == 0 else { return "is writable by others (mode \(String(info.st_mode & 0o7777, radix: 8)))" }
        return nil
    }

    /// "nobody (uid 65534)", or "uid 4242" for a uid with no account.
    public static func userName(_ uid: uid_t) -> String {
        guard let entry = getpwuid(uid) else { return "uid \(uid)" }
        return "\(String(cString: entry.pointee.pw_name)) (uid \(uid))"
    }
}
