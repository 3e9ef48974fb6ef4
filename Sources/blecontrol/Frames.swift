import Arguments
import BLEControlProtocol
import Control

/// The command-line command (BLEControlProtocol has a `Command` too: the
/// protocol's command byte).
typealias CLICommand = Arguments.Command

/// Frames a command sends, and how the original app writes them over BLE:
/// servo, PWM and switch values without response (a slider's stream),
/// everything else with response.
struct Outgoing {
    var bytes: [UInt8]
    var withResponse: Bool
}

/// The frame-sending commands, one place for the command line and for the
/// lines of `blecontrol session`.
enum FrameCommands {
    /// The commands that send frames, in the order `--help` lists them.
    static let names = ["servo", "pwm", "enable", "switch", "lcd", "clear", "init", "send"]

    /// The frames for command `name` with `words` (its arguments; for
    /// `lcd`, the text is everything after the line number).
    ///
    /// `raw`: SERVO_VAL and PWM_VAL take any 16-bit value (the original
    /// app's full range, negatives as its Int16); without it, only the
    /// protocol's 0…1000.
    static func outgoing(_ name: String, _ words: [String], raw: Bool = false) throws -> Outgoing {
        func argument(_ index: Int, _ what: String) throws -> String {
            guard index < words.count else { throw UsageError("\(name): missing <\(what)>") }
            return words[index]
        }
        func expectCount(_ count: Int) throws {
            if words.count > count { throw UsageError("\(name): unexpected \(words[count...].joined(separator: " "))") }
        }
        switch name {
        case "servo", "pwm":
            try expectCount(2)
            let channel = try number(try argument(0, "channel"), "channel", UInt8.self)
            let value = try wireValue(try argument(1, "value"), command: name, channel: channel, raw: raw)
            let message: Message = name == "servo" ? .servo(channel: channel, value: value) : .pwm(channel: channel, value: value)
            return Outgoing(bytes: FrameEncoder.encode(message), withResponse: false)
        case "enable":
            try expectCount(2)
            let channel = try number(try argument(0, "channel"), "channel", UInt8.self)
            return Outgoing(bytes: FrameEncoder.encode(.enable(channel: channel, on: try onOff(try argument(1, "state"), "state"))), withResponse: true)
        case "switch":
            try expectCount(2)
            let index = try number(try argument(0, "switch"), "switch", UInt8.self)
            return Outgoing(bytes: FrameEncoder.encode(.switchValue(index: index, on: try onOff(try argument(1, "state"), "state"))), withResponse: false)
        case "lcd":
            let line = try number(try argument(0, "line"), "line", UInt8.self)
            let text = words.dropFirst().joined(separator: " ")
            guard text.utf8.count <= Message.maximumTextLength else {
                throw UsageError("the text is \(text.utf8.count) bytes; a frame carries at most \(Message.maximumTextLength)")
            }
            return Outgoing(bytes: FrameEncoder.encode(.lcdText(line: line, text: Array(text.utf8))), withResponse: true)
        case "clear":
            try expectCount(0)
            return Outgoing(bytes: FrameEncoder.encode(.lcdClear), withResponse: true)
        case "init":
            try expectCount(0)
            return Outgoing(bytes: FrameEncoder.encode(.initialize), withResponse: true)
        case "send":
            let text = words.joined(separator: " ")
            guard !words.isEmpty, let bytes = ControlProtocol.bytes(fromHex: text), !bytes.isEmpty else {
                throw UsageError("not hex bytes: \(text)")
            }
            var decoder = FrameDecoder(configuration: .init(idleTimeout: nil))
            decoder.decode(bytes, at: .now) { _ in }
            if decoder.hasPartialFrame {
                let pending = decoder.bufferedByteCount
                throw ExitFailure("the last \(pending) byte\(pending == 1 ? "" : "s") (\(ControlProtocol.hex(bytes.suffix(pending)))) are an incomplete frame; nothing was sent")
            }
            return Outgoing(bytes: bytes, withResponse: true)
        default:
            throw UsageError("unknown command \(name) (one of: \(names.joined(separator: ", ")), sync, wait MS)")
        }
    }

    /// Prints every frame in `replies` as the board's answer; true when one
    /// was an ERROR.
    /// `explain`: the reason for an ERROR, when it can be told.
    @discardableResult
    static func report(replies: [UInt8], explain: (UInt8) -> String? = { _ in nil }) -> Bool {
        var decoder = FrameDecoder(configuration: .init(idleTimeout: nil))
        var refused = false
        decoder.decode(replies, at: .now) { event in
            switch event {
            case .message(.error(let command)):
                refused = true
                let why = explain(command).map { ": \($0)" } ?? ""
                print("board replied ERROR for command \(command) (\(ControlProtocol.hex(FrameEncoder.encode(.error(command: command)))))\(why)")
            case .message(let message):
                print("board sent \(message)")
            case .error(let error):
                print("board sent an undecodable reply: \(error)")
            case .provisional:
                break
            }
        }
        return refused
    }
}

