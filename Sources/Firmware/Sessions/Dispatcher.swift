import BLEControlProtocol
import Logging

/// Turns decoded messages into device intents, with docs/protocol.md's rules:
/// a channel the board does not configure, or a line the display does not
/// have, is an error answered with ERROR(command). Runs on the event loop.
public final class Dispatcher: @unchecked Sendable {
    /// Board-wide counters for status.
    public struct Counters: Sendable, Equatable {
        public var frames = 0
        public var errors = 0
        public var discardedPartials = 0
    }

    /// An output a central can command: what the disconnect failsafe
    /// follows (docs/protocol.md, "Failsafe").
    public enum Output: Hashable, Sendable, Comparable, CustomStringConvertible {
        case channel(Int)
        case `switch`(Int)

        public var description: String {
            switch self {
            case .channel(let channel): "channel \(channel)"
            case .switch(let index): "switch \(index)"
            }
        }
    }

    private let servo: ServoPath?
    private let lcd: LCDService?
    private let switches: SwitchBank?
    private let logger: Logger
    public private(set) var counters = Counters()
    /// Which central's command each output obeys now: the session id of the
    /// central that sent its last accepted ANALOG_OUT_EN, SERVO_VAL, PWM_VAL
    /// or SWITCH_VAL. The control socket (an operator) leaves it as it is,
    /// so a central whose output the CLI touched still takes the failsafe
    /// with it when it leaves.
    public private(set) var commanders: [Output: Int] = [:]
    /// Output commands from centrals accepted since start: a frame that
    /// moved this is one that commanded an output (what ends a failsafe).
    public private(set) var centralCommands = 0
    /// Outputs whose commander became another central since
    /// ``clearNewlyTaken()``: what a central took over with its last write
    /// (usually none: the same central goes on commanding its own).
    public private(set) var newlyTaken: [Output] = []

    /// Starts a new ``newlyTaken`` (keeping its storage: no allocation per write).
    public func clearNewlyTaken() { newlyTaken.removeAll(keepingCapacity: true) }

    public init(servo: ServoPath?, lcd: LCDService?, switches: SwitchBank? = nil, logger: Logger) {
        self.servo = servo
        self.lcd = lcd
        self.switches = switches
        self.logger = logger
    }

    /// Applies one decoded event. Returns the ERROR reply to send, if any.
    ///
    /// - Parameter central: the session id of the central it came from (nil
    ///   for the control socket): an accepted output command makes that
    ///   central the output's commander.
    /// - Parameter over: a timed move for the servo and PWM values among
    ///   them (`blecontrol servo --over`), nil for the channel's own limits.
    public func handle(_ event: DecoderEvent, receivedAt: ContinuousClock.Instant, central: Int? = nil, over: Duration? = nil) -> Message? {
        switch event {
        case .message(let message):
            counters.frames += 1
            guard apply(message, receivedAt: receivedAt, over: over) else {
                counters.errors += 1
                return .error(command: message.command.rawValue)
            }
            if let central, let output = Self.output(of: message) {
                if commanders[output] != central { newlyTaken.append(output) }
                commanders[output] = central
                centralCommands += 1
            }
            return nil
        case .error(let error):
            if case .partialFrameDiscarded = error {
                counters.discardedPartials += 1
            } else {
                counters.errors += 1
            }
            return error.replyCommand.map { Message.error(command: $0) }
        case .provisional(let message):
            // Text shown while its frame's end is still open: applied, not
            // counted, never answered (the frame's message follows).
            _ = apply(message, receivedAt: receivedAt, over: over)
            return nil
        }
    }

    /// The outputs whose last command came from central `session`, in order.
    public func outputs(commandedBy session: Int) -> [Output] {
        commanders.compactMap { $0.value == session ? $0.key : nil }.sorted()
    }

    /// Whether central `session` commands any output now.
    public func commands(_ session: Int) -> Bool { commanders.values.contains(session) }

    /// `session` is gone: its outputs obey no one until the next command.
    /// Returns the outputs it commanded.
    @discardableResult
    public func relinquish(_ session: Int) -> [Output] {
        let outputs = outputs(commandedBy: session)
        forget(outputs)
        return outputs
    }

    /// Outputs a reload started over or removed obey no one.
    public func forget(_ outputs: [Output]) {
        for output in outputs { commanders[output] = nil }
    }

    /// The output a message commands, if it commands one. Text and INIT
    /// move nothing: a central that sends only those is an observer.
    static func output(of message: Message) -> Output? {
        switch message {
        case .enable(let channel, _), .servo(let channel, _), .pwm(let channel, _): .channel(Int(channel))
        case .switchValue(let index, _): .switch(Int(index))
        case .initialize, .lcdText, .lcdClear, .error: nil
        }
    }

    /// What had been dispatched to the display when a write began: with it,
    /// ``whenApplied(since:_:)`` waits for the display only if the write
    /// itself changed it.
    public struct Mark: Sendable {
        fileprivate let display: Int
    }

    /// LCD_TEXT and LCD_CLEAR accepted since start.
    private var displayChanges = 0

    /// The mark to take before dispatching a write's bytes.
    public var mark: Mark { Mark(display: displayChanges) }

    /// Calls `callback` once what a write commanded has reached the hardware
    /// (nil) or failed (the error): the acknowledgement of a write with
    /// response. The servo path is waited for always (it applies in order,
    /// within a PWM period); the display only when the write since `mark`
    /// put text on it, and then until its text is on the glass or replaced
    /// by newer text, not until the display is idle: another central
    /// rewriting the LCD cannot hold back a servo write's acknowledgement.
    public func whenApplied(since mark: Mark? = nil, _ callback: @escaping @Sendable (String?) -> Void) {
        let servo = self.servo
        let touchedDisplay = mark.map { $0.display != displayChanges } ?? true
        guard let lcd, touchedDisplay else {
            if let servo { servo.whenApplied(callback) } else { callback(nil) }
            return
        }
        lcd.whenApplied { lcdError in
            guard let servo else { return callback(lcdError) }
            servo.whenApplied { servoError in callback(lcdError ?? servoError) }
        }
    }

    /// Returns false when the message cannot be executed on this board.
    private func apply(_ message: Message, receivedAt: ContinuousClock.Instant, over: Duration?) -> Bool {
        switch message {
        case .initialize:
            // Outputs keep their values; the session resets its own state.
            return true
        case .enable(let channel, let on):
            return servo?.setEnabled(on, channel: Int(channel), receivedAt: receivedAt) ?? false
        case .servo(let channel, let value):
            return servo?.submit(.servo(value), channel: Int(channel), receivedAt: receivedAt, over: over) ?? false
        case .pwm(let channel, let value):
            return servo?.submit(.pwm(value), channel: Int(channel), receivedAt: receivedAt, over: over) ?? false
        case .lcdText(let line, let text):
            guard let lcd, Int(line) < lcd.rows else { return false }
            lcd.setLine(Int(line), text: text)
            displayChanges += 1
            return true
        case .lcdClear:
            guard let lcd else { return false }
            lcd.clear()
            displayChanges += 1
            return true
        case .switchValue(let index, let on):
            // An index the board does not configure: ERROR 06, the original
            // firmware's answer to every SWITCH_VAL.
            return switches?.set(Int(index), on: on) ?? false
        case .error:
            // ERROR flows board → central; a central sending it is confused.
            return false
        }
    }
}
