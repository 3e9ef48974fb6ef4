import CReactor
import Hardware
import Reactor
import Synchronization
import Testing
import TestSupport
@testable import Firmware
@testable import Runtime

#if canImport(Glibc)
import Glibc
#endif

/// What the threads of the inversion test tell each other. Atomics only:
/// no lock of its own may stand in for the one under test.
private final class Flags: Sendable {
    /// The display side is inside its bus transaction.
    let displayInside = Atomic(false)
    /// The servo side is about to ask for the bus.
    let servoAsking = Atomic(false)
    /// The servo side has the bus.
    let servoHasBus = Atomic(false)
    /// The hog saw the servo side get the bus while it was still hogging.
    let servoWonWhileHogging = Atomic(false)
}

/// A bus whose display transactions keep the CPU busy until the servo side
/// is waiting for the bus, and then a little longer: the holder must run to
/// let go, so who gets the CPU decides how long the servo side waits.
private final class BusyDisplayBus: I2CBus, @unchecked Sendable {
    let flags: Flags
    init(flags: Flags) { self.flags = flags }

    func transfer(_ messages: [I2CMessage], at address: I2CAddress) throws -> [[UInt8]] {
        guard address.rawValue == 0x27 else { return [] }
        flags.displayInside.store(true, ordering: .sequentiallyConsistent)
        while !flags.servoAsking.load(ordering: .sequentiallyConsistent) { spin(1000) }
        spin(2_000_000)  // the rest of the chunk: a few milliseconds of CPU
        return []
    }
}

@inline(never)
private func spin(_ iterations: Int) {
    var value = 0
    for index in 0..<iterations { value &+= index; if value == -1 { print(value) } }
}

private func setFIFO(_ priority: Int32) -> Bool {
    var parameters = sched_param()
    parameters.sched_priority = priority
    return pthread_setschedparam(pthread_self(), SCHED_FIFO, &parameters) == 0
}

/// Whether this process may use SCHED_FIFO (root, CAP_SYS_NICE or an rtprio
/// limit, and a cgroup that grants real-time time).
private func realtimeAllowed() -> Bool {
    let result = Promise<Bool>()
    let probe = OSThread(name: "rt-probe")
    probe.start { result.fulfil(setFIFO(1)) }
    probe.join()
    return result.wait()
}

@Suite("The shared bus under priority inversion")
struct PriorityInversionTests {
    /// The classic inversion on one CPU: the display thread (lowest
    /// real-time priority, as a preempted SCHED_OTHER thread would be) holds
    /// the bus; a middle-priority hog takes the CPU; the servo thread
    /// (highest) asks for the bus. With a plain mutex the holder never runs
    /// until the hog gives up, and the servo thread waits that long; with
    /// priority inheritance the holder runs at the servo thread's priority,
    /// finishes its chunk, and the servo thread gets the bus while the hog
    /// is still hogging. The assertion is that order, not a duration: the
    /// hog's bound (a count of spins, fifty times the holder's whole chunk,
    /// however fast or busy the machine) only ends the test if inheritance
    /// is broken.
    @Test("A preempted display holder lets go of the bus to a waiting SCHED_FIFO servo thread (priority inheritance)",
          .enabled(if: realtimeAllowed(), "needs SCHED_FIFO: root or CAP_SYS_NICE, and real-time time in this cgroup"))
    func inheritance() throws {
        let flags = Flags()
        let arbiter = BusArbiter(bus: BusyDisplayBus(flags: flags))
        let display = arbiter.client(.display)
        let servo = arbiter.client(.servo)
        let pinned = Promise<Bool>()

        let orchestrator = OSThread(name: "pi-orchestrator")
        orchestrator.start {
            // Highest of all, so it can start the others in the order it
            // wants; they inherit its CPU and lower their own priority.
            guard creactor_pin_to_current_cpu() == 0, setFIFO(99) else { return pinned.fulfil(false) }
            let holder = OSThread(name: "pi-display")
            holder.start {
                _ = setFIFO(10)
                try? display.write([0x00], to: I2CAddress(0x27)!)
            }
            guard eventually({ flags.displayInside.load(ordering: .sequentiallyConsistent) }) else {
                flags.servoAsking.store(true, ordering: .sequentiallyConsistent)  // lets a holder that got in late go
                holder.join()
                return pinned.fulfil(false)
            }

            let hog = OSThread(name: "pi-hog")
            hog.start {
                _ = setFIFO(50)
                // A bound on a broken test, not a measurement.
                for _ in 0..<100_000 {
                    if flags.servoHasBus.load(ordering: .sequentiallyConsistent) {
                        flags.servoWonWhileHogging.store(true, ordering: .sequentiallyConsistent)
                        return
                    }
                    spin(1000)
                }
            }
            let servoThread = OSThread(name: "pi-servo")
            servoThread.start {
                _ = setFIFO(90)
                flags.servoAsking.store(true, ordering: .sequentiallyConsistent)
                try? servo.write([0x00], to: I2CAddress(0x40)!)
                flags.servoHasBus.store(true, ordering: .sequentiallyConsistent)
            }
            servoThread.join()
            hog.join()
            holder.join()
            pinned.fulfil(true)
        }
        orchestrator.join()
        try #require(pinned.wait(), "could not pin the test's threads to one CPU at SCHED_FIFO")
        let servoHadBus = flags.servoHasBus.load(ordering: .sequentiallyConsistent)
        let wonWhileHogging = flags.servoWonWhileHogging.load(ordering: .sequentiallyConsistent)
        #expect(servoHadBus)
        #expect(wonWhileHogging, "the servo thread got the bus only after the hog let the display thread run: priority inversion")
    }
}
