#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import SystemPackage

/// Small file-system helpers on swift-system, for the few files the daemon
/// and its tools read whole (board files, /proc, /sys, /etc/machine-id)
/// without Foundation.
public enum Files {
    /// Why a file could not be read.
    public enum ReadError: Error, Equatable, CustomStringConvertible {
        case missing
        case unreadable(Errno)
        /// Larger than the limit the caller gave.
        case tooLarge(limit: Int)

        public var description: String {
            switch self {
            case .missing: return "no such file"
            case .unreadable(let errno): return "cannot be read: \(errno)"
            case .tooLarge(let limit): return "is larger than \(limit) bytes"
            }
        }
    }

    /// The bytes of the file at `path`, refusing files over `limit` bytes
    /// (a board file is a few kilobytes; a 100 MB one is a mistake, not a
    /// reason to use 6 GB of memory finding that out).
    public static func read(_ path: String, limit: Int = 1 << 20) throws(ReadError) -> [UInt8] {
        let fd: FileDescriptor
        do {
            fd = try FileDescriptor.open(path, .readOnly, options: [.closeOnExec])
        } catch {
            let errno = error as? Errno ?? .ioError
            throw errno == .noSuchFileOrDirectory ? .missing : .unreadable(errno)
        }
        defer { try? fd.close() }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        while true {
            let count: Int
            do {
                count = try chunk.withUnsafeMutableBytes { try fd.read(into: $0) }
            } catch {
                throw .unreadable(error as? Errno ?? .ioError)
            }
            if count == 0 { return bytes }
            if bytes.count + count > limit { throw .tooLarge(limit: limit) }
            bytes.append(contentsOf: chunk[0..<count])
        }
    }

    /// The file as UTF-8 text (invalid sequences repaired), or nil.
    public static func text(_ path: String, limit: Int = 1 << 20) -> String? {
        guard let bytes = try? read(path, limit: limit) else { return nil }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// True when something exists at `path` (lstat: a dangling link counts).
    public static func exists(_ path: String) -> Bool {
        var info = stat()
        return lstat(path, &info) == 0
    }

    /// True for a directory (following links).
    public static func isDirectory(_ path: String) -> Bool {
        var info = stat()
        return stat(path, &info) == 0 && (info.st_mode & S_IFMT) == S_IFDIR
    }

    /// The names in a directory, sorted, without `.` and `..`; empty when it
    /// cannot be read.
    public static func list(_ path: String) -> [String] {
        guard let directory = opendir(path) else { return [] }
        defer { closedir(directory) }
        var names: [String] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names.sorted()
    }

    /// Writes `bytes` to `path` (created with `mode`, truncated).
    public static func write(_ bytes: [UInt8], to path: String, mode: mode_t = 0o644) throws {
        let fd = try FileDescriptor.open(path, .writeOnly, options: [.create, .truncate, .closeOnExec], permissions: FilePermissions(rawValue: mode))
        defer { try? fd.close() }
        _ = try bytes.withUnsafeBytes { try fd.writeAll($0) }
    }

    /// Creates `path` and its parents (mkdir -p); existing directories are fine.
    public static func makeDirectories(_ path: String, mode: mode_t = 0o755) {
        var current = path.hasPrefix("/") ? "" : "."
        for component in path.split(separator: "/") {
            current += "/" + component
            _ = mkdir(current, mode)
        }
    }

    /// The directory part of a path ("" for a bare name).
    public static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "" }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    /// An environment variable, or nil when unset or empty.
    public static func environment(_ name: String) -> String? {
        guard let value = getenv(name) else { return nil }
        let text = String(cString: value)
        return text.isEmpty ? nil : text
    }
}
