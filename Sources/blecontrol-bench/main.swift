import BLEControlProtocol
import DeviceEmulators
import Devices
import Board
import Firmware
import Runtime
import Foundation
import Hardware
import LinuxHardware
import CAllocationCounter
import Logging
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

// Benchmarks of issue #2: figures printed, never pass/fail. Run with
// `scripts/bench` (release build). Machines are shared and noisy: compare
// figures from one run, not across runs.


func format(_ value: Double, _ digits: Int = 1) -> String { String(format: "%.\(digits)f", value) }

// MARK: Decoder throughput

/// A traffic mix like a central's: mostly servo values, some enables, PWM
/// and LCD lines.
func trafficMix(bytes target: Int) -> (bytes: [UInt8], frames: Int) {
    var generator = SplitMix64(seed: 42)
    var bytes: [UInt8] = []
    bytes.reserveCapacity(target + 64)
    var frames = 0
    while bytes.count < target {
        let pick = generator.next() % 100
        let channel = UInt8(generator.next() % 8)
        let message: Message
        switch pick {
        case 0..<80: message = .servo(channel: channel, value: UInt16(generator.next() % 1001))
        case 80..<90: message = .pwm(channel: channel, value: UInt16(generator.next() % 1001))
        case 90..<96: message = .enable(channel: channel, on: generator.next() % 2 == 0)
        case 96..<99: message = .lcdText(line: UInt8(generator.next() % 2), text: Array("Speed \(generator.next() % 100) km/h".utf8))
        default: message = .lcdClear
        }
        FrameEncoder.encode(message, into: &bytes)
        frames += 1
    }
    return (bytes, frames)
}

func benchmarkDecoder() {
    let (bytes, frames) = trafficMix(bytes: 8 << 20)
    print("decoder (one core, \(bytes.count >> 20) MiB of mixed frames, \(frames) frames):")
    for chunk in [bytes.count, 20, 1] {
        var best = Duration.seconds(1000)
        var decoded = 0
        let repeats = chunk == 1 ? 1 : 3
        for _ in 0..<repeats {
            var decoder = FrameDecoder(configuration: .init(idleTimeout: nil))
            var count = 0
            let now = ContinuousClock.now
            let start = ContinuousClock.now
            var offset = 0
            while offset < bytes.count {
                let end = min(offset + chunk, bytes.count)
                decoder.decode(bytes[offset..<end], at: now) { event in
                    if case .message = event { count += 1 }
                }
                offset = end
            }
            best = min(best, ContinuousClock.now - start)
            decoded = count
        }
        precondition(decoded == frames, "decoded \(decoded) of \(frames) frames")
        let label = chunk == bytes.count ? "one write" : "\(chunk)-byte writes\(chunk == 20 ? " (BLE ATT payload)" : "")"
        print("  \(label.padding(toLength: 32, withPad: " ", startingAt: 0)) \(format(Double(frames) / best.inSeconds / 1e6, 2)) M frames/s  \(format(Double(bytes.count) / best.inSeconds / 1e6, 1)) MB/s")
    }
}

// MARK: Through the daemon

/// Builds the simulator board in-process with an ephemeral TCP port and a
/// private control socket.
func startSimulator(flushBudget: Int = 4) throws -> BoardRuntime {
    try startBoard(yaml: EmbeddedBoards.simulator.board(replacing: "max_flushes_per_period: 4", with: "max_flushes_per_period: \(flushBudget)"))
}

/// Builds the board `yaml` describes in-process, likewise.
func startBoard(yaml: String) throws -> BoardRuntime {
    var logger = Logger(label: "bench")
    logger.logLevel = .critical
    let configuration = try BoardFile.parse(yaml, path: EmbeddedBoards.simulatorPath)
    // A directory of its own: the daemon refuses a socket (and its instance
    // lock) in one anyone may write, such as /tmp.
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("blecontrol-bench-\(getpid())-\(configuration.name)").path
    mkdir(directory, 0o700)
    let socket = directory + "/control.sock"
    let runtime = try BoardRuntime(configuration: configuration, logger: logger, controlSocketPath: socket)
    try runtime.start(tcpOverride: ("127.0.0.1", 0))
    return runtime
}

