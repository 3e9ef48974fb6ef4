import BLEControlProtocol
import Board
import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

// The soak of issue #21: the daemon as a process, for as long as asked, under
// the mix a board lives with: a central streaming the original demo app's
// traffic at its rate (four servos swept by thumb, 20 updates a second, a
// switch and an LCD line now and then), the central leaving and coming back,
// and the board file replaced and reloaded (SIGHUP). Sampled every second:
// resident memory, descriptors, threads and the bytes the daemon logs. Prints
// the slopes (per hour) and what the log comes to in a year. The one check:
// at each quiet moment (no central, the reload applied) the daemon holds as
// many descriptors and threads as at the first one; a leak is a failure, the
// rest are figures. `scripts/test` runs two minutes of it; a day is
// `blecontrol-bench soak DAEMON 86400`.

/// One second's sample of the daemon.
struct SoakSample {
    var at: Double
    var rss: Int
    var descriptors: Int
    var threads: Int
    var logBytes: Int
}

/// Least-squares slope of `values` over `times`, per hour.
func slopePerHour(_ times: [Double], _ values: [Double]) -> Double {
    let n = Double(times.count)
    guard n > 1 else { return 0 }
    let meanT = times.reduce(0, +) / n, meanV = values.reduce(0, +) / n
    var covariance = 0.0, variance = 0.0
    for (t, v) in zip(times, values) {
        covariance += (t - meanT) * (v - meanV)
        variance += (t - meanT) * (t - meanT)
    }
    return variance > 0 ? covariance / variance * 3600 : 0
}

