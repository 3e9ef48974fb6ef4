// libFuzzer target: a central's byte stream through the session, the
// dispatcher, the servo path and the LCD service to the emulated chips of
// the simulator board (with an ESC on channel 4), on virtual time.
//
// The input is split into writes with gaps between them (derived from the
// input, so a crash reproduces from it alone); gaps longer than the idle
// timeout expire partial frames. After each input the session closes, the
// outputs settle, and the checks are what the board promises any central:
// every servo or ESC output is off or inside its channel's safe range,
// outputs without a channel stay off, the LCD shows exactly its geometry,
// and every reply is a well-formed ERROR frame.
import BLEControlProtocol
import Board
import DeviceEmulators
import Devices
import Firmware
import Hardware
import Logging
import Reactor
import Runtime
import FuzzSupport

@_cdecl("fuzz_session_main")
func fuzzMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>) -> CInt {
    runFuzzer(argc, argv, fuzzSession)
}

final class Replies: @unchecked Sendable {
    var bytes: [UInt8] = []
}

final class Rig: @unchecked Sendable {
    let configuration: BoardConfiguration
    let chip: PCA9685Emulator
    let display: LCDBackpackEmulator
    let servo: ServoPath
    let lcd: LCDService
    let dispatcher: Dispatcher
    let applied = Condition()

    init() throws {
        var logger = Logger(label: "fuzz")
        logger.logLevel = .critical
        let text = EmbeddedBoards.simulator.replacing(
            "- { channel: 4, output: 4, role: pwm }",
            with: "- { channel: 4, output: 4, role: esc, min_us: 1000, max_us: 2000, failsafe: pulse, failsafe_us: 1000, failsafe_dwell_ms: 0 }")
        var configuration = try BoardFile.parse(text, path: "fuzz-board.yaml")
        precondition(configuration.servo?.channels.contains { $0.role == .esc } == true, "the ESC did not make it into the board")
        // No bus time and no flush budget: pacing is the engine's own
        // (virtual-time) tests' business, and here it would only slow the
        // fuzzer down.
        for name in configuration.buses.keys { configuration.buses[name]?.byteTime = .zero }
        configuration.servo?.maxFlushesPerPeriod = 0
        self.configuration = configuration
        // The daemon's own assembly: buses behind their arbiters, the chips
        // and the display emulated on them; the drivers' datasheet waits
        // skipped (virtual time only).
        let parts = try BoardAssembly(configuration: configuration, sleep: { _ in }, logger: logger)
        guard let chip = parts.emulators.pca9685.first, let display = parts.emulators.lcd, let servo = parts.servo, let lcd = parts.lcd
        else { fatalError("the simulator board lost its chips") }
        (self.chip, self.display, self.servo, self.lcd) = (chip, display, servo, lcd)
        dispatcher = parts.dispatcher(logger: logger)
        servo.start()
        lcd.start()
    }

    /// Blocks until everything dispatched so far reached the chips.
    func settle() {
        let done = Promise<String?>()
        dispatcher.whenApplied { done.fulfil($0) }
        _ = done.wait()
    }

    func check(replies: [UInt8]) {
        let channels = configuration.servo?.channels ?? []
        for output in 0..<PCA9685Emulator.channelCount {
            let state = chip.output(channel: output)
            guard let channel = channels.first(where: { $0.output == output }) else {
                precondition(state.duty == 0, "output \(output) has no channel but runs at duty \(state.duty)")
                continue
            }
            guard channel.role != .pwm, state.duty > 0 else { continue }
            // One PCA9685 tick at 50 Hz is 4.9 µs (datasheet §7.3.3).
            let pulse = state.pulseWidth.value
            precondition(pulse >= channel.minimum.value - 5 && pulse <= channel.maximum.value + 5,
                         "channel \(channel.channel) (\(channel.role)) pulses \(pulse) µs outside \(channel.minimum)–\(channel.maximum)")
        }
        let lines = display.lcd.lines
        precondition(lines.count == 2 && lines.allSatisfy { $0.count == 16 }, "the LCD shows \(lines)")
        var decoder = FrameDecoder()
        decoder.decode(replies, at: .now) { event in
            guard case .message(.error) = event else { preconditionFailure("reply \(event) is not an ERROR frame") }
        }
        precondition(!decoder.hasPartialFrame, "a reply frame was cut short: \(replies)")
    }
}

let rig: Rig = {
    do { return try Rig() } catch { fatalError("fuzz rig: \(error)") }
}()

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzSession(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    // A fresh virtual clock from now for every input: instants stay close to
    // the servo thread's real clock, as they are in the daemon.
    let loop = ManualLoop()
    let hub = SessionHub(loop: loop, dispatcher: rig.dispatcher, idleTimeout: .milliseconds(500), logger: Logger(label: "fuzz", factory: { _ in SwiftLogNoOpLogHandler() }))
    let replies = Replies()
    let session = hub.open(transport: .tcp, peer: "fuzz", send: { replies.bytes += $0 })
    // The first byte chooses how writes are cut and spaced; the rest is the stream.
    let plan = bytes.first ?? 0
    var index = bytes.isEmpty ? 0 : 1
    var step = UInt32(plan) | 1
    while index < bytes.count {
        step = step &* 1_103_515_245 &+ 12345
        let length = min(bytes.count - index, Int(step >> 28) + 1)
        hub.receive(bytes[index..<index + length], for: session)
        index += length
        // Mostly back to back; now and then a pause past the idle timeout.
        let gap: Duration = (step >> 8) & 7 == 0 ? .milliseconds(600) : .milliseconds(Int64((step >> 12) & 15))
        loop.advance(by: gap)
    }
    loop.advance(by: .seconds(1))
    hub.close(session)
    rig.settle()
    rig.check(replies: replies.bytes)
    return 0
}
