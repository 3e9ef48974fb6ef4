#if canImport(Glibc)
import Glibc
#endif
import Reactor
import Testing
import TestSupport

/// What the failsafe's stall watch asks the kernel: a thread asleep in a
/// system call (as one blocked in a hung I2C transfer is) adds nothing to
/// its runnable time, a thread that computes or waits for a CPU does.
@Suite("Threads: the kernel's count of a thread's runnable time")
struct ThreadTimeTests {
    /// Field 3 of /proc/self/task/ID/stat: "R" running or runnable, "S" asleep…
    static func state(_ id: Int32) -> Character? {
        guard let stat = ProcessView.read("/proc/self/task/\(id)/stat"), let close = stat.lastIndex(of: ")") else { return nil }
        return stat[stat.index(after: close)...].split(separator: " ").first?.first
    }

    @Test("A thread asleep in read(2) stands still while a spinning one's runnable time grows")
    func asleepAndSpinning() throws {
        var fds: [Int32] = [0, 0]
        try #require(pipe(&fds) == 0)
        defer { close(fds[0]) }
        let sleeperID = Promise<Int32>()
        let sleeper = OSThread(name: "time-sleeper", stackSize: 128 * 1024)
        let readEnd = fds[0]
        sleeper.start {
            sleeperID.fulfil(ThreadTime.currentID())
            var byte: UInt8 = 0
            _ = read(readEnd, &byte, 1)
        }
        let spinnerID = Promise<Int32>()
        let stop = LockedBox(false)
        let spinner = OSThread(name: "time-spinner", stackSize: 128 * 1024)
        spinner.start {
            spinnerID.fulfil(ThreadTime.currentID())
            while !stop.value {}
        }
        let asleep = sleeperID.wait(), spinning = spinnerID.wait()
        #expect(ThreadTime.currentID() != asleep)
        // Until the sleeper is in read(2) (bounded: it has nothing else to do).
        var tries = 0
        while Self.state(asleep) != "S", tries < 10_000 {
            usleep(1000)
            tries += 1
        }
        try #require(Self.state(asleep) == "S")
        let asleepBefore = try #require(ThreadTime.runnable(thread: asleep))
        let spinningBefore = try #require(ThreadTime.runnable(thread: spinning))
        // Until the spinner has been runnable 20 ms more (bounded by tries).
        var spinningAfter = spinningBefore
        tries = 0
        while spinningAfter - spinningBefore < .milliseconds(20), tries < 10_000 {
            usleep(1000)
            spinningAfter = ThreadTime.runnable(thread: spinning) ?? spinningAfter
            tries += 1
        }
        let asleepAfter = try #require(ThreadTime.runnable(thread: asleep))
        let stillAsleep = Self.state(asleep)
        stop.value = true
        spinner.join()
        close(fds[1])
        sleeper.join()
        #expect(spinningAfter - spinningBefore >= .milliseconds(20), "the spinner: \(spinningBefore) then \(spinningAfter)")
        #expect(stillAsleep == "S")
        #expect(asleepAfter == asleepBefore, "the sleeper: \(asleepBefore) then \(asleepAfter)")
        // Joined is not yet gone: the join returns when the kernel clears
        // the thread's id, before its task is released (under qemu-user,
        // well before: seen in the aarch64 tier).
        #expect(eventually { ThreadTime.runnable(thread: asleep) == nil }, "a thread that ended has no count")
    }
}
