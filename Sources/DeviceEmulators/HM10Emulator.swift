#if canImport(Glibc)
import Glibc
#endif
import Reactor

/// An HM-10 BLE module as the board sees it on its UART: give it the master
/// side of a pseudo-terminal whose slave the board opens as its serial
/// device.
///
/// Not connected, the module answers AT commands (no line ending, one
/// command per write, as the HM-10 data sheet's command list has them): `AT`
/// → `OK`, `AT+NOTI1` → `OK+Set:1`, `AT+NAMExyz` → `OK+Set:xyz`. Connected,
/// it is a transparent pipe to the central: ``centralWrites(_:)`` is what a
/// central writes to FFE1, ``replies`` what the board sent back. With
/// notifications on (AT+NOTI1) it tells the board `OK+CONN` and `OK+LOST`.
/// A silent module (``answersAT`` false) answers nothing and never notifies.
/// With `baud`, bytes towards the board are paced at the line rate (10 bits
/// a byte), as a real UART would deliver them.
public final class HM10Emulator: @unchecked Sendable {
    private let fd: Int32
    private let baud: Int?
    /// Whether the module answers AT commands and notifies (a module that
    /// does not: another firmware, a wrong baud rate, a dead module).
    public let answersAT: Bool
    private let condition = Condition()
    private var connected = false
    private var notifications = false
    private var name = "HMSoft"
    private var commands: [String] = []
    private var fromBoard: [UInt8] = []
    private var stopping = false
    private var paused = false
    private let reader = OSThread(name: "hm10-emulator")

    public init(master fd: Int32, answersAT: Bool = true, baud: Int? = nil) {
        self.fd = fd
        self.answersAT = answersAT
        self.baud = baud
        reader.start { [self] in readLoop() }
    }

    /// Stops the reader (the descriptor is the caller's to close, after).
    public func stop() {
        condition.withLock { stopping = true }
        reader.join()
    }

    /// The AT commands received, in order.
    public var atCommands: [String] { condition.withLock { commands } }
    /// The module's name as AT+NAME set it.
    public var moduleName: String { condition.withLock { name } }
    /// Whether AT+NOTI1 turned connection notifications on.
    public var notificationsOn: Bool { condition.withLock { notifications } }

    /// Stops reading what the board sends (a UART whose far end is slower
    /// than the board's replies): they wait in the pseudo-terminal, then in
    /// the board.
    public func pauseReading() { condition.withLock { paused = true } }

    /// Reads what the board sends again.
    public func resumeReading() { condition.withLock { paused = false } }

    /// A central connects: the module says `OK+CONN` when notifications are on.
    public func connect() {
        let notify = condition.withLock { () -> Bool in
            connected = true
            return notifications && answersAT
        }
        if notify { deliver(Array("OK+CONN".utf8)) }
    }

    /// The central goes away: `OK+LOST` when notifications are on.
    public func lose() {
        let notify = condition.withLock { () -> Bool in
            connected = false
            return notifications && answersAT
        }
        if notify { deliver(Array("OK+LOST".utf8)) }
    }

    /// What a connected central writes to FFE1 reaches the board.
    public func centralWrites(_ bytes: [UInt8]) { deliver(bytes) }

    /// Waits until the board has sent at least `count` bytes to the central
    /// since the last ``takeReplies(count:timeout:)``, and returns them all;
    /// fewer if `timeout` (a bound on a broken test) passes first.
    public func takeReplies(count: Int, timeout: Duration = .seconds(20)) -> [UInt8] {
        let deadline = ContinuousClock.now + timeout
        return condition.withLock {
            while fromBoard.count < count {
                guard condition.wait(until: deadline) else { break }
            }
            defer { fromBoard.removeAll() }
            return fromBoard
        }
    }

    /// Waits until the board has sent an AT command containing `text`.
    public func waitForCommand(_ text: String, timeout: Duration = .seconds(20)) -> Bool {
        let deadline = ContinuousClock.now + timeout
        return condition.withLock {
            while !commands.contains(where: { $0.contains(text) }) {
                guard condition.wait(until: deadline) else { return commands.contains { $0.contains(text) } }
            }
            return true
        }
    }

    // MARK: The UART

    private func deliver(_ bytes: [UInt8]) {
        if let baud {
            // One byte per byte time: the line rate, not the pty's.
            let byteTime = 10_000_000_000 / Int64(max(baud, 1))
            var next = ContinuousClock.now
            for byte in bytes {
                writeAll([byte])
                next = next + .nanoseconds(byteTime)
                let wait = ContinuousClock.now.duration(to: next)
                if wait > .zero { sleepThread(wait) }
            }
        } else {
            writeAll(bytes)
        }
    }

    private func writeAll(_ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            if written < 0 {
                if errno == EINTR || errno == EAGAIN { continue }
                return
            }
            offset += written
        }
    }

    private func readLoop() {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while !condition.withLock({ stopping }) {
            if condition.withLock({ paused }) {
                sleepThread(.milliseconds(5))
                continue
            }
            // A short poll, so stop() is seen without a signal.
            var waiting = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&waiting, 1, 20) > 0 else { continue }
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                // No slave open (EIO) for a moment: try again shortly.
                sleepThread(.milliseconds(5))
                continue
            }
            if count == 0 { continue }
            received(Array(buffer[0..<count]))
        }
    }

    private func received(_ bytes: [UInt8]) {
        let reply: String? = condition.withLock {
            defer { condition.broadcast() }
            guard !connected else {
                fromBoard += bytes
                return nil
            }
            let text = String(decoding: bytes, as: UTF8.self)
            commands.append(text)
            guard answersAT else { return nil }
            // One command per write, as the board sends them.
            switch text {
            case "AT": return "OK"
            case "AT+NOTI1":
                notifications = true
                return "OK+Set:1"
            case "AT+NOTI0":
                notifications = false
                return "OK+Set:0"
            case let command where command.hasPrefix("AT+NAME") && command.count > 7:
                name = String(command.dropFirst(7))
                return "OK+Set:\(name)"
            default:
                // What an HM-10 does with a command it does not know: nothing.
                return nil
            }
        }
        if let reply { deliver(Array(reply.utf8)) }
    }
}
