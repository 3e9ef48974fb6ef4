import DeviceEmulators
import Devices
import Foundation
import Hardware
import Logging
import Testing

/// Keeps log messages in memory.
private final class LogBox: @unchecked Sendable {
    private let lock = NSLock()
    private var entries: [(Logger.Level, String)] = []
    func append(_ level: Logger.Level, _ message: String) { lock.withLock { entries.append((level, message)) } }
    func messages(at level: Logger.Level) -> [String] { lock.withLock { entries.filter { $0.0 == level }.map(\.1) } }
}

private struct MemoryLogHandler: LogHandler {
    let box: LogBox
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }
    #if compiler(>=6.1)
    func log(event: LogEvent) { box.append(event.level, event.message.description) }
    #else
    func log(level: Logger.Level, message: Logger.Message, metadata: Logger.Metadata?, source: String, file: String, function: String, line: UInt) {
        box.append(level, message.description)
    }
    #endif
}

private func makeLED() -> (StatusLED, EmulatedDigitalOutput, LogBox) {
    let output = EmulatedDigitalOutput()
    let box = LogBox()
    let led = StatusLED(output: output, logger: Logger(label: "StatusLEDTests", factory: { _ in MemoryLogHandler(box: box) }))
    return (led, output, box)
}

private let t0 = ContinuousClock.now

private func at(_ milliseconds: Int) -> ContinuousClock.Instant {
    t0.advanced(by: .milliseconds(milliseconds))
}

@Suite("StatusLED")
struct StatusLEDTests {
    @Test("patterns have readable names")
    func names() {
        #expect(StatusLED.Pattern.allCases.map(\.description) == ["off", "on", "slow-blink", "fast-blink", "heartbeat"])
    }

    @Test("steady patterns set the line once and need no further calls")
    func steady() {
        let (led, output, _) = makeLED()
        led.pattern = .on
        #expect(led.update(at: at(0)) == nil)
        #expect(output.isActive)
        #expect(led.isLit)
        #expect(led.update(at: at(5000)) == nil)
        #expect(output.writeCount == 1)
        led.pattern = .off
        #expect(led.update(at: at(6000)) == nil)
        #expect(!output.isActive)
        #expect(!led.isLit)
        #expect(output.transitions == 2)
    }

    @Test("slow blink: 500 ms lit, 500 ms dark, starting lit")
    func slowBlink() {
        let (led, output, _) = makeLED()
        led.pattern = .slowBlink
        #expect(led.update(at: at(0)) == at(500))
        #expect(output.isActive)
        #expect(led.update(at: at(200)) == at(500))
        #expect(led.update(at: at(500)) == at(1000))
        #expect(!output.isActive)
        #expect(led.update(at: at(1000)) == at(1500))
        #expect(output.isActive)
        // A late call shows the level for its own instant.
        #expect(led.update(at: at(10_700)) == at(11_000))
        #expect(!output.isActive)
        #expect(output.transitions == 4)
    }

    @Test("fast blink: 100 ms each way")
    func fastBlink() {
        let (led, output, _) = makeLED()
        led.pattern = .fastBlink
        var levels: [Bool] = []
        for step in 0..<6 {
            let next = led.update(at: at(step * 100))
            #expect(next == at(step * 100 + 100))
            levels.append(output.isActive)
        }
        #expect(levels == [true, false, true, false, true, false])
    }

    @Test("heartbeat: two short flashes per second")
    func heartbeat() {
        let (led, output, _) = makeLED()
        led.pattern = .heartbeat
        let expected: [(Int, Bool, Int)] = [
            (0, true, 100), (100, false, 250), (250, true, 350), (350, false, 1000),
            (999, false, 1000), (1000, true, 1100), (1260, true, 1350),
        ]
        for (time, lit, next) in expected {
            #expect(led.update(at: at(time)) == at(next))
            #expect(output.isActive == lit)
        }
    }

    @Test("setting the same pattern keeps the phase; a new one restarts lit")
    func phase() {
        let (led, output, _) = makeLED()
        led.pattern = .slowBlink
        _ = led.update(at: at(0))
        led.pattern = .slowBlink
        _ = led.update(at: at(600))
        #expect(!output.isActive)
        led.pattern = .fastBlink
        #expect(led.update(at: at(650)) == at(750))
        #expect(output.isActive)
    }

    @Test("a failing output is logged once, retried, and never thrown")
    func failures() {
        let (led, output, log) = makeLED()
        output.failNextWrites(2)
        led.pattern = .on
        let retry = led.update(at: at(0))
        #expect(retry == at(0).advanced(by: StatusLED.retryInterval))
        #expect(!output.isActive)
        #expect(!led.isLit)
        _ = led.update(at: at(1000))
        #expect(!output.isActive)
        #expect(log.messages(at: .warning).count == 1)
        #expect(led.update(at: at(2000)) == nil)
        #expect(output.isActive)
        #expect(led.isLit)
        #expect(log.messages(at: .info).count == 1)
    }

    @Test("while blinking, a failed write is retried at the next change at the latest")
    func failureWhileBlinking() {
        let (led, output, _) = makeLED()
        output.failNextWrites(1)
        led.pattern = .fastBlink
        #expect(led.update(at: at(0)) == at(100))
        #expect(!output.isActive)
        _ = led.update(at: at(50))
        #expect(output.isActive)
    }
}
