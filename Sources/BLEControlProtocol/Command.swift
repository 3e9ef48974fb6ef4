/// The command byte that opens every BLEControl frame (docs/protocol.md, "Frame").
///
/// Codes 0…6 and 255 are fixed by the original iOS library (6, SWITCH_VAL,
/// was sent by the library but never implemented by the STM32 firmware);
/// codes 7…254 are reserved for documented extensions.
public enum Command: UInt8, Sendable, CaseIterable {
    /// INIT: reset the session. Length 0.
    case initialize = 0
    /// ANALOG_OUT_EN: start or stop a channel's output. Length 2.
    case analogOutputEnable = 1
    /// SERVO_VAL: servo / ESC pulse width offset in µs. Length 3.
    case servoValue = 2
    /// PWM_VAL: duty cycle in tenths of a percent. Length 3.
    case pwmValue = 3
    /// LCD_TEXT: replace one display line. Length ≥ 2 (line, text, 0x00).
    case lcdText = 4
    /// LCD_CLEAR: blank the display. Length 0.
    case lcdClear = 5
    /// SWITCH_VAL: a digital output on or off. Length 2.
    case switchValue = 6
    /// ERROR: board → central notification naming the command that failed. Length 1.
    case error = 255

    /// The declared lengths a frame of this command may carry.
    ///
    /// LCD_TEXT needs at least the line byte and the 0x00 terminator; its upper
    /// bound is simply what the length byte can express.
    public var validLengths: ClosedRange<UInt8> {
        switch self {
        case .initialize, .lcdClear: return 0...0
        case .analogOutputEnable, .switchValue: return 2...2
        case .servoValue, .pwmValue: return 3...3
        case .lcdText: return 2...UInt8.max
        case .error: return 1...1
        }
    }
}
