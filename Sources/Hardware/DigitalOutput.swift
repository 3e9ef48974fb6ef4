/// A single digital output line (an LED, an enable pin).
///
/// Errors thrown describe the line and the failure; callers log them and keep
/// going, an LED is never worth stopping the daemon for.
public protocol DigitalOutput: AnyObject, Sendable {
    /// Drives the line to the active level (`true`) or inactive level.
    func set(_ active: Bool) throws
}

/// An error from a GPIO backend.
public struct DigitalOutputError: Error, Sendable, Hashable, CustomStringConvertible {
    public var line: String
    public var context: String
    public init(line: String, context: String) {
        self.line = line
        self.context = context
    }
    public var description: String { "GPIO \(line): \(context)" }
}