func number<T: FixedWidthInteger>(_ text: String, _ name: String, _ type: T.Type) throws -> T {
    guard let value = T(text) else { throw UsageError("<\(name)> must be a whole number \(T.min)…\(T.max), got \(text)") }
    return value
}

/// on/off, 1/0, true/false, yes/no.
func onOff(_ text: String, _ name: String) throws -> Bool {
    switch text.lowercased() {
    case "on", "1", "true", "yes": return true
    case "off", "0", "false", "no": return false
    default: throw UsageError("<\(name)> must be on or off (or 1/0, true/false), got \(text)")
    }
}

/// A PWM or servo value: the protocol's 0…1000, which is what the user
/// means; with `raw`, 0…65535 or a negative Int16 sent as the original app
/// does (two's complement: -500 is FE 0C). A value in the wrong unit
/// (`servo 0 1500`, thinking in µs) would drive full travel: it is refused
/// with the range and the unit.
func wireValue(_ text: String, command: String = "servo", channel: UInt8 = 0, raw: Bool = false) throws -> UInt16 {
    if raw {
        if let value = UInt16(text) { return value }
        if let negative = Int16(text) { return UInt16(bitPattern: negative) }
        throw UsageError("<value> with --raw must be -32768…65535, got \(text)")
    }
    if let value = UInt16(text), value <= 1000 { return value }
    let unit = command == "servo"
        ? "0…1000 (1000…2000 µs, a servo's travel; 500 is the centre, 1500 µs)"
        : "0…1000 (the duty in per mille; 500 is 50 %)"
    var hint = ""
    if command == "servo", let micros = Int(text), (500...2500).contains(micros) {
        hint = "; for \(micros) µs: `blecontrol servo \(channel) \(max(0, min(1000, micros - 1000)))`"
    }
    throw UsageError("<value> for \(command) must be \(unit), got \(text)\(hint); --raw sends any 16-bit value, as the original app could")
}

/// --over for `servo`, `pwm`, `pulse` and `send`: a timed move.
let overOption = CLICommand.Option("over", value: "TIME", help: "Move there in TIME (1.5s, 800ms; a bare number is seconds), from where the pulse is now: every value of the command arrives together. Never faster than the channel's speed_us_per_s. Through the control socket only.")

/// `--over`'s value: 1.5s, 800ms, or seconds.
func overDuration(_ arguments: Parsed) throws -> Duration? {
    guard let text = arguments.option("over") else { return nil }
    if arguments.option("ble") != nil || arguments.option("mqtt") != nil {
        throw UsageError("--over needs the board's control socket (a BLEControl frame carries no time): run it on the board")
    }
    var number = text
    var scale = 1000.0
    if number.hasSuffix("ms") {
        number.removeLast(2)
        scale = 1
    } else if number.hasSuffix("s") {
        number.removeLast()
    }
    guard let value = Double(number), value.isFinite, value * scale >= 1, value * scale <= 600_000 else {
        throw UsageError("--over must be a time from 1ms to 600s (such as 1.5s or 800ms), got \(text)")
    }
    return .milliseconds(Int((value * scale).rounded()))
}

/// --raw for `servo` and `pwm`.
let rawFlag = CLICommand.Flag("raw", help: "Send VALUE as the original app could: any 16-bit value, negatives as its Int16 (without it, only 0…1000).")

extension FrameCommands {
    /// Why the board answered ERROR for `command` after the frames of
    /// `name` with `words`, from its status: the reason in the user's terms
    /// (nil when the status does not say).
    static func reason(forError command: UInt8, name: String, words: [String], status: StatusReport) -> String? {
        let first = words.first.flatMap { Int($0) }
        switch command {
        case 1, 2, 3:
            let channels = status.channels.map(\.channel).sorted()
            guard let channel = first, !channels.contains(channel) else { return nil }
            return "channel \(channel) is not on board \(status.board.printable) (channels \(ranges(channels)))"
        case 4:
            guard let line = first, let rows = status.lcd?.rows, line >= rows else {
                return status.lcd == nil ? "board \(status.board.printable) has no LCD" : nil
            }
            return "line \(line) is not on board \(status.board.printable)'s \(rows)-line LCD (lines 0-\(rows - 1))"
        case 5:
            return status.lcd == nil ? "board \(status.board.printable) has no LCD" : nil
        case 6:
            let switches = status.switches.map(\.switch).sorted()
            guard let index = first, !switches.contains(index) else { return nil }
            return switches.isEmpty ? "board \(status.board.printable) has no switches"
                : "switch \(index) is not on board \(status.board.printable) (switches \(ranges(switches)))"
        default:
            return nil
        }
    }

    /// "0-7", "0-3, 8, 10-11".
    static func ranges(_ numbers: [Int]) -> String {
        var parts: [String] = []
        var index = 0
        while index < numbers.count {
            var end = index
            while end + 1 < numbers.count, numbers[end + 1] == numbers[end] + 1 { end += 1 }
            parts.append(end == index ? "\(numbers[index])" : "\(numbers[index])-\(numbers[end])")
            index = end + 1
        }
        return parts.isEmpty ? "none" : parts.joined(separator: ", ")
    }
}
