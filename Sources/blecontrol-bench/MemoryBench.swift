import BLEControlProtocol
import Board
import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

// Issue #29: what real-time costs in memory, whether the servo thread ever
// waits for a page, and what wakes an idle board. The daemon runs as a
// process (the release build is what a board runs); every figure is read
// from /proc, printed, never asserted.
//
//   blecontrol-bench memory DAEMON [SECONDS]   lock_memory off and on
//   blecontrol-bench idle DAEMON [SECONDS]     wake-ups per thread

extension DaemonProcess {
    /// The servo thread (`blecontrol-servo`, cut to 15 bytes in comm).
    func servoThread() -> ProcessView.Thread? {
        view.threads().first { $0.name == "blecontrol-serv" }
    }
}

/// Megabytes, one decimal, from kB.
private func megabytes(_ kilobytes: Int?) -> String {
    guard let kilobytes else { return "n/a" }
    return String(format: "%.1f MB", Double(kilobytes) / 1024)
}

/// The simulator board with `realtime` set as the Raspberry Pi's board file
/// has it (priority 50), memory locked or not.
private func realtimeBoard(lockMemory: Bool) -> String {
    EmbeddedBoards.simulator
        .board(replacing: "  priority: 0", with: "  priority: 50")
        .board(replacing: "  lock_memory: false", with: "  lock_memory: \(lockMemory)")
}

/// A central streaming SERVO_VAL at 500 frames/s over 8 channels, paced on
/// absolute instants, with an LCD line twice a second; `every` runs about
/// once a second.
private final class Stream {
    private var central: LoopbackTCPClient
    private let port: UInt16
    private var index = 0
    private var next = ContinuousClock.now

    init(port: UInt16) throws {
        self.port = port
        central = try Stream.connect(port)
    }

    private static func connect(_ port: UInt16) throws -> LoopbackTCPClient {
        let central = try LoopbackTCPClient(port: port)
        var enable: [UInt8] = []
        for channel in 0..<8 { FrameEncoder.encode(.enable(channel: UInt8(channel), on: true), into: &enable) }
        try central.send(enable)
        return central
    }

    /// The central leaves (a failsafe: it was in control) and a new one
    /// takes over (it ends the failsafe).
    func reconnect() throws {
        central = try LoopbackTCPClient(port: port)
        usleep(100_000)
        central = try Stream.connect(port)
        next = .now
    }

    func run(seconds: Double, every: () throws -> Void = {}) throws {
        let end = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
        var nextEvery = ContinuousClock.now + .seconds(1)
        while ContinuousClock.now < end {
            var bytes: [UInt8] = []
            let value = UInt16((index * 13) % 1001)
            FrameEncoder.encode(.servo(channel: UInt8(index % 8), value: value), into: &bytes)
            if index % 250 == 0 {
                FrameEncoder.encode(.lcdText(line: UInt8(index / 250 % 2), text: Array("frame \(index)".utf8)), into: &bytes)
            }
            try central.send(bytes)
            index += 1
            next = next + .milliseconds(2)
            if ContinuousClock.now >= nextEvery {
                try every()
                nextEvery = nextEvery + .seconds(1)
            }
            let wait = ContinuousClock.now.duration(to: next)
            if wait > .zero { usleep(useconds_t(wait.inSeconds * 1e6)) }
        }
    }
}

struct MemoryFigures {
    var rss: Int?
    var anonymous: Int?
    var locked: Int?
    var faultsStartUp = (minor: 0, major: 0)
    var faultsFirstSecond = (minor: 0, major: 0)
    var faultsAfterWarmUp = (minor: 0, major: 0)
    var scheduling = "?"
    var stacks: [(thread: ProcessView.Thread, stack: ProcessView.Mapping)] = []
    var emulator: String?
}

