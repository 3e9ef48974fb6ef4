import BLEControlProtocol
import Board
import Control
import DeviceEmulators
import Testing
import TestSupport
@testable import Firmware
@testable import Runtime

/// Two PCA9685s on one emulated bus: channels on both, an ESC and a switch
/// on the second chip.
private let twoChips = """
name: two-chips
buses:
  main:
    emulated: true
servo:
  chips:
    - { address: 0x40 }
    - { address: 0x41 }
  channels:
    - { channel: 0, output: 0, role: servo }
    - { channel: 1, output: "1:0", role: servo, failsafe: pulse, failsafe_us: 1500 }
    - { channel: 17, output: "1:8", role: esc, failsafe: pulse, failsafe_us: 1000, failsafe_dwell_ms: 100 }
switches:
  - { switch: 0, output: "1:9", safe: off }
transports:
  tcp:
    enabled: true
    listen: 127.0.0.1:0
ble:
  enabled: false
"""

@Suite("Several PCA9685 chips", .serialized)
struct MultiChipTests {
    @Test("Channels on two chips: each chip gets its own writes, only when one of its channels changed; the failsafe, status and stop cover both")
    func twoChipBoard() throws {
        let board = try RunningBoard(yaml: twoChips)
        let chips = try #require(board.runtime.emulators?.pca9685)
        try #require(chips.count == 2)
        let (first, second) = (chips[0], chips[1])

        var central: LoopbackTCPClient? = try LoopbackTCPClient(port: board.port)
        var frames: [UInt8] = []
        for (channel, value) in [(UInt8(0), UInt16(200)), (1, 800), (17, 500)] {
            FrameEncoder.encode(.enable(channel: channel, on: true), into: &frames)
            FrameEncoder.encode(.servo(channel: channel, value: value), into: &frames)
        }
        FrameEncoder.encode(.switchValue(index: 0, on: true), into: &frames)
        try central?.send(frames)
        try board.settle(frames: 7)
        #expect(abs(first.output(channel: 0).pulseWidth.value - 1200) < 5)
        #expect(abs(second.output(channel: 0).pulseWidth.value - 1800) < 5)
        #expect(abs(second.output(channel: 8).pulseWidth.value - 1500) < 5)
        #expect(second.output(channel: 9).fullOn, "the switch on the second chip")
        #expect(first.output(channel: 8).duty == 0 && first.output(channel: 9).duty == 0, "the first chip's outputs 8 and 9 are not these")

        // A change on the second chip writes the second chip only.
        let (firstBefore, secondBefore) = (first.registerWriteCount, second.registerWriteCount)
        try central?.send(FrameEncoder.encode(.servo(channel: 1, value: 300)))
        try board.settle(frames: 8)
        #expect(abs(second.output(channel: 0).pulseWidth.value - 1300) < 5)
        #expect(first.registerWriteCount == firstBefore, "the first chip saw no write")
        #expect(second.registerWriteCount > secondBefore)

        let status = try board.runtime.status()
        #expect(status.channels.map(\.chip) == ["0", "1", "1"])

        // The last central leaves: each chip's channels go to their failsafe.
        central = nil  // closes the connection
        #expect(eventually { (try? board.servo().failsafe) != nil })
        #expect(eventually { abs(second.output(channel: 0).pulseWidth.value - 1500) < 5 }, "channel 1 to its preset on the second chip")
        #expect(eventually { second.output(channel: 8).duty == 0 }, "the ESC on the second chip stops after its dwell")
        let esc = second.history(channel: 8).map { Int($0.pulseWidth.value.rounded()) }
        #expect(esc.suffix(2).count == 2 && abs(esc.suffix(2).first! - 1000) < 5 && esc.last == 0, "the ESC: neutral, then off (\(esc))")
        #expect(eventually { second.output(channel: 9).duty == 0 }, "the switch to its safe state")
        #expect(abs(first.output(channel: 0).pulseWidth.value - 1200) < 5, "channel 0 holds on the first chip")

        // Stopping switches every output of both chips off.
        board.runtime.stop()
        #expect(first.outputs.allSatisfy { $0.duty == 0 } && second.outputs.allSatisfy { $0.duty == 0 })
    }
}
