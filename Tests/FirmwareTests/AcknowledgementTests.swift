import BLEControlProtocol
import Foundation
import Testing
import TestSupport
@testable import Firmware
@testable import Runtime

/// A write with response is answered when what it commanded is applied,
/// and only that (issue 36, item 7): another central rewriting the display
/// without pause cannot hold back a servo write's answer, nor a text
/// write's once its own text is on the glass.
@Suite("Acknowledgements wait for what the write commanded")
struct AcknowledgementTests {
    /// Feeds `write` through a session while a second session rewrites line
    /// 1 without pause, on a thread of its own (the sessions and the
    /// dispatcher are used on that thread only, as on the event loop);
    /// whether the write was answered meanwhile (bounded as `eventually`
    /// is: before the fix the answer waited for a display that never
    /// stopped changing, and never came).
    private func acknowledgedDuringLCDFlood(_ write: [Message]) throws -> Bool {
        // A 100 kHz bus: a line takes the display milliseconds, and the
        // flood changes it faster than that.
        let board = try EmulatedBoard(byteTime: .microseconds(90))
        let answered = LockedBox<String??>(nil)
        let stop = LockedBox<Bool>(false)
        let flooding = Thread {
            let writer = board.session()
            let flooder = board.session()
            flooder.receive(FrameEncoder.encode(.enable(channel: 0, on: true)))
            var rewrites = 0
            func flood() {
                rewrites += 1
                flooder.receive(FrameEncoder.encode(.lcdText(line: 1, text: Array("flood \(rewrites)".utf8))))
            }
            for _ in 0..<20 { flood() }
            let mark = board.dispatcher.mark
            writer.receive(write.flatMap { FrameEncoder.encode($0) })
            board.dispatcher.whenApplied(since: mark) { error in answered.value = .some(error) }
            while !stop.value {
                flood()
                sched_yield()
            }
        }
        flooding.start()
        let ok = eventually { answered.value != nil }
        stop.value = true
        #expect(eventually { flooding.isFinished })
        return ok && answered.value == .some(nil)
    }

    @Test("A servo write is answered while another central floods the display")
    func servoWriteDuringFlood() throws {
        #expect(try acknowledgedDuringLCDFlood([.servo(channel: 0, value: 700)]), "never answered while the display kept changing")
    }

    @Test("A text write is answered once its text was on the glass, although newer text keeps coming")
    func textWriteDuringFlood() throws {
        #expect(try acknowledgedDuringLCDFlood([.lcdText(line: 0, text: Array("mine".utf8))]), "never answered while the display kept changing")
    }
}
