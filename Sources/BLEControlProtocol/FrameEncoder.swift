/// Builds wire frames from ``Message`` values (docs/protocol.md, "Frame").
///
/// Unlike the original iOS library, the LCD_TEXT length is the UTF-8 byte count
/// plus 2, so the frames never depend on the decoder's LCD_TEXT quirk handling.
public enum FrameEncoder {
    /// The exact wire bytes of `message`.
    ///
    /// LCD text is cut at its first 0x00 byte (a receiver ends the text there
    /// anyway) and to ``Message/maximumTextLength`` bytes (all a length byte can
    /// carry), so every message encodes to a frame that decodes cleanly.
    public static func encode(_ message: Message) -> [UInt8] {
        var bytes: [UInt8] = []
        encode(message, into: &bytes)
        return bytes
    }

    /// Appends the wire bytes of `message` to `buffer`, reusing its capacity
    /// (for hot paths that send many frames).
    public static func encode(_ message: Message, into buffer: inout [UInt8]) {
        switch message {
        case .initialize:
            buffer.append(Command.initialize.rawValue)
            buffer.append(0)
        case .enable(let channel, let on):
            buffer.append(Command.analogOutputEnable.rawValue)
            buffer.append(2)
            buffer.append(channel)
            buffer.append(on ? 1 : 0)
        case .servo(let channel, let value):
            appendChannelValue(.servoValue, channel, value, to: &buffer)
        case .pwm(let channel, let value):
            appendChannelValue(.pwmValue, channel, value, to: &buffer)
        case .lcdText(let line, let text):
            let terminated = text.firstIndex(of: 0) ?? text.endIndex
            let end = min(terminated, text.startIndex + Message.maximumTextLength)
            buffer.append(Command.lcdText.rawValue)
            // `end` ≤ 253, so the length fits a byte.
            buffer.append(UInt8(truncatingIfNeeded: end - text.startIndex + 2))
            buffer.append(line)
            buffer.append(contentsOf: text[..<end])
            buffer.append(0)
        case .lcdClear:
            buffer.append(Command.lcdClear.rawValue)
            buffer.append(0)
        case .switchValue(let index, let on):
            buffer.append(Command.switchValue.rawValue)
            buffer.append(2)
            buffer.append(index)
            buffer.append(on ? 1 : 0)
        case .error(let command):
            buffer.append(Command.error.rawValue)
            buffer.append(1)
            buffer.append(command)
        }
    }

    /// SERVO_VAL and PWM_VAL share one layout: channel, then a big-endian u16.
    private static func appendChannelValue(
        _ command: Command, _ channel: UInt8, _ value: UInt16, to buffer: inout [UInt8]
    ) {
        buffer.append(command.rawValue)
        buffer.append(3)
        buffer.append(channel)
        buffer.append(UInt8(truncatingIfNeeded: value >> 8))
        buffer.append(UInt8(truncatingIfNeeded: value))
    }
}
