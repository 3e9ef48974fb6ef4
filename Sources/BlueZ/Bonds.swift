import DBus
import Logging

/// The bonds bluetoothd keeps on the board's adapter, and their removal
/// (``BLEPeripheral/forgetBonds(_:)``): two calls to bluetoothd and the
/// bookkeeping of their replies, apart from the peripheral's own state.
enum Bonds {
    /// The devices below `adapterPath` that bluetoothd lists as paired (keys
    /// exchanged) or bonded (5.72+: and stored), in path order, each with the
    /// address to report (its identity address where the phone gave one).
    static func bonded(in objects: [String: DBusValue], adapterPath: String) -> [(path: String, address: String)] {
        objects.compactMap { path, value -> (path: String, address: String)? in
            guard path.hasPrefix(adapterPath + "/dev_"), let device = value.dictionaryValue?["org.bluez.Device1"]?.dictionaryValue,
                  device["Paired"]?.boolValue == true || device["Bonded"]?.boolValue == true else { return nil }
            return (path, device["Address"]?.stringValue?.uppercased() ?? DeviceDirectory<Void>.address(of: path))
        }.sorted { $0.path < $1.path }
    }

    /// Asks bluetoothd (`owner`) for its objects and removes every bonded
    /// device of `adapterPath` with `Adapter1.RemoveDevice` (its keys go, a
    /// connected one is disconnected). Completes on the connection's loop
    /// with the addresses forgotten, or with every removal that failed.
    static func forget(on connection: DBusConnection, owner: String, adapterPath: String, logger: Logger,
                       _ completion: @escaping @Sendable (Result<[String], BLEPeripheral.BondFailure>) -> Void) {
        connection.call(destination: owner, path: "/", interface: "org.freedesktop.DBus.ObjectManager", method: "GetManagedObjects") { result in
            let objects: [String: DBusValue]
            switch result {
            case .success(let values): objects = values.first?.dictionaryValue ?? [:]
            case .failure(let failure): return completion(.failure(.init(description: "bluetoothd: \(failure.message)")))
            }
            let bonded = bonded(in: objects, adapterPath: adapterPath)
            guard !bonded.isEmpty else { return completion(.success([])) }
            let outcome = BondRemoval()
            let remaining = Countdown(bonded.count) {
                if outcome.failures.isEmpty { completion(.success(outcome.forgotten.sorted())) } else {
                    completion(.failure(.init(description: outcome.failures.sorted().joined(separator: "; "))))
                }
            }
            for (path, address) in bonded {
                connection.call(destination: owner, path: adapterPath, interface: "org.bluez.Adapter1", method: "RemoveDevice",
                                arguments: [.objectPath(path)], timeout: .seconds(5)) { result in
                    switch result {
                    case .success:
                        outcome.forgotten.append(address)
                        logger.notice("BLE: bond with \(address) forgotten")
                    case .failure(let failure):
                        outcome.failures.append("\(address): \(failure.message)")
                    }
                    remaining.tick()
                }
            }
        }
    }
}

/// What ``Bonds/forget(on:owner:adapterPath:logger:_:)`` removed, collected from its replies.
private final class BondRemoval: @unchecked Sendable {
    // Loop-confined: appended to by replies on the D-Bus loop only.
    var forgotten: [String] = []
    var failures: [String] = []
}

/// Counts replies down to zero on one loop, then runs `done` once (the
/// bonds' removals, the peripheral's stop).
final class Countdown: @unchecked Sendable {
    // Loop-confined: ticked only by replies on the D-Bus loop.
    private var remaining: Int
    private let done: () -> Void
    init(_ count: Int, done: @escaping () -> Void) {
        remaining = count
        self.done = done
    }
    func tick() {
        remaining -= 1
        if remaining == 0 { done() }
    }
}