/// Spins until `condition` holds; the emulator is read under its own lock.
func spin(until deadline: ContinuousClock.Instant, _ condition: () -> Bool) -> Bool {
    while !condition() {
        if ContinuousClock.now > deadline { return false }
        sched_yield()
    }
    return true
}

func benchmarkLatency(frames: Int) throws {
    // Unpaced (max_flushes_per_period: 0): the path's own latency; the
    // servo section shows what pacing adds.
    let runtime = try startSimulator(flushBudget: 0)
    defer { runtime.stop() }
    guard let chip = runtime.emulators?.pca9685.first, let port = runtime.tcpPort else { fatalError("the simulator board has no emulated PCA9685 or TCP port") }
    let central = try LoopbackTCPClient(port: port)
    try central.send(FrameEncoder.encode(.enable(channel: 0, on: true)))

    // 1. One frame at a time: from the send() of a SERVO_VAL to the moment
    //    the emulated PCA9685's registers produce the new pulse.
    var perFrame = LatencyHistogram()
    var misses = 0
    for index in 0..<frames {
        // Alternate far-apart values so every frame changes the register.
        let value: UInt16 = index % 2 == 0 ? 100 : 900
        let expected = 1000 + Double(value)
        let start = ContinuousClock.now
        try central.send(FrameEncoder.encode(.servo(channel: 0, value: value)))
        if spin(until: start + .seconds(1), { abs(chip.output(channel: 0).pulseWidth.value - expected) < 5 }) {
            perFrame.record(ContinuousClock.now - start)
        } else {
            misses += 1
        }
    }
    print("TCP frame → emulated PCA9685 register write (100 kHz emulated bus, flush pacing off), \(frames) servo frames sent one at a time:")
    print("  p50 \(perFrame.percentile(0.5) ?? -1) µs  p99 \(perFrame.percentile(0.99) ?? -1) µs  max \(perFrame.maximumMicroseconds) µs\(misses > 0 ? "  (\(misses) not seen within 1 s)" : "")")

    // 2. A stream: all frames back to back in 20-byte writes; the servo
    //    path's own histogram (socket read → bus write complete) and how
    //    many updates coalesced.
    var stream: [UInt8] = []
    for index in 0..<frames { FrameEncoder.encode(.servo(channel: UInt8(index % 8), value: UInt16(index % 1001)), into: &stream) }
    // The stream's values recur, so completion is marked by a PWM_VAL on
    // the pwm channel 7: a 33.3 % duty no SERVO_VAL frame can produce.
    let marker = FrameEncoder.encode(.pwm(channel: 7, value: 333))
    // Every channel enabled: values on a stopped channel change no register.
    for channel in UInt8(0)..<8 { try central.send(FrameEncoder.encode(.enable(channel: channel, on: true))) }
    usleep(100_000)
    runtime.resetServoMetrics()
    let start = ContinuousClock.now
    var offset = 0
    while offset < stream.count {
        try central.send(Array(stream[offset..<min(offset + 20, stream.count)]))
        offset += 20
    }
    try central.send(marker)
    _ = spin(until: start + .seconds(10)) { abs(chip.output(channel: 7).duty - 0.333) < 0.001 }
    let elapsed = ContinuousClock.now - start
    let after = try runtime.status().servo
    if let servo = after {
        print("stream of \(frames) servo frames over 8 channels in 20-byte writes (\(format(Double(frames) / elapsed.inSeconds, 0)) frames/s end to end):")
        print("  socket read → bus write complete: p50 \(servo.latencyP50Us ?? -1) µs  p99 \(servo.latencyP99Us ?? -1) µs  max \(servo.latencyMaxUs ?? -1) µs")
        let flushes = servo.flushes
        let writes = servo.busWrites
        print("  \(servo.updates) updates, \(servo.coalesced) coalesced, \(flushes) flushes, \(writes) bus writes (naive: \(frames) writes, one per frame)")
    }
}