/// - Parameter speed: how many times faster than a board's life the events
///   come (the central's writes, its reconnections, the reloads): 3 runs
///   three hours of them in one. What depends on the clock alone (timers,
///   the journal's own pace) is not sped up.
func soakDaemon(binary: String, seconds: Double, speed: Double = 1) throws -> Bool {
    let reloadEvery = 20 / speed, reconnectEvery = 15 / speed
    let board = EmbeddedBoards.simulator
    let variants = [board, board.board(replacing: "max_flushes_per_period: 4", with: "max_flushes_per_period: 5")]
    let daemon = try DaemonProcess(binary: binary, boardText: board, logLevel: "info")
    let boardPath = daemon.directory + "/board.yaml"
    print("soak: \(binary), pid \(daemon.pid), \(Int(seconds)) s: a central at \(Int(20 * speed)) writes/s (the demo app's sliders\(speed == 1 ? "" : String(format: " at %g times their pace", speed))), reconnecting every \(String(format: "%g", reconnectEvery)) s; the board file replaced and reloaded every \(String(format: "%g", reloadEvery)) s")

    var samples: [SoakSample] = []
    var quiet: [(descriptors: Int, threads: Int)] = []
    let start = ContinuousClock.now
    func elapsed() -> Double {
        let (seconds, attoseconds) = (ContinuousClock.now - start).components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
    func sample() {
        let held = daemon.descriptorsAndThreads()
        samples.append(SoakSample(
            at: elapsed(), rss: daemon.memory().rss, descriptors: held.descriptors,
            threads: held.threads, logBytes: daemon.logBytes()
        ))
    }
    var reloads = 0, reconnects = 0
    var traffic = DemoAppTraffic()
    var nextReload = reloadEvery, nextReconnect = reconnectEvery, nextSample = 0.0
    // A long run says where it stands every ten minutes, so a run cut short
    // (a machine's session ending) still leaves its slopes behind.
    let reportEvery = 600.0
    var nextReport = reportEvery
    // One control connection for the whole run: a quiet moment's count of
    // descriptors then holds exactly it, never a status request's
    // connection the daemon has not closed yet.
    // Its first request at once: the daemon closes a control connection
    // that sends none within ControlServer.requestDeadline.
    let control = try ControlLine(path: daemon.socket)
    _ = try control.request(#"{"op":"status"}"#)
    var central: LoopbackTCPClient? = try LoopbackTCPClient(port: daemon.port)
    let enable = DemoAppTraffic.enable
    try central?.send(enable)
    while elapsed() < seconds {
        let now = elapsed()
        if now >= nextSample {
            sample()
            nextSample += 1
        }
        if now >= nextReport {
            nextReport += reportEvery
            let settled = samples.filter { $0.at >= min(seconds / 10, 3600) }
            let slope = slopePerHour(settled.map(\.at), settled.map { Double($0.rss) })
            let last = samples[samples.count - 1]
            print(String(format: "soak: at %5.0f s: resident %d kB, %d descriptors, %d threads, log %d B; resident slope since settling %+.1f kB/h",
                         now, last.rss, last.descriptors, last.threads, last.logBytes, slope))
            fflush(nil)
        }
        if now >= nextReconnect {
            // Quiet: the central gone, and the daemon has seen it go.
            central = nil
            reconnects += 1
            nextReconnect += reconnectEvery
            let deadline = ContinuousClock.now + .seconds(30)
            while ContinuousClock.now < deadline {
                let status = try control.request(#"{"op":"status"}"#)["status"] as? [String: Any]
                if ((status?["sessions"] as? [Any])?.count ?? 0) == 0 { break }
                usleep(10_000)
            }
            quiet.append(daemon.descriptorsAndThreads())
            central = try LoopbackTCPClient(port: daemon.port)
            try central?.send(enable)
        }
        if now >= nextReload {
            reloads += 1
            nextReload += reloadEvery
            let text = variants[reloads % 2]
            try text.write(toFile: boardPath + ".new", atomically: false, encoding: .utf8)
            rename(boardPath + ".new", boardPath)
            kill(daemon.pid, SIGHUP)
        }
        let bytes = traffic.next(at: now)
        do {
            try central?.send(bytes)
        } catch {
            // The daemon ended the session (it may, on some reloads): a
            // central reconnects.
            central = try LoopbackTCPClient(port: daemon.port)
            try central?.send(enable)
        }
        usleep(UInt32(Double(DemoAppTraffic.period) / speed))
    }
    let frames = traffic.frames
    central = nil
    sample()
    daemon.stop()

    // The first tenth is the daemon settling (allocator arenas, lazy state),
    // at most an hour.
    let settled = samples.filter { $0.at >= min(seconds / 10, 3600) }
    let times = settled.map(\.at)
    func slope(_ value: (SoakSample) -> Int) -> Double { slopePerHour(times, settled.map { Double(value($0)) }) }
    let first = settled.first ?? samples[0], last = samples[samples.count - 1]
    print("soak: \(frames) frames, \(reconnects) reconnections, \(reloads) reloads, \(samples.count) samples")
    print(String(format: "  resident memory  %6d kB -> %6d kB   slope %+.1f kB/h", first.rss, last.rss, slope(\.rss)))
    if seconds >= 7200 {
        // Issue #29: does memory still grow after the first hour?
        let later = samples.filter { $0.at >= 3600 }
        print(String(format: "  resident memory after the first hour: slope %+.1f kB/h over %.1f h",
                     slopePerHour(later.map(\.at), later.map { Double($0.rss) }), (later.last?.at ?? 0) / 3600 - 1))
    }
    print(String(format: "  descriptors      %6d    -> %6d      slope %+.2f /h", first.descriptors, last.descriptors, slope(\.descriptors)))
    print(String(format: "  threads          %6d    -> %6d      slope %+.2f /h", first.threads, last.threads, slope(\.threads)))
    let logPerHour = slope(\.logBytes)
    print(String(format: "  log              %6d B  -> %6d B    %.1f kB/h: %.1f MB a year at this rate (the image's journal keeps at most 64 MB)",
                 first.logBytes, last.logBytes, logPerHour / 1000, logPerHour * 24 * 365 / 1e6))
    // After the first quiet moment (the first reconnection, the first
    // reload seen), every quiet moment holds as much as that one.
    guard let baseline = quiet.dropFirst().first else {
        print("soak: too short for two quiet moments; nothing compared")
        return true
    }
    let worst = quiet.dropFirst().max { $0.descriptors + $0.threads < $1.descriptors + $1.threads } ?? baseline
    // A day holds thousands of quiet moments: their spread, not each one.
    func spread(_ values: [Int]) -> String {
        let (low, high) = (values.min() ?? 0, values.max() ?? 0)
        return low == high ? "\(low) at each" : "\(low) to \(high)"
    }
    print("  quiet moments: \(quiet.count); descriptors \(spread(quiet.map(\.descriptors))), threads \(spread(quiet.map(\.threads)))"
          + " (the baseline, the second: \(baseline.descriptors) and \(baseline.threads))")
    if worst.descriptors > baseline.descriptors || worst.threads > baseline.threads {
        print("soak: FAIL a leak: a quiet moment held \(worst.descriptors) descriptors and \(worst.threads) threads, the first \(baseline.descriptors) and \(baseline.threads)")
        return false
    }
    return true
}

/// The original demo app's traffic as a thumb makes it: 20 writes a second,
/// four servos swept together; now and then a switch and an LCD line.
struct DemoAppTraffic {
    /// Microseconds between writes.
    static let period: UInt32 = 50_000
    private(set) var frames = 0
    private var value = 0

    /// ANALOG_OUT_EN for the four servo channels, as the app sends on connect.
    static var enable: [UInt8] {
        var bytes: [UInt8] = []
        for channel in 0..<4 { FrameEncoder.encode(.enable(channel: UInt8(channel), on: true), into: &bytes) }
        return bytes
    }

    /// The next write, `now` seconds into the run.
    mutating func next(at now: Double) -> [UInt8] {
        var bytes: [UInt8] = []
        value = (value + 7) % 1001
        for channel in 0..<4 { FrameEncoder.encode(.servo(channel: UInt8(channel), value: UInt16((value + channel * 250) % 1001)), into: &bytes) }
        frames += 4
        if frames % 160 == 0 {
            FrameEncoder.encode(.switchValue(index: 0, on: frames % 320 == 0), into: &bytes)
            FrameEncoder.encode(.lcdText(line: 0, text: Array("t=\(Int(now)) s".utf8)), into: &bytes)
            frames += 2
        }
        return bytes
    }
}
