#if canImport(Glibc)
import Glibc
#endif
import Board
import Logging
import Reactor
import SystemPackage

/// Where the daemon keeps its ``DrivenOutputs`` record, and how it is
/// written and believed. The record is the crash cleanup's first source, so
/// only a file that nobody but root and the daemon's own user could have
/// written is read: opened without following a symlink, a regular file,
/// neither it nor its directory writable by group or others, owned by root
/// or by whoever owns its directory.
public enum OutputsRecord {
    /// The record of the packaged service (its StateDirectory=).
    public static let defaultPath = "/var/lib/blecontrol/driven-outputs"

    public struct Refusal: Error, CustomStringConvertible {
        public var description: String
    }

    /// Writes `outputs` to `path` atomically (a new file, synced, renamed
    /// over the old one): a power cut leaves the old record or the new one.
    public static func write(_ outputs: DrivenOutputs, to path: String) throws(Refusal) {
        let directory = Files.directory(of: path).isEmpty ? "." : Files.directory(of: path)
        try checkDirectory(directory)
        let temporary = "\(path).new-\(getpid())"
        // O_EXCL | O_NOFOLLOW: never through a link, never someone's file.
        var failure: String?
        do {
            let fd = try FileDescriptor.open(temporary, .writeOnly, options: [.create, .exclusiveCreate, .noFollow, .closeOnExec],
                                             permissions: [.ownerReadWrite, .groupRead, .otherRead])
            // writeAll retries short writes and EINTR.
            do {
                _ = try fd.writeAll(Array(outputs.record.utf8))
                if fsync(fd.rawValue) != 0 { failure = "fsync: \(lastError())" }
            } catch {
                failure = "write: \(error)"
            }
            try? fd.close()
        } catch {
            throw Refusal(description: "cannot create \(temporary): \(error)")
        }
        if failure == nil, rename(temporary, path) != 0 { failure = "rename: \(lastError())" }
        if let failure {
            unlink(temporary)
            throw Refusal(description: "\(path): \(failure)")
        }
        let directoryFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directoryFD >= 0 {
            fsync(directoryFD)
            close(directoryFD)
        }
    }

    /// The record at `path`; nil when there is none. Throws when there is one
    /// that cannot be believed (someone else's, torn, not a record).
    public static func read(_ path: String) throws(Refusal) -> DrivenOutputs? {
        let directory = Files.directory(of: path).isEmpty ? "." : Files.directory(of: path)
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            throw Refusal(description: "\(path): \(lastError())")
        }
        defer { close(fd) }
        var file = stat()
        var folder = stat()
        guard fstat(fd, &file) == 0, stat(directory, &folder) == 0 else { throw Refusal(description: "\(path): \(lastError())") }
        guard file.st_mode & S_IFMT == S_IFREG else { throw Refusal(description: "\(path) is not a regular file") }
        guard file.st_mode & 0o022 == 0 else { throw Refusal(description: "\(path) is writable by group or others") }
        guard file.st_uid == 0 || file.st_uid == folder.st_uid else { throw Refusal(description: "\(path) belongs to uid \(file.st_uid), neither root nor its directory's owner") }
        // Root (the boot unit) reads the service user's directory too.
        try checkDirectory(directory, anyOwner: geteuid() == 0)
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while bytes.count <= DrivenOutputs.maximumRecordSize {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0, errno == EINTR { continue }
            guard n >= 0 else { throw Refusal(description: "\(path): \(lastError())") }
            if n == 0 { break }
            bytes += buffer[..<n]
        }
        guard let text = String(validating: bytes, as: UTF8.self) else { throw Refusal(description: "\(path) is not text") }
        do {
            return try DrivenOutputs.parse(record: text)
        } catch {
            throw Refusal(description: "\(path): \(error)")
        }
    }

    /// A directory only its owner (root or the daemon's user) can change.
    private static func checkDirectory(_ directory: String, anyOwner: Bool = false) throws(Refusal) {
        if let problem = UserRuntime.problem(ownDirectory: directory, anyOwner: anyOwner) {
            throw Refusal(description: "\(directory) \(problem) (a record there could be anyone's)")
        }
    }
}

private func lastError() -> String { String(cString: strerror(errno)) }