func benchmarkWritesPerFlush() throws {
    // The driver alone: 8 channels staged together, one flush.
    let bus = EmulatedI2CBus()
    let chip = PCA9685Emulator()
    bus.attach(chip, at: I2CAddress(0x40)!)
    let driver = PCA9685(bus: bus, configuration: PCA9685.Configuration(address: I2CAddress(0x40)!), logger: Logger(label: "bench"), sleep: { _ in })
    try driver.start()
    for channel in 0..<8 {
        driver.setEnabled(true, channel: channel)
        driver.stage(.pulse(Microseconds(1000 + Double(channel) * 100)), channel: channel)
    }
    let contiguous = try driver.flush()
    for channel in stride(from: 0, to: 16, by: 2) { driver.stage(.pulse(Microseconds(1650)), channel: channel) }
    let scattered = try driver.flush()
    print("bus writes per flush, 8 channels changed at once (driver):")
    print("  channels 0–7: \(contiguous) write(s); channels 0,2,…,14: \(scattered) write(s)")

    // Through the daemon: 8 SERVO_VAL frames in one TCP write.
    let runtime = try startSimulator()
    defer { runtime.stop() }
    guard let emulated = runtime.emulators?.pca9685.first, let port = runtime.tcpPort else { return }
    let central = try LoopbackTCPClient(port: port)
    var enable: [UInt8] = []
    for channel in 0..<8 { FrameEncoder.encode(.enable(channel: UInt8(channel), on: true), into: &enable) }
    try central.send(enable)
    usleep(200_000)
    var rounds = 0
    var totalWrites = 0
    var totalFlushes = 0
    for round in 0..<200 {
        let before = try runtime.status().servo
        var frames: [UInt8] = []
        let value = UInt16(round % 2 == 0 ? 200 : 800)
        for channel in 0..<8 { FrameEncoder.encode(.servo(channel: UInt8(channel), value: value), into: &frames) }
        try central.send(frames)
        _ = spin(until: .now + .seconds(1)) { (0..<8).allSatisfy { abs(emulated.output(channel: $0).pulseWidth.value - 1000 - Double(value)) < 5 } }
        let after = try runtime.status().servo
        totalWrites += (after?.busWrites ?? 0) - (before?.busWrites ?? 0)
        totalFlushes += (after?.flushes ?? 0) - (before?.flushes ?? 0)
        rounds += 1
    }
    print("  through the daemon, 8 SERVO_VAL frames in one TCP write × \(rounds): \(format(Double(totalWrites) / Double(rounds), 2)) bus writes and \(format(Double(totalFlushes) / Double(rounds), 2)) flushes per round")
    try benchmarkTwoChips()
}

/// Two PCA9685s (0x40, 0x41) on the simulator's bus, 8 channels on each:
/// each chip is written in its own transactions, and only when one of its
/// channels changed.
func benchmarkTwoChips() throws {
    var channels = ""
    for chip in 0..<2 {
        for output in 0..<8 { channels += "    - { channel: \(chip * 8 + output), output: \"\(chip):\(output)\", role: servo }\n" }
    }
    let servo = EmbeddedBoards.simulator.range(of: "servo:\n")!.lowerBound
    let end = EmbeddedBoards.simulator.range(of: "\nswitches:")!.lowerBound
    // Its own name: its own instance lock beside the simulator's.
    let yaml = String(EmbeddedBoards.simulator[..<servo]).board(replacing: "name: simulator", with: "name: bench-two-chips")
        + "servo:\n  chips:\n    - { bus: main, address: 0x40 }\n    - { bus: main, address: 0x41 }\n  max_flushes_per_period: 0\n  channels:\n" + channels
        + String(EmbeddedBoards.simulator[end...])
    let runtime = try startBoard(yaml: yaml)
    defer { runtime.stop() }
    guard let chips = runtime.emulators?.pca9685, chips.count == 2, let port = runtime.tcpPort else { return }
    let central = try LoopbackTCPClient(port: port)
    var enable: [UInt8] = []
    for channel in 0..<16 { FrameEncoder.encode(.enable(channel: UInt8(channel), on: true), into: &enable) }
    try central.send(enable)
    usleep(200_000)
    print("  two chips (0x40, 0x41), 8 channels each, one TCP write per round × 200:")
    for (label, changed) in [("1 channel on the second chip", [8]), ("8 channels on the second chip", Array(8..<16)), ("16 channels, 8 on each chip", Array(0..<16))] {
        var writes = 0
        var flushes = 0
        var firstChipWrites = 0
        for round in 0..<200 {
            let before = try runtime.status().servo
            let firstBefore = chips[0].registerWriteCount
            let value = UInt16(round % 2 == 0 ? 200 : 800)
            var frames: [UInt8] = []
            for channel in changed { FrameEncoder.encode(.servo(channel: UInt8(channel), value: value), into: &frames) }
            try central.send(frames)
            _ = spin(until: .now + .seconds(1)) {
                changed.allSatisfy { abs(chips[$0 / 8].output(channel: $0 % 8).pulseWidth.value - 1000 - Double(value)) < 5 }
            }
            let after = try runtime.status().servo
            writes += (after?.busWrites ?? 0) - (before?.busWrites ?? 0)
            flushes += (after?.flushes ?? 0) - (before?.flushes ?? 0)
            if chips[0].registerWriteCount != firstBefore { firstChipWrites += 1 }
        }
        print("    \(label.padding(toLength: 30, withPad: " ", startingAt: 0)) \(format(Double(writes) / 200, 2)) bus writes, \(format(Double(flushes) / 200, 2)) flushes per round; rounds that wrote the first chip: \(firstChipWrites)")
    }
}

