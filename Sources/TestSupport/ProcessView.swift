import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A process as the kernel shows it in /proc (proc(5)): its memory figures,
/// its threads, its mappings. One reader for the benchmarks, which print
/// these figures, and the tests, which check the daemon's structure.
/// Every read is a snapshot; a process that has gone reads as empty.
public struct ProcessView: Sendable {
    public let pid: Int32

    public init(pid: Int32) { self.pid = pid }

    /// This process.
    public static var current: ProcessView { ProcessView(pid: getpid()) }

    /// A file of /proc, read to its end: its size says 0, so a plain
    /// "read the size" would return nothing.
    public static func read(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = Glibc.read(fd, &chunk, chunk.count)
            if count <= 0 { break }
            bytes += chunk[0..<count]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    private func read(_ relative: String) -> String? { Self.read("/proc/\(pid)/\(relative)") }

    private func entries(_ relative: String) -> [String] {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/\(relative)")) ?? []
    }

    /// The first number of each named field of a status file ("VmRSS:
    /// 14900 kB" gives 14900: kB for sizes, a count for the others).
    static func statusFields(_ text: String, _ names: Set<String>) -> [String: Int] {
        var values: [String: Int] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: ":", maxSplits: 1)
            guard parts.count == 2, names.contains(String(parts[0])) else { continue }
            values[String(parts[0])] = Int(parts[1].split(whereSeparator: { $0 == " " || $0 == "\t" }).first ?? "")
        }
        return values
    }

    /// Fields of /proc/PID/status (VmRSS, RssAnon, VmLck, VmHWM in kB).
    public func status(_ names: Set<String>) -> [String: Int] {
        read("status").map { Self.statusFields($0, names) } ?? [:]
    }

    /// Writing 5 to clear_refs resets VmHWM to VmRSS (proc(5)), so the
    /// next peak is the next run's own.
    public func resetPeak() {
        let fd = open("/proc/\(pid)/clear_refs", O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return }
        _ = write(fd, "5", 1)
        close(fd)
    }

    /// Open descriptors.
    public var descriptorCount: Int { entries("fd").count }

    /// Threads, counted without reading each one's files.
    public var threadCount: Int { entries("task").count }

    /// The program behind the process when it is an emulator: qemu-user
    /// running an arm64 binary (binfmt_misc). /proc then shows the
    /// emulator's threads and mappings, not the program's.
    public var emulator: String? {
        guard let exe = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe") else { return nil }
        return exe.contains("qemu") ? exe : nil
    }

    /// One thread, from /proc/PID/task/TID.
    public struct Thread: Sendable {
        public var tid: Int
        /// comm: the name cut to 15 bytes ("blecontrol-serv").
        public var name: String
        public var minorFaults: Int
        public var majorFaults: Int
        /// Voluntary and involuntary: each is a wake-up or a preemption.
        public var contextSwitches: Int
        /// CPU time in ns (schedstat: exact, unlike stat's 10 ms ticks).
        public var cpuNanoseconds: Int64
        /// The stack pointer while the thread waits in a system call
        /// (syscall's second-to-last field); nil while it runs.
        public var stackPointer: UInt?
    }

    /// Every thread now, by thread id.
    public func threads() -> [Thread] {
        var threads: [Thread] = []
        for task in entries("task") {
            guard let tid = Int(task), let stat = read("task/\(task)/stat"),
                  let open = stat.firstIndex(of: "("), let close = stat.lastIndex(of: ")") else { continue }
            let name = String(stat[stat.index(after: open)..<close])
            // After the name: field 3 (state) on, so field N is at N - 3;
            // minflt is field 10, majflt 12 (proc(5)).
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            guard fields.count > 9, let minor = Int(fields[7]), let major = Int(fields[9]) else { continue }
            let switches = read("task/\(task)/status").map { Self.statusFields($0, ["voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"]).values.reduce(0, +) } ?? 0
            let cpu = read("task/\(task)/schedstat")?.split(separator: " ").first.flatMap { Int64($0) } ?? 0
            var stackPointer: UInt?
            if let syscall = read("task/\(task)/syscall")?.split(separator: " "), syscall.count >= 3 {
                stackPointer = UInt(syscall[syscall.count - 2].dropFirst(2), radix: 16)
            }
            threads.append(Thread(tid: tid, name: name, minorFaults: minor, majorFaults: major,
                                  contextSwitches: switches, cpuNanoseconds: cpu, stackPointer: stackPointer))
        }
        return threads.sorted { $0.tid < $1.tid }
    }

    /// One mapping of /proc/PID/smaps.
    public struct Mapping: Sendable {
        public var low: UInt
        public var high: UInt
        /// "rw-p", "---p"…
        public var permissions: String
        /// The file, "[stack]", or empty for anonymous memory.
        public var name: String
        /// Resident, in kB.
        public var resident = 0
        /// VmFlags' two-letter names ("lo" locked, "lf" locked on fault).
        public var flags: Set<String> = []
        /// Its size, in kB.
        public var kilobytes: Int { Int(high - low) / 1024 }

        public func contains(_ address: UInt) -> Bool { low <= address && address < high }
    }

    /// Every mapping now.
    public func mappings() -> [Mapping] {
        guard let text = read("smaps") else { return [] }
        var mappings: [Mapping] = []
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            if let range = fields.first, fields.count >= 5, let dash = range.firstIndex(of: "-"),
               let low = UInt(range[..<dash], radix: 16), let high = UInt(range[range.index(after: dash)...], radix: 16) {
                mappings.append(Mapping(low: low, high: high, permissions: String(fields[1]),
                                        name: fields.count > 5 ? fields[5...].joined(separator: " ") : ""))
            } else if mappings.isEmpty {
                continue
            } else if line.hasPrefix("Rss:"), fields.count >= 2 {
                mappings[mappings.count - 1].resident = Int(fields[1]) ?? 0
            } else if line.hasPrefix("VmFlags:") {
                mappings[mappings.count - 1].flags = Set(fields.dropFirst().map(String.init))
            }
        }
        return mappings
    }

    /// Each thread waiting in a system call, with the mapping its stack
    /// pointer is in: its stack.
    public func threadStacks() -> [(thread: Thread, stack: Mapping)] {
        let mappings = mappings()
        return threads().compactMap { thread in
            guard let sp = thread.stackPointer, let stack = mappings.first(where: { $0.contains(sp) }) else { return nil }
            return (thread, stack)
        }
    }
}
