/// Why a stretch of the byte stream did not yield a ``Message``.
///
/// These are values for the session to act on (reply, log, count); none of them
/// ends a session, and the decoder is already resynchronised when it reports one.
public enum ProtocolError: Error, Equatable, Hashable, Sendable {
    /// A frame with a command code the protocol does not define. Its declared
    /// data was skipped.
    case unknownCommand(UInt8)
    /// A known command whose declared length is not one it accepts
    /// (``Command/validLengths``). Its declared data was skipped.
    case badLength(command: UInt8, length: UInt8)
    /// A partial frame of `command` (`bytes` bytes buffered, command byte
    /// included) was dropped because it stayed idle past the timeout or the
    /// decoder was reset. After a timeout the sender gets ERROR for the
    /// command (its frame was not executed); after a disconnect nobody is
    /// there to tell.
    case partialFrameDiscarded(command: UInt8, bytes: Int)

    /// The command byte to put in the ERROR reply, or `nil` when no reply is due.
    public var replyCommand: UInt8? {
        switch self {
        case .unknownCommand(let command): return command
        case .badLength(let command, _): return command
        case .partialFrameDiscarded(let command, _): return command
        }
    }
}

extension ProtocolError: CustomStringConvertible {
    public var description: String {
        switch self {
        case .unknownCommand(let command):
            return "unknown command \(command)"
        case .badLength(let command, let length):
            return "command \(command) with invalid length \(length)"
        case .partialFrameDiscarded(let command, let bytes):
            return "discarded partial frame of command \(command) (\(bytes) bytes)"
        }
    }
}