// MARK: The HM-10 serial transport (issue #15)

/// SERVO_VAL frames from an emulated HM-10 whose UART delivers one byte per
/// byte time (10 bits at the baud rate) into the simulator board's serial
/// transport on a pseudo-terminal: how many frames a second the board
/// applies, beside what the line can carry.
func benchmarkSerial() throws {
    print("HM-10 serial transport (emulated module, bytes paced at the line rate, pseudo-terminal, instant emulated bus):")
    for baud in [9600, 115_200] {
        let pty = try PseudoTerminal()
        let module = HM10Emulator(master: pty.master, answersAT: true, baud: baud)
        defer {
            module.stop()
            pty.close()
        }
        let yaml = EmbeddedBoards.simulator
            .board(replacing: "name: simulator", with: "name: bench-serial-\(baud)")
            .board(replacing: "byte_time_us: 90 ", with: "byte_time_us: 0 ")
            .board(replacing: "transports:\n", with: "transports:\n  serial: { device: \(pty.slavePath), baud: \(baud) }\n")
        let runtime = try startBoard(yaml: yaml)
        defer { runtime.stop() }
        _ = spin(until: .now + .seconds(10)) { (try? runtime.status().transports.serial)?.contains("no central") == true }
        module.connect()
        var enable: [UInt8] = []
        for channel in 0..<4 { FrameEncoder.encode(.enable(channel: UInt8(channel), on: true), into: &enable) }
        module.centralWrites(enable)
        // Two seconds of line time, whatever the rate.
        let frameBytes = 5
        let lineRate = Double(baud) / 10 / Double(frameBytes)
        let count = Int(lineRate * 2)
        var stream: [UInt8] = []
        for index in 0..<count {
            FrameEncoder.encode(.servo(channel: UInt8(index % 4), value: UInt16(index % 1000)), into: &stream)
        }
        let before = try runtime.status().counters.frames
        let started = ContinuousClock.now
        module.centralWrites(stream)
        _ = spin(until: .now + .seconds(30)) { ((try? runtime.status().counters.frames) ?? 0) - before >= count }
        let elapsed = started.duration(to: .now).inSeconds
        let applied = try runtime.status().counters.frames - before
        print("  \(String(baud).padding(toLength: 6, withPad: " ", startingAt: 0)) baud: \(applied) of \(count) frames in \(format(elapsed, 2)) s = \(format(Double(applied) / elapsed, 0)) frames/s; the line carries \(format(lineRate, 0)) frames/s (\(format(Double(applied) / elapsed / lineRate * 100, 0)) %)")
    }
}

// MARK: Servo dispatch (issue #5)

func benchmarkAllocations() {
    let configuration = try! BoardFile.parse(EmbeddedBoards.simulator, path: EmbeddedBoards.simulatorPath)
    let channels = configuration.servo!.channels
    measureAllocations(channels: channels, label: "")
    // The same with every servo channel moving along a profile (issue 38):
    // the motion's steps, once per period, allocate nothing either.
    let moving = channels.map { channel -> ChannelConfiguration in
        var channel = channel
        if channel.role == .servo { channel.motion = MotionLimits(speed: 5000, acceleration: 50_000) }
        return channel
    }
    measureAllocations(channels: moving, label: ", servos with speed and acceleration limits")
}

