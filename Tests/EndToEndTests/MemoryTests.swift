#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Testing
import TestSupport

/// Issue #29, as the kernel sees the daemon (/proc): its allocator set up
/// before any thread, every thread on an explicit stack, and with
/// `realtime.lock_memory` its memory locked as it is touched, the servo
/// thread's stack whole. Structure only: what these cost is a benchmark
/// (`blecontrol-bench memory`), never asserted here.
@Suite("Memory as the kernel sees the daemon: one malloc arena, explicit stacks, locked on fault")
struct MemoryTests {
    typealias Mapping = ProcessView.Mapping

    /// Each thread's name and its stack (a thread waiting in a system call).
    static func threadStacks(_ pid: Int32) -> [(name: String, stack: Mapping)] {
        ProcessView(pid: pid).threadStacks().map { ($0.thread.name, $0.stack) }
    }

    static let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The simulator board with realtime set as `board/raspberry-pi.yaml`
    /// sets it, memory locked or not, in a file of `daemon`'s run.
    static func board(lockMemory: Bool) throws -> String {
        let text = try String(contentsOf: repositoryRoot.appendingPathComponent("board/simulator.yaml"), encoding: .utf8)
            .replacingOccurrences(of: "  lock_memory: false", with: "  lock_memory: \(lockMemory)")
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("blecontrol-memory-\(UUID().uuidString.prefix(8)).yaml").path
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// Where the kernel lets this process lock all it maps: root, or an
    /// unlimited RLIMIT_MEMLOCK (the unit's LimitMEMLOCK=infinity).
    static var mayLock: Bool {
        var limit = rlimit()
        getrlimit(Int32(__RLIMIT_MEMLOCK.rawValue), &limit)
        return getuid() == 0 || limit.rlim_cur == rlim_t.max
    }

    /// This suite runs under qemu-user (the aarch64 tier: scripts/build-arm64
    /// runs the bundle with QEMU_LD_PREFIX set). The daemons it starts are
    /// emulated too, and /proc shows qemu's mappings and threads, not the
    /// daemon's: `blecontrol-bench memory` prints what qemu-user can give,
    /// the image tier the arm64 daemon's own.
    static let underQEMU = ProcessInfo.processInfo.environment["QEMU_LD_PREFIX"] != nil
    static let qemuReason: Comment = "under qemu-user, /proc shows the emulator's mappings (the image tier measures the arm64 daemon)"

    /// The daemon under qemu-user (the aarch64 tier): /proc shows the
    /// emulator's mappings, not the guest's.
    static func emulated(_ pid: Int32) -> Bool {
        ProcessView(pid: pid).emulator != nil
    }

    @Test("One malloc arena, set before any thread: no 64 MiB heap reservation of a thread's own arena, even after traffic on every thread",
          .disabled(if: MemoryTests.underQEMU, MemoryTests.qemuReason), arguments: Executables.daemons)
    func oneArena(binary: String) throws {
        let board = try Self.board(lockMemory: false)
        defer { unlink(board) }
        let daemon = try SimulatorDaemon(extraArguments: ["--board", board], binary: binary)
        try #require(!Self.emulated(daemon.process.processIdentifier), "qemu-user: /proc shows the emulator's mappings")
        // Work on every thread: frames (I/O, servo), LCD text (LCD), status (I/O).
        let central = try LoopbackTCPClient(port: daemon.tcpPort)
        try central.send([0x01, 0x02, 0x00, 0x01, 0x02, 0x03, 0x00, 0x01, 0xF4, 0x04, 0x04, 0x00, 0x68, 0x69, 0x00])
        // The central stays connected: leaving, it would engage the failsafe,
        // whose message covers the LCD's text.
        try withExtendedLifetime(central) {
            _ = try daemon.waitFor("servo 0 at 1500 µs and the LCD's text") { status in
                let channels = status["channels"] as? [[String: Any]]
                let lcd = status["lcd"] as? [String: Any]
                return (channels?.first?["setpoint_us"] as? Double) == 1500 && (channels?.first?["pulse_us"] as? Double ?? 0) > 1490 && ((lcd?["lines"] as? [String])?.first ?? "").hasPrefix("hi")
            }
        }
        let mappings = ProcessView(pid: daemon.process.processIdentifier).mappings()
        try #require(!mappings.isEmpty)
        // A thread's arena is a 64 MiB-aligned reservation (HEAP_MAX_SIZE),
        // mostly PROT_NONE; nothing else the daemon maps is a large PROT_NONE
        // stretch (a thread's guard is a page or two).
        let reservations = mappings.filter { $0.permissions == "---p" && $0.name.isEmpty && $0.kilobytes >= 1024 }
        #expect(reservations.isEmpty, "anonymous PROT_NONE mappings of a MiB or more: \(reservations.map { "\($0.kilobytes) kB" })")
    }

    @Test("Every thread runs on its own explicit stack, far below glibc's 8 MiB default",
          .disabled(if: MemoryTests.underQEMU, MemoryTests.qemuReason), arguments: Executables.daemons)
    func explicitStacks(binary: String) throws {
        let board = try Self.board(lockMemory: false)
        defer { unlink(board) }
        let daemon = try SimulatorDaemon(extraArguments: ["--board", board], binary: binary)
        let pid = daemon.process.processIdentifier
        try #require(!Self.emulated(pid), "qemu-user: /proc shows the emulator's threads")
        try daemon.waitForChipsOnline()
        // Each thread's stack pointer shows while it waits in a system call.
        let threads: Set<String> = ["blecontrol-io", "blecontrol-serv", "blecontrol-lcd", "blecontrol-dbus"]
        let stacks = eventuallyValue { () -> [(name: String, stack: Mapping)]? in
            let stacks = Self.threadStacks(pid).filter { $0.name.hasPrefix("blecontrol-") }
            return Set(stacks.map(\.name)).isSuperset(of: threads) ? stacks : nil
        }
        try #require(stacks != nil, "the daemon's threads, each waiting in a system call")
        guard let stacks else { return }
        for (name, stack) in stacks {
            // Four times the largest a thread asks for (a sanitizer's build
            // multiplies sizes by 4), still a quarter of the default.
            #expect(stack.kilobytes < 2048, "\(name): a stack mapping of \(stack.kilobytes) kB")
        }
    }

    @Test("lock_memory: every mapping locked as it is touched (MCL_ONFAULT), the servo thread's stack locked whole and resident",
          .enabled(if: MemoryTests.mayLock, "mlockall needs root or an unlimited RLIMIT_MEMLOCK"),
          .disabled(if: MemoryTests.underQEMU, MemoryTests.qemuReason), arguments: Executables.daemons)
    func lockedOnFault(binary: String) throws {
        let board = try Self.board(lockMemory: true)
        defer { unlink(board) }
        let daemon = try SimulatorDaemon(extraArguments: ["--board", board], binary: binary)
        let pid = daemon.process.processIdentifier
        try #require(!Self.emulated(pid), "qemu-user: /proc shows the emulator's mappings")
        // The servo thread locks its stack once the chips answer.
        _ = try daemon.waitFor("the servo path online") { (($0["servo"] as? [String: Any])?["online"] as? Bool) == true }
        let mappings = ProcessView(pid: pid).mappings()
        let servo = try #require(eventuallyValue { Self.threadStacks(pid).first { $0.name == "blecontrol-serv" }?.stack },
                                 "the servo thread's stack")
        #expect(servo.flags.contains("lo") && !servo.flags.contains("lf"), "servo stack flags: \(servo.flags.sorted())")
        #expect(servo.resident == servo.kilobytes, "servo stack: \(servo.resident) of \(servo.kilobytes) kB resident")
        // Every other mapping the kernel can lock is locked on fault: not
        // the special ones it never locks ([vvar], [vdso]: VM_PFNMAP "pf",
        // VM_IO "io", VM_DONTEXPAND "de"; [vsyscall]).
        let special: Set<String> = ["pf", "io", "de"]
        let others = mappings.filter { $0.low != servo.low && $0.flags.isDisjoint(with: special) && $0.name != "[vsyscall]" }
        let unlocked = others.filter { !$0.flags.contains("lo") || !$0.flags.contains("lf") }
        #expect(unlocked.isEmpty, "not locked on fault: \(unlocked.prefix(5).map { "\($0.name.isEmpty ? "anonymous" : $0.name) \($0.permissions) \($0.flags.sorted())" })")
        #expect(!daemon.logText.contains("mlockall failed"))
    }
}
