import BLEControlProtocol
import Control
import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

// How long a servo write with response waits for its answer while another
// central rewrites the LCD without pause (issue 36, item 7): control-socket
// sends (what `blecontrol servo` does; a BLE write with response is answered
// the same way), on the simulator board, whose emulated bus runs at 100 kHz
// like a real one. The same figures without the flood, and for a baseline
// daemon when one is given: ratios measured side by side in one run.

func benchmarkAcknowledgement(binary: String, baseline: String?, samples: Int) throws {
    print("ack: a control-socket servo write's answer, \(samples) writes per case (the simulator board, its bus at 100 kHz):")
    for (label, daemonBinary) in [("this daemon", binary)] + (baseline.map { [("baseline", $0)] } ?? []) {
        for flood in [false, true] {
            let daemon = try DaemonProcess(binary: daemonBinary, logLevel: "error")
            defer { daemon.stop() }
            let stop = LockedBox(false)
            var flooder: Thread?
            if flood {
                let central = try LoopbackTCPClient(port: daemon.port)
                try central.send(FrameEncoder.encode(.initialize))
                let box = CentralBox(central: central)
                let thread = Thread {
                    let central = box.central
                    var count = 0
                    while !stop.value {
                        count += 1
                        // A new text every time: the display never idles.
                        _ = try? central.send(FrameEncoder.encode(.lcdText(line: 1, text: Array("flood \(count)".utf8))))
                    }
                }
                thread.start()
                flooder = thread
            }
            let client = try ControlClient(path: daemon.socket, timeout: .seconds(10))
            _ = try client.send(FrameEncoder.encode(.enable(channel: 0, on: true)))
            var times: [Double] = []
            var unanswered = 0
            for index in 0..<samples {
                let start = ContinuousClock.now
                do {
                    _ = try client.send(FrameEncoder.encode(.servo(channel: 0, value: UInt16(200 + index % 600))))
                    times.append((ContinuousClock.now - start).inSeconds * 1000)
                } catch {
                    unanswered += 1
                }
            }
            stop.value = true
            while flooder?.isFinished == false { usleep(1000) }
            let sorted = times.sorted()
            let line = sorted.isEmpty ? "no answer" :
                "p50 \(format(percentile(sorted, 0.5), 2)) ms, p99 \(format(percentile(sorted, 0.99), 2)) ms, max \(format(sorted.last ?? 0, 2)) ms"
            print("  \(label.padding(toLength: 12, withPad: " ", startingAt: 0)) \(flood ? "LCD flooded" : "LCD idle   "): \(line)"
                  + (unanswered > 0 ? ", \(unanswered) not answered within 10 s" : ""))
        }
    }
}

/// The flooding central, handed to its thread whole (used there alone).
private struct CentralBox: @unchecked Sendable { let central: LoopbackTCPClient }
