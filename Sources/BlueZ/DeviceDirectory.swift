import DBus

/// One of bluetoothd's Device1 objects, as far as the peripheral cares.
struct CentralDevice {
    var address: String
    var connected: Bool
    /// Paired, Bonded (5.72+) or Trusted: bluetoothd keeps it on purpose.
    var kept = false
}

/// bluetoothd's view of the centrals on one adapter: its Device1 objects as
/// its signals and answers describe them (address, connected, bonded), and
/// the calls waiting for it to vouch that a device is a connected central.
/// Pure state, like ``Registration``: the peripheral does the D-Bus I/O and
/// feeds what bluetoothd says in here. `Waiter` is whatever the caller
/// queues (the peripheral's: a method call and what to run once vouched).
struct DeviceDirectory<Waiter> {
    typealias Device = CentralDevice

    /// By object path.
    private var devices: [String: Device] = [:]
    /// Per device bluetoothd was asked about, in arrival order.
    private var waiting: [String: [Waiter]] = [:]

    /// Merges Device1 properties (all of them, or a PropertiesChanged's)
    /// into what is known of `path`. True when the device just connected.
    mutating func learn(_ path: String, _ properties: [String: DBusValue]) -> Bool {
        var device = devices[path] ?? Device(address: Self.address(of: path), connected: false)
        if let address = properties["Address"]?.stringValue { device.address = address.uppercased() }
        let wasConnected = device.connected
        if let connected = properties["Connected"]?.boolValue { device.connected = connected }
        for key in ["Paired", "Bonded", "Trusted"] where properties[key]?.boolValue == true { device.kept = true }
        devices[path] = device
        return device.connected && !wasConnected
    }

    /// bluetoothd removed the object.
    mutating func forget(_ path: String) { devices.removeValue(forKey: path) }

    /// The adapter went away, and its objects with it.
    mutating func forgetAll() { devices.removeAll() }

    /// Takes out the devices that are gone and were never bonded (for the
    /// peripheral to ask bluetoothd to remove before a pairing).
    mutating func takeStale() -> [(path: String, device: Device)] {
        let stale = devices.filter { !$0.value.connected && !$0.value.kept }.sorted { $0.key < $1.key }
        for (path, _) in stale { devices.removeValue(forKey: path) }
        return stale.map { (path: $0.key, device: $0.value) }
    }

    /// The device at `path` if bluetoothd reports it connected.
    func connected(_ path: String) -> Device? {
        guard let device = devices[path], device.connected else { return nil }
        return device
    }

    /// Queues `waiter` behind the others for `path`. True for the first:
    /// the caller then asks bluetoothd, and calls ``takeWaiters(for:)`` with
    /// its answer.
    mutating func wait(for path: String, _ waiter: Waiter) -> Bool {
        if waiting[path] != nil {
            waiting[path]!.append(waiter)
            return false
        }
        waiting[path] = [waiter]
        return true
    }

    /// The waiters for `path`, in arrival order, no longer waiting.
    mutating func takeWaiters(for path: String) -> [Waiter] {
        waiting.removeValue(forKey: path) ?? []
    }

    /// `AA:BB:CC:DD:EE:FF` from `/org/bluez/hci0/dev_AA_BB_CC_DD_EE_FF`.
    static func address(of devicePath: String) -> String {
        guard let last = devicePath.split(separator: "/").last, last.hasPrefix("dev_") else { return devicePath }
        return String(last.dropFirst(4).map { $0 == "_" ? ":" : $0 }).uppercased()
    }
}
