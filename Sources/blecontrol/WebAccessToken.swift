#if canImport(Glibc)
import Glibc
#endif
import Arguments
import Control
import Reactor

/// The token a page needs to drive the board through `blecontrol web` (as
/// Jupyter's): anyone who can reach the port, another user of this machine
/// included, gets the page, but only the holder of the printed address gets
/// the bridge, which acts with this process's right to the control socket.
enum WebAccessToken {
    /// 128 random bits, as 32 hex digits. The standard library's system
    /// generator is the kernel's (getrandom(2)): fit for a secret.
    static func fresh() -> String {
        var generator = SystemRandomNumberGenerator()
        return ControlProtocol.hex((0..<16).map { _ in UInt8.random(in: .min ... .max, using: &generator) })
    }

    /// A fresh token for this run, or (`--token-file`) the one kept in
    /// `path`, made there (mode 0600) the first time, so a service keeps
    /// its address across restarts. A file another user owns or can read,
    /// a symbolic link, or one that does not hold a token is refused.
    static func load(_ path: String?) throws -> String {
        guard let path else { return fresh() }
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        if fd < 0, errno == ENOENT {
            let token = fresh()
            let created = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
            guard created >= 0 else { throw ExitFailure("blecontrol web: cannot create the token file \(path): \(String(cString: strerror(errno)))") }
            defer { close(created) }
            let line = Array((token + "\n").utf8)
            guard line.withUnsafeBytes({ write(created, $0.baseAddress, $0.count) }) == line.count else {
                throw ExitFailure("blecontrol web: cannot write the token file \(path): \(String(cString: strerror(errno)))")
            }
            return token
        }
        guard fd >= 0 else {
            throw ExitFailure("blecontrol web: cannot open the token file \(path): \(String(cString: strerror(errno)))" + (errno == ELOOP ? " (a symbolic link: refused)" : ""))
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG else { throw ExitFailure("blecontrol web: the token file \(path) is not a regular file") }
        guard info.st_uid == geteuid() else { throw ExitFailure("blecontrol web: the token file \(path) belongs to \(UserRuntime.userName(info.st_uid)), not to this process's user: refused") }
        guard info.st_mode & 0o077 == 0 else { throw ExitFailure("blecontrol web: the token file \(path) can be read or changed by other users (chmod 600 \(path))") }
        var bytes = [UInt8](repeating: 0, count: 256)
        let count = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        let token = count > 0 ? String(decoding: bytes[0..<count], as: UTF8.self).trimmed : ""
        guard isPlausible(token) else {
            throw ExitFailure("blecontrol web: the token file \(path) must hold one token of 16 to 128 letters, digits, '-' or '_' (remove it to get a new one)")
        }
        return token
    }

    /// Long enough to guess never, and safe in a URL unescaped.
    static func isPlausible(_ token: String) -> Bool {
        (16...128).contains(token.utf8.count) && token.utf8.allSatisfy { byte in
            (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte)
                || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_")
        }
    }

    /// Compares in a time that depends on the lengths only, so the
    /// answer's timing does not reveal how much of a guess was right.
    static func matches(_ given: String, _ token: String) -> Bool {
        let a = Array(given.utf8), b = Array(token.utf8)
        guard a.count == b.count else { return false }
        return zip(a, b).reduce(UInt8(0)) { $0 | ($1.0 ^ $1.1) } == 0
    }
}