func measureAllocations(channels: [ChannelConfiguration], label: String) {
    var logger = Logger(label: "bench")
    logger.logLevel = .critical
    let driver = PCA9685(bus: DiscardingI2CBus(), configuration: PCA9685.Configuration(address: I2CAddress(0x40)!), logger: logger, sleep: { _ in })
    var timing = ServoPath.Timing()
    timing.maxFlushesPerPeriod = 0
    let servo = ServoPath(driver: driver, channels: channels, timing: timing, logger: logger)
    servo.start()
    defer { servo.stop() }
    for channel in 0..<8 { servo.setEnabled(true, channel: channel) }
    // Warm up: let every buffer reach its steady capacity.
    for value in 0..<2000 { servo.submit(.servo(UInt16(value % 1000)), channel: value % 8) }
    usleep(200_000)
    servo.resetMetrics()
    let updates = 20_000
    let before = blc_allocation_count()
    for value in 0..<updates {
        servo.submit(.servo(UInt16(value % 1000)), channel: value % 8)
        if value % 16 == 0 { sched_yield() }
    }
    usleep(200_000)
    let allocations = blc_allocation_count() - before
    let flushes = servo.snapshot().metrics.flushes
    print("heap allocations on the servo hot path (submit → flush, no-op bus, \(updates) updates, \(flushes) flushes\(label)):")
    print("  \(allocations) allocations: \(format(Double(allocations) / Double(updates), 3)) per update, \(format(Double(allocations) / Double(max(flushes, 1)), 2)) per flush")
}

/// One run of the 500 frames/s servo workload through TCP, optionally with
/// a second central rewriting the LCD as fast as it can.
func servoRun(realtime: Bool, lcdFlood: Bool, flushBudget: Int, seconds duration: Double) throws -> (p50: Int, p99: Int, max: Int, frames: Int, busWrites: Int, flushes: Int, chunksWaited: Int, busWait: Int, elapsed: Double, scheduling: String) {
    var yaml = EmbeddedBoards.simulator.board(replacing: "max_flushes_per_period: 4", with: "max_flushes_per_period: \(flushBudget)")
    if realtime { yaml = yaml.board(replacing: "  priority: 0", with: "  priority: 50") }
    let runtime = try startBoard(yaml: yaml)
    defer { runtime.stop() }
    let port = runtime.tcpPort!
    let central = try LoopbackTCPClient(port: port)
    var enable: [UInt8] = []
    for channel in UInt8(0)..<8 { FrameEncoder.encode(.enable(channel: channel, on: true), into: &enable) }
    try central.send(enable)
    usleep(200_000)

    let flooding = LockedBox(false)
    let flood = Thread {
        guard let display = try? LoopbackTCPClient(port: port) else { return }
        var round = 0
        while flooding.value {
            round += 1
            let text = Array("flood \(round) ABCDEFGHIJKLMNOP".utf8)
            try? display.send(FrameEncoder.encode(.lcdText(line: UInt8(round % 2), text: text)))
            usleep(1_000)
        }
    }
    if lcdFlood {
        flooding.value = true
        flood.start()
        usleep(200_000)
    }
    runtime.resetServoMetrics()
    let frames = Int(duration * 500)
    let start = ContinuousClock.now
    for index in 0..<frames {
        // Paced on absolute instants: 2 ms apart, 500 frames/s.
        pause(until: start + .microseconds(Int64(index) * 2000))
        try central.send(FrameEncoder.encode(.servo(channel: UInt8(index % 8), value: UInt16((index * 7) % 1001))))
    }
    usleep(100_000)
    let elapsed = (ContinuousClock.now - start).inSeconds
    flooding.value = false
    let servo = try runtime.status().servo!
    return (servo.latencyP50Us ?? -1, servo.latencyP99Us ?? -1, servo.latencyMaxUs ?? -1, frames, servo.busWrites, servo.flushes, servo.maxLcdChunksWaited, servo.maxBusWaitUs, elapsed, servo.scheduling)
}

/// Sleeps (blocking) until `due`; at once if it has passed: a workload
/// paced on absolute instants does not drift by the time each step took.
func pause(until due: ContinuousClock.Instant) {
    let now = ContinuousClock.now
    if due > now { usleep(useconds_t(max(0, Int(now.duration(to: due).inSeconds * 1e6)))) }
}