func measureMemory(binary: String, lockMemory: Bool, warmUp: Double, window: Double) throws -> MemoryFigures {
    var figures = MemoryFigures()
    let daemon = try DaemonProcess(binary: binary, boardText: realtimeBoard(lockMemory: lockMemory), logLevel: "warning")
    defer { daemon.stop() }
    figures.emulator = daemon.view.emulator
    // Up: the chips initialised (and, locked, the servo thread warmed up).
    for _ in 0..<2000 {
        let servo = ((try? daemon.request(#"{"op":"status"}"#))?["status"] as? [String: Any])?["servo"] as? [String: Any]
        if servo?["online"] as? Bool == true {
            figures.scheduling = servo?["scheduling"] as? String ?? "?"
            break
        }
        usleep(10_000)
    }
    func faults() -> (minor: Int, major: Int) {
        let servo = daemon.servoThread()
        return (servo?.minorFaults ?? 0, servo?.majorFaults ?? 0)
    }
    func since(_ before: (minor: Int, major: Int)) -> (minor: Int, major: Int) {
        let now = faults()
        return (now.minor - before.minor, now.major - before.major)
    }
    figures.faultsStartUp = faults()
    let stream = try Stream(port: daemon.port)
    let start = faults()
    try stream.run(seconds: 1)
    figures.faultsFirstSecond = since(start)
    try stream.run(seconds: max(warmUp - 1, 0))
    // After the warm-up: more of the same, a status request a second, and
    // halfway the central leaving (failsafe) and a new one taking over.
    let warm = faults()
    try stream.run(seconds: window / 2) { _ = try daemon.request(#"{"op":"status"}"#) }
    try stream.reconnect()
    try stream.run(seconds: window / 2) { _ = try daemon.request(#"{"op":"status"}"#) }
    figures.faultsAfterWarmUp = since(warm)
    let memory = daemon.view.status(["VmRSS", "RssAnon", "VmLck"])
    (figures.rss, figures.anonymous, figures.locked) = (memory["VmRSS"], memory["RssAnon"], memory["VmLck"])
    if figures.emulator == nil { figures.stacks = daemon.view.threadStacks() }
    return figures
}

func benchmarkMemory(binary: String, seconds window: Double) throws {
    let warmUp = 10.0
    let runs = try [false, true].map { lock in (lock, try measureMemory(binary: binary, lockMemory: lock, warmUp: warmUp, window: window)) }
    print("memory and the servo thread's page faults (issue #29): \(binary)")
    print("  simulator board, realtime.priority 50 (as board/raspberry-pi.yaml), a central at 500 SERVO_VAL frames/s over TCP with an LCD line twice a second;")
    print("  after a \(Int(warmUp)) s warm-up, \(Int(window)) s more with a status request a second and, halfway, the central leaving (failsafe) and another taking over")
    func row(_ label: String, _ value: (MemoryFigures) -> String) {
        print("  " + label.padding(toLength: 52, withPad: " ", startingAt: 0) + runs.map { value($0.1).padding(toLength: 22, withPad: " ", startingAt: 0) }.joined())
    }
    row("", { _ in "" })
    print("  " + "".padding(toLength: 52, withPad: " ", startingAt: 0) + runs.map { "lock_memory: \($0.0)".padding(toLength: 22, withPad: " ", startingAt: 0) }.joined())
    row("servo thread scheduling") { $0.scheduling }
    row("VmRSS (resident)") { megabytes($0.rss) }
    row("RssAnon (resident, private)") { megabytes($0.anonymous) }
    row("VmLck (locked)") { megabytes($0.locked) }
    func pair(_ faults: (minor: Int, major: Int)) -> String { "\(faults.minor) / \(faults.major)" }
    row("servo thread faults, minor / major: up to serving") { pair($0.faultsStartUp) }
    row("  … in the first second of traffic") { pair($0.faultsFirstSecond) }
    row("  … after the warm-up (\(Int(window)) s, a failsafe)") { pair($0.faultsAfterWarmUp) }
    if let locked = runs.last?.1, !locked.stacks.isEmpty {
        print("  thread stacks (lock_memory: true): " + locked.stacks.map { "\($0.thread.name) \($0.stack.kilobytes) kB (\($0.stack.resident) kB resident)" }.joined(separator: ", "))
    }
    if let emulator = runs.first(where: { $0.1.emulator != nil })?.1.emulator {
        print("""
          under qemu-user (\(emulator)): every figure above is the emulator process's. VmRSS and RssAnon hold qemu's own
          memory beside the guest's (its translated-code buffer, its heap); VmLck counts what qemu's mappings add to the
          guest's (qemu passes mlockall through to the host, for all of them); the servo thread's page faults are those of the
          host thread that runs it, translating code included. The arm64 daemon's own figures come from an arm64 kernel:
          the image tier (Tests/Image/run) prints them from the booted image.
        """)
    }
}

// MARK: Idle

/// systemd's notification socket, read on a thread of its own: counts the
/// WATCHDOG=1 pings (and keeps the socket from filling).
private final class NotifySocket: @unchecked Sendable {
    let path: String
    private let fd: Int32
    private let lock = NSLock()
    private var pingCount = 0

    init(path: String) throws {
        self.path = path
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        guard withUnixAddress(path, { bind(fd, $0, $1) }) == 0 else { throw BenchError("bind \(path): \(errno)") }
        Thread { [self] in
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let count = read(fd, &buffer, buffer.count)
                if count < 0 { return }
                if String(decoding: buffer[0..<count], as: UTF8.self).contains("WATCHDOG=1") { lock.withLock { pingCount += 1 } }
            }
        }.start()
    }

    var pings: Int { lock.withLock { pingCount } }
}

func benchmarkIdle(binary: String, seconds window: Double) throws {
    print("an idle board's wake-ups (issue #29): \(binary), simulator board, no central; context switches per second of each thread over \(Int(window)) s")
    let broker: MosquittoBroker? = MosquittoBroker.available ? try MosquittoBroker() : nil
    if broker == nil { print("  (no broker runs: \(MosquittoBroker.binary) or libmosquitto is missing; scripts/install-deps unit installs them)") }
    var cases: [(label: String, mqtt: Bool, watchdog: Bool)] = []
    for mqtt in broker == nil ? [false] : [false, true] {
        for watchdog in [false, true] { cases.append(("\(mqtt ? "broker connected" : "no broker"), watchdog \(watchdog ? "on (WATCHDOG_USEC=5 s)" : "off")", mqtt, watchdog)) }
    }
    for (label, mqtt, watchdog) in cases {
        var board = EmbeddedBoards.simulator
        if mqtt, let broker {
            board = board.board(replacing: "transports:\n", with: "transports:\n" + broker.mqttSection(keepalive: 15)
                .board(replacing: "    status_interval_ms: 100\n", with: ""))
        }
        var notify: NotifySocket?
        let daemon = try DaemonProcess(binary: binary, boardText: board, logLevel: "warning", environment: watchdog ? { directory in
            notify = try? NotifySocket(path: directory + "/notify")
            return ["NOTIFY_SOCKET": directory + "/notify", "WATCHDOG_USEC": "5000000"]
        } : nil)
        defer { daemon.stop() }
        // Settled: the broker's session open (its status published), the
        // LCD initialised.
        for _ in 0..<3000 {
            let status = (try? daemon.request(#"{"op":"status"}"#))?["status"] as? [String: Any]
            let transports = status?["transports"] as? [String: Any]
            let lcd = status?["lcd"] as? [String: Any]
            if (!mqtt || (transports?["mqtt"] as? String)?.hasPrefix("connected") == true), lcd?["online"] as? Bool != false { break }
            usleep(10_000)
        }
        usleep(3_000_000)
        let before = Dictionary(uniqueKeysWithValues: daemon.view.threads().map { ($0.tid, $0) })
        let pingsBefore = notify?.pings ?? 0
        usleep(useconds_t(window * 1e6))
        let after = daemon.view.threads()
        let pings = Double((notify?.pings ?? 0) - pingsBefore) / window
        var rows: [String] = []
        var total = 0.0
        for task in after {
            let rate = Double(task.contextSwitches - (before[task.tid]?.contextSwitches ?? 0)) / window
            total += rate
            rows.append("\(task.name) \(String(format: "%.2f", rate))")
        }
        print("  \(label): \(String(format: "%.2f", total))/s: " + rows.joined(separator: ", ") + (watchdog ? String(format: "; WATCHDOG=1 %.2f/s", pings) : ""))
    }
}
