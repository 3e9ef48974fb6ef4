import BLEControlProtocol
import DeviceEmulators
import Devices
import Firmware
import Foundation
import Hardware
import Logging
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

// Benchmarks of issue #2: figures printed, never pass/fail. Run with
// `scripts/bench` (release build). Machines are shared and noisy: compare
// figures from one run, not across runs.

func seconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) + Double(duration.components.attoseconds) * 1e-18
}

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
        print("  \(label.padding(toLength: 32, withPad: " ", startingAt: 0)) \(format(Double(frames) / seconds(best) / 1e6, 2)) M frames/s  \(format(Double(bytes.count) / seconds(best) / 1e6, 1)) MB/s")
    }
}

// MARK: Through the daemon

/// Builds the simulator board in-process with an ephemeral TCP port and a
/// private control socket.
func startSimulator() throws -> BoardRuntime {
    var logger = Logger(label: "bench")
    logger.logLevel = .warning
    let configuration = try BoardFile.parse(EmbeddedBoards.simulator, path: EmbeddedBoards.simulatorPath)
    let runtime = try BoardRuntime(configuration: configuration, logger: logger)
    let socket = FileManager.default.temporaryDirectory.appendingPathComponent("blecontrol-bench-\(getpid()).sock").path
    try runtime.start(controlSocketPath: socket, tcpOverride: ("127.0.0.1", 0))
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
    let runtime = try startSimulator()
    defer { runtime.stop() }
    guard let chip = runtime.emulators?.pca9685, let port = runtime.tcpPort else { fatalError("the simulator board has no emulated PCA9685 or TCP port") }
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
    print("TCP frame → emulated PCA9685 register write, \(frames) servo frames sent one at a time:")
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
        print("stream of \(frames) servo frames over 8 channels in 20-byte writes (\(format(Double(frames) / seconds(elapsed), 0)) frames/s end to end):")
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
    guard let emulated = runtime.emulators?.pca9685, let port = runtime.tcpPort else { return }
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
}

let arguments = CommandLine.arguments.dropFirst()
let frames = arguments.first.flatMap { Int($0) } ?? 10_000
print("blecontrol benchmarks (\(ProcessInfo.processInfo.activeProcessorCount) cores)\n")
benchmarkDecoder()
print("")
do {
    try benchmarkLatency(frames: frames)
    print("")
    try benchmarkWritesPerFlush()
} catch {
    print("benchmark failed: \(error)")
    exit(1)
}