func benchmarkServoDispatch(seconds duration: Double) throws {
    print("servo dispatch, 500 SERVO_VAL frames/s over 8 channels through TCP, simulator board (100 kHz emulated bus), \(format(duration, 0)) s per run:")
    // HD44780 on a PCF8574: 4 port bytes per character or instruction, so a
    // chunk of 4 characters plus its set-address is 20 bytes + the address
    // byte; at 90 µs per byte (100 kHz) that holds the bus 1.89 ms.
    let chunkMicroseconds = (4 * 4 + 4 + 1) * 90
    print("  one LCD chunk (4 characters + set-address, 21 bytes at 100 kHz) ≈ \(chunkMicroseconds) µs")
    print("  scheduling        pacing     LCD flood  p50 µs  p99 µs  max µs  flushes/s  bus writes/s  naive/s  LCD chunks waited  max bus wait µs")
    for budget in [4, 0] {
        for realtime in [false, true] {
            var idleP99 = 0
            for flood in [false, true] {
                let run = try servoRun(realtime: realtime, lcdFlood: flood, flushBudget: budget, seconds: duration)
                let label = (realtime ? run.scheduling : "default").padding(toLength: 17, withPad: " ", startingAt: 0)
                let pacing = (budget == 0 ? "off" : "\(budget)/period").padding(toLength: 10, withPad: " ", startingAt: 0)
                print("  \(label) \(pacing) \((flood ? "yes" : "no").padding(toLength: 9, withPad: " ", startingAt: 0))  \(String(format: "%6d  %6d  %6d", run.p50, run.p99, run.max))  \(String(format: "%9.0f  %12.0f  %7.0f", Double(run.flushes) / run.elapsed, Double(run.busWrites) / run.elapsed, Double(run.frames) / run.elapsed))  \(String(format: "%17d  %15d", run.chunksWaited, run.busWait))")
                if flood {
                    let moved = run.p99 - idleP99
                    print("    the flood moved p99 by \(moved) µs: \(moved <= chunkMicroseconds ? "within" : "MORE than") one LCD chunk (\(chunkMicroseconds) µs)")
                } else {
                    idleP99 = run.p99
                }
            }
        }
    }
}

/// A section that measures a daemon binary: `NAME DAEMON [NUMBER...]`,
/// each number optional (left out from the right), with its default and
/// the values it takes.
struct DaemonSection {
    struct Number {
        var name: String
        var defaultValue: Double
        var range: ClosedRange<Double>
        var whole = false
    }
    var name: String
    var numbers: [Number]
    /// What the numbers mean, for the usage line.
    var note: String
    /// Runs on the daemon's path and every number; returns the exit status.
    var run: (String, [Double]) throws -> Int32

    var usage: String {
        "\(name) DAEMON" + numbers.reversed().reduce("") { inner, number in " [\(number.name)\(inner)]" }
    }

    /// The numbers from `given` (the words after DAEMON), nil if one is not
    /// a number this section takes, or there are too many.
    func parse(_ given: [String]) -> [Double]? {
        guard given.count <= numbers.count else { return nil }
        var values: [Double] = []
        for (index, number) in numbers.enumerated() {
            guard index < given.count else { values.append(number.defaultValue); continue }
            guard let value = Double(given[index]), number.range.contains(value),
                  !number.whole || value.rounded() == value else { return nil }
            values.append(value)
        }
        return values
    }
}

let daemonSections: [DaemonSection] = [
    DaemonSection(name: "soak", numbers: [.init(name: "SECONDS", defaultValue: 120, range: 1...1e7), .init(name: "SPEED", defaultValue: 1, range: 1...20)],
                  note: "default 120 s; a day: 86400; SPEED 1-20: the events that many times faster") {
        try soakDaemon(binary: $0, seconds: $1[0], speed: $1[1]) ? 0 : 1
    },
    DaemonSection(name: "flood", numbers: [.init(name: "MEGABYTES", defaultValue: 8, range: 1...1024, whole: true)], note: "default 8") {
        try benchmarkFlood(binary: $0, megabytes: Int($1[0]))
        return 0
    },
    DaemonSection(name: "chatter", numbers: [.init(name: "SECONDS", defaultValue: 120, range: 1...1e7)], note: "per phase; default 120") {
        try benchmarkChatter(binary: $0, seconds: $1[0])
        return 0
    },
    DaemonSection(name: "memory", numbers: [.init(name: "SECONDS", defaultValue: 20, range: 1...1e7)], note: "after a 10 s warm-up; default 20") {
        try benchmarkMemory(binary: $0, seconds: $1[0])
        return 0
    },
    DaemonSection(name: "idle", numbers: [.init(name: "SECONDS", defaultValue: 30, range: 1...1e7)], note: "per case; default 30") {
        try benchmarkIdle(binary: $0, seconds: $1[0])
        return 0
    },
    DaemonSection(name: "ack", numbers: [.init(name: "SAMPLES", defaultValue: 200, range: 1...100_000, whole: true)],
                  note: "writes per case; default 200; BLECONTROL_BENCH_BASELINE=DAEMON measures that one too") {
        try benchmarkAcknowledgement(binary: $0, baseline: ProcessInfo.processInfo.environment["BLECONTROL_BENCH_BASELINE"], samples: Int($1[0]))
        return 0
    },
]

