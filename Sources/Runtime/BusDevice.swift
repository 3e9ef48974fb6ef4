import Board
import LinuxHardware
import Reactor

extension BusConfiguration.Kind {
    /// The i2c-dev node a device or adapter bus opens, nil for an emulated
    /// bus. An adapter named by its name is looked up now, each time: its
    /// number may differ from one boot, or one kernel, to the next.
    /// - Throws: `LinuxI2CBus.OpenError` when no adapter has the name, or
    ///   several have it; the error lists the adapters there are.
    public func devicePath() throws(LinuxI2CBus.OpenError) -> String? {
        switch self {
        case .emulated: return nil
        case .device(let path): return path
        case .adapter(let name): return try LinuxI2CBus.devicePath(adapterNamed: name)
        }
    }

    /// Whether the bus can be opened as far as its device node goes: the
    /// node exists (an adapter's only once the adapter does). What
    /// `safe-outputs` waits for at boot, while udev is still loading
    /// drivers. An emulated bus always is.
    public var isPresent: Bool {
        if case .emulated = self { return true }
        guard let path = try? devicePath() else { return false }
        return Files.exists(path)
    }
}
