/// A BLEControl frame as a typed value (docs/protocol.md, "Frame").
///
/// Values are carried exactly as they travel on the wire; clamping (servo safe
/// range, PWM above 1000, channels the board lacks) is the firmware's job.
public enum Message: Equatable, Hashable, Sendable {
    /// INIT: reset the session.
    case initialize
    /// ANALOG_OUT_EN: start (`on`) or stop a channel's output.
    case enable(channel: UInt8, on: Bool)
    /// SERVO_VAL: pulse width = 1000 µs + `value` µs.
    case servo(channel: UInt8, value: UInt16)
    /// PWM_VAL: duty cycle = `value` / 1000 of the period.
    case pwm(channel: UInt8, value: UInt16)
    /// LCD_TEXT: replace display line `line` (0-based) with `text`, given as the
    /// raw bytes *without* the 0x00 terminator.
    case lcdText(line: UInt8, text: [UInt8])
    /// LCD_CLEAR: blank the display and home the cursor.
    case lcdClear
    /// SWITCH_VAL: switch `index` on or off (the library sends 0 or 1; any
    /// non-zero byte counts as on).
    case switchValue(index: UInt8, on: Bool)
    /// ERROR (board → central): the board could not execute a frame of `command`.
    case error(command: UInt8)

    /// The longest LCD text a frame can carry: the length byte counts the line
    /// byte and the terminator too.
    public static let maximumTextLength = Int(UInt8.max) - 2

    /// The command code this message is sent with.
    public var command: Command {
        switch self {
        case .initialize: return .initialize
        case .enable: return .analogOutputEnable
        case .servo: return .servoValue
        case .pwm: return .pwmValue
        case .lcdText: return .lcdText
        case .lcdClear: return .lcdClear
        case .switchValue: return .switchValue
        case .error: return .error
        }
    }
}