// Usage: blecontrol-bench [all|foundation|servo|serial|mqtt] [frames]
//        blecontrol-bench daemon DAEMON [BASELINE-DAEMON]
//        blecontrol-bench soak DAEMON [SECONDS [SPEED]]
//        blecontrol-bench flood DAEMON [MEGABYTES]
//        blecontrol-bench chatter DAEMON [SECONDS]
//        blecontrol-bench memory DAEMON [SECONDS]
//        blecontrol-bench idle DAEMON [SECONDS]
//        blecontrol-bench ack DAEMON [SAMPLES]
blc_allocation_counter_link()
let arguments = Array(CommandLine.arguments.dropFirst())
let section = arguments.first ?? "all"
guard ["all", "foundation", "servo", "daemon", "serial", "mqtt", "motion"].contains(section) || daemonSections.contains(where: { $0.name == section }) else {
    print("usage: blecontrol-bench [all|foundation|servo|serial|mqtt] [frames] | motion [PERIODS] | daemon DAEMON [BASELINE-DAEMON] | "
          + daemonSections.map(\.usage).joined(separator: " | "))
    exit(2)
}
if let daemonSection = daemonSections.first(where: { $0.name == section }) {
    guard arguments.count >= 2, let numbers = daemonSection.parse(Array(arguments.dropFirst(2))) else {
        print("usage: blecontrol-bench \(daemonSection.usage)   (\(daemonSection.note))")
        exit(2)
    }
    // A daemon that goes away mid-write is a figure, not the bench's end.
    signal(SIGPIPE, SIG_IGN)
    do { exit(try daemonSection.run(arguments[1], numbers)) } catch {
        print("\(section) failed: \(error)")
        exit(1)
    }
}
if section == "motion" {
    do { try benchmarkMotion(periods: arguments.dropFirst().first.flatMap { Int($0) } ?? 10_000) } catch { print("benchmark failed: \(error)"); exit(1) }
    exit(0)
}
if section == "mqtt" {
    do { try benchmarkMQTT() } catch { print("benchmark failed: \(error)"); exit(1) }
    exit(0)
}
if section == "serial" {
    do { try benchmarkSerial() } catch { print("benchmark failed: \(error)"); exit(1) }
    exit(0)
}
if section == "daemon" {
    let daemonArguments = Array(arguments.dropFirst())
    guard let binary = daemonArguments.first else {
        print("usage: blecontrol-bench daemon DAEMON [BASELINE-DAEMON]")
        exit(2)
    }
    do {
        try benchmarkDaemon(binary: binary, baseline: daemonArguments.dropFirst().first)
    } catch {
        print("benchmark failed: \(error)")
        exit(1)
    }
    exit(0)
}
let frames = arguments.dropFirst().first.flatMap { Int($0) } ?? 10_000
print("blecontrol benchmarks (\(ProcessInfo.processInfo.activeProcessorCount) cores)\n")
do {
    if section != "servo" {
        benchmarkDecoder()
        print("")
        try benchmarkLatency(frames: frames)
        print("")
        try benchmarkWritesPerFlush()
        print("")
        try benchmarkSerial()
        print("")
        try benchmarkMQTT()
        print("")
    }
    if section != "foundation" {
        benchmarkAllocations()
        print("")
        try benchmarkServoDispatch(seconds: 3)
    }
} catch {
    print("benchmark failed: \(error)")
    exit(1)
}
