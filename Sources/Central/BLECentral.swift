import DBus
import Logging
import Reactor

/// A board advertising the BLEControl service, as discovery saw it.
public struct FoundBoard: Sendable, Equatable {
    public var name: String
    public var address: String
    /// Signal strength in dBm when the adapter reported one.
    public var rssi: Int?
    /// The device's object path under bluetoothd.
    public var path: String
}

/// What can go wrong on the central side, in words a user can act on.
public struct CentralError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// The BLEControl central on Linux: a client of bluetoothd (org.bluez on
/// the system bus) through the project's own D-Bus binding, doing what the
/// original app does on a phone: discover boards by the FFE0 service,
/// connect, write frames to FFE1 (with or without response) and take its
/// notifications.
///
/// Blocking API for a command-line tool: every call waits for bluetoothd's
/// answer; the D-Bus connection runs on a private event loop thread, where
/// notification handlers are called.
public final class BLECentral: @unchecked Sendable {
    /// The HM-10's service and characteristic (docs/protocol.md).
    public static let serviceUUID = "0000ffe0-0000-1000-8000-00805f9b34fb"
    public static let characteristicUUID = "0000ffe1-0000-1000-8000-00805f9b34fb"

    private let loop: EventLoop
    private let connection: DBusConnection
    /// The adapter in use, e.g. `/org/bluez/hci0`.
    public let adapterPath: String

    /// Connects to the system bus (`$DBUS_SYSTEM_BUS_ADDRESS` honoured), or
    /// to the bus at `busAddress`, and picks `adapter` (`hci1`), or the
    /// first adapter bluetoothd has.
    public init(adapter: String?, busAddress: String? = nil, logger: Logger) throws {
        let loop = try EventLoop(name: "blecontrol-central")
        self.loop = loop
        loop.start()
        do {
            connection = try busAddress.map { try DBusConnection(address: $0, loop: loop, logger: logger) }
                ?? DBusConnection.system(loop: loop, logger: logger)
        } catch {
            loop.stop()
            throw CentralError("cannot reach the system bus: \(error)")
        }
        let objects: [String: [String: [String: DBusValue]]]
        do {
            objects = try Self.managedObjects(connection)
        } catch {
            connection.close()
            loop.stop()
            throw error
        }
        let adapters = objects.filter { $0.value["org.bluez.Adapter1"] != nil }.keys.sorted()
        let chosen = adapter.map { name in adapters.first { $0 == name || $0.hasSuffix("/\(name)") } } ?? adapters.first
        guard let chosen else {
            connection.close()
            loop.stop()
            throw CentralError(adapters.isEmpty
                ? "bluetoothd has no Bluetooth adapter (is one plugged in and not rfkill-blocked?)"
                : "no adapter \(adapter ?? "") (bluetoothd has \(adapters.map { $0.split(separator: "/").last.map(String.init) ?? $0 }.joined(separator: ", ")))")
        }
        adapterPath = chosen
    }

    deinit { close() }

    /// Ends the D-Bus connection (and with it any connection bluetoothd
    /// keeps only for us).
    public func close() {
        connection.close()
        loop.stop()
    }

    // MARK: Discovery

    /// Discovers boards advertising FFE0 for `duration`, calling `report`
    /// once per board (boards bluetoothd already knows come first), on the
    /// caller's thread.
    public func scan(for duration: Duration, report: (FoundBoard) -> Void) throws {
        var reported = Set<String>()
        let found = Mailbox<FoundBoard>()
        let subscription = watchDevices { board in found.post(board) }
        defer { connection.removeMatch(subscription) }
        try startDiscovery()
        defer { stopDiscovery() }
        for board in try knownBoards() where reported.insert(board.path).inserted { report(board) }
        let deadline = ContinuousClock.now + duration
        while let seen = found.take(until: deadline) {
            guard !reported.contains(seen.path), let board = try complete(seen) else { continue }
            reported.insert(board.path)
            report(board)
        }
    }

    /// Finds the board named `target` (its advertised name or alias, or its
    /// address), discovering for at most `timeout` if bluetoothd does not
    /// know it yet.
    public func find(_ target: String, timeout: Duration) throws -> FoundBoard {
        func matches(_ board: FoundBoard) -> Bool {
            board.name == target || board.address.caseInsensitiveCompare(target)
        }
        if let known = try knownBoards(includingUnadvertised: true).first(where: matches) { return known }
        let found = Mailbox<FoundBoard>()
        let subscription = watchDevices { board in found.post(board) }
        defer { connection.removeMatch(subscription) }
        try startDiscovery()
        defer { stopDiscovery() }
        // A device bluetoothd learnt of between the first look and the
        // subscription is in its object tree, not in a signal.
        if let known = try knownBoards(includingUnadvertised: true).first(where: matches) { return known }
        let deadline = ContinuousClock.now + timeout
        while let seen = found.take(until: deadline) {
            if let board = try complete(seen), matches(board) { return board }
        }
        throw CentralError("no board \"\(target)\" advertising FFE0 was found in \(timeout) (is it powered and advertising? `blecontrol scan` lists what is in range)")
    }

    // MARK: Connecting

    /// Connects to `board`, finds FFE1 once bluetoothd has resolved the
    /// services, and subscribes to its notifications, which go to
    /// `onNotification` (on the D-Bus thread). When any step after the
    /// connection fails, the board is disconnected before the error is
    /// thrown: bluetoothd keeps a link up after its client has gone, and a
    /// link left half made (services never resolved) would hold the board
    /// and make the next Connect a no-op that fails the same way.
    public func connect(_ board: FoundBoard, timeout: Duration, onNotification: @escaping @Sendable ([UInt8]) -> Void) throws -> BoardLink {
        let resolved = Mailbox<Bool>()
        let watch = connection.addMatch(DBusMatchRule(sender: "org.bluez", interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged", path: board.path, arg0: "org.bluez.Device1")) { message in
            guard let changed = message.arguments.dropFirst().first?.dictionaryValue else { return }
            if let value = changed["ServicesResolved"]?.boolValue { resolved.post(value) }
        }
        defer { connection.removeMatch(watch) }
        do {
            _ = try connection.callAndWait(destination: "org.bluez", path: board.path, interface: "org.bluez.Device1", method: "Connect", timeout: timeout)
        } catch {
            throw CentralError("could not connect to \(board.name) (\(board.address)): \(error)")
        }
        do {
            return try subscribe(board, resolved: resolved, timeout: timeout, onNotification: onNotification)
        } catch {
            disconnect(board.path)
            throw error
        }
    }

    /// connect's steps once the link is up: the services, FFE1, its
    /// notifications, all within `timeout` from now.
    private func subscribe(_ board: FoundBoard, resolved: Mailbox<Bool>, timeout: Duration,
                           onNotification: @escaping @Sendable ([UInt8]) -> Void) throws -> BoardLink {
        let deadline = ContinuousClock.now + timeout
        while try !servicesResolved(board.path, within: deadline) {
            guard resolved.take(until: deadline) != nil else {
                throw CentralError("connected to \(board.name), but bluetoothd did not resolve its services within \(timeout); disconnected (try again)")
            }
        }
        guard let characteristic = try characteristicPath(under: board.path, within: deadline) else {
            throw CentralError("\(board.name) (\(board.address)) has no BLEControl characteristic FFE1: not a BLEControl board")
        }
        let notifications = connection.addMatch(DBusMatchRule(sender: "org.bluez", interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged", path: characteristic, arg0: "org.bluez.GattCharacteristic1")) { message in
            guard let changed = message.arguments.dropFirst().first?.dictionaryValue, let value = changed["Value"]?.byteArray else { return }
            onNotification(value)
        }
        do {
            _ = try connection.callAndWait(destination: "org.bluez", path: characteristic, interface: "org.bluez.GattCharacteristic1", method: "StartNotify", timeout: timeout)
        } catch {
            connection.removeMatch(notifications)
            throw CentralError("could not subscribe to FFE1 notifications: \(error)")
        }
        return BoardLink(central: self, board: board, characteristic: characteristic, subscription: notifications)
    }

    fileprivate func write(_ bytes: [UInt8], withResponse: Bool, to characteristic: String) throws {
        // "request": ATT Write Request, acknowledged; "command": Write
        // Command, not acknowledged (BlueZ's GattCharacteristic1.WriteValue
        // `type` option, doc/org.bluez.GattCharacteristic.rst).
        let options = DBusValue.properties([("type", .string(withResponse ? "request" : "command"))])
        do {
            _ = try connection.callAndWait(destination: "org.bluez", path: characteristic, interface: "org.bluez.GattCharacteristic1", method: "WriteValue",
                                           arguments: [.bytes(bytes), options], timeout: .seconds(10))
        } catch {
            throw CentralError("write to FFE1 failed: \(error)")
        }
    }

    fileprivate func finish(_ link: BoardLink) {
        connection.removeMatch(link.subscription)
        _ = try? connection.callAndWait(destination: "org.bluez", path: link.characteristic, interface: "org.bluez.GattCharacteristic1", method: "StopNotify", timeout: .seconds(2))
        disconnect(link.board.path)
    }

    private func disconnect(_ path: String) {
        _ = try? connection.callAndWait(destination: "org.bluez", path: path, interface: "org.bluez.Device1", method: "Disconnect", timeout: .seconds(5))
    }

    // MARK: bluetoothd's object tree

    private static func managedObjects(_ connection: DBusConnection, timeout: Duration = DBusConnection.defaultTimeout) throws -> [String: [String: [String: DBusValue]]] {
        let reply: [DBusValue]
        do {
            reply = try connection.callAndWait(destination: "org.bluez", path: "/", interface: "org.freedesktop.DBus.ObjectManager", method: "GetManagedObjects",
                                               timeout: timeout)
        } catch {
            throw CentralError("bluetoothd does not answer on the system bus (is bluetooth.service running?): \(error)")
        }
        var objects: [String: [String: [String: DBusValue]]] = [:]
        for (path, interfaces) in reply.first?.dictionaryValue ?? [:] {
            var byInterface: [String: [String: DBusValue]] = [:]
            for (name, properties) in interfaces.dictionaryValue ?? [:] {
                byInterface[name] = properties.dictionaryValue ?? [:]
            }
            objects[path] = byInterface
        }
        return objects
    }

    /// The devices under our adapter that advertise FFE0 (or, for
    /// `includingUnadvertised`, any device: a board we connected to before
    /// may no longer list its UUIDs until it advertises again).
    private func knownBoards(includingUnadvertised: Bool = false) throws -> [FoundBoard] {
        try Self.managedObjects(connection).compactMap { path, interfaces in
            guard path.hasPrefix(adapterPath + "/"), let device = interfaces["org.bluez.Device1"] else { return nil }
            return Self.board(path: path, properties: device, requireService: !includingUnadvertised)
        }.sorted { $0.path < $1.path }
    }

    /// A device seen in a signal, with everything bluetoothd knows of it
    /// (a PropertiesChanged brings only what changed); nil when it does not
    /// offer FFE0 after all, or has gone.
    private func complete(_ seen: FoundBoard) throws -> FoundBoard? {
        guard seen.address.isEmpty else { return seen }
        guard let reply = try? connection.callAndWait(destination: "org.bluez", path: seen.path, interface: "org.freedesktop.DBus.Properties",
                                                      method: "GetAll", arguments: [.string("org.bluez.Device1")], timeout: .seconds(2)),
              let properties = reply.first?.dictionaryValue else { return nil }
        return Self.board(path: seen.path, properties: properties, requireService: true)
    }

    private static func board(path: String, properties: [String: DBusValue], requireService: Bool) -> FoundBoard? {
        let uuids = (properties["UUIDs"]?.arrayValue ?? []).compactMap(\.stringValue).map { $0.lowercased() }
        if requireService, !uuids.contains(serviceUUID) { return nil }
        guard let address = properties["Address"]?.stringValue else { return nil }
        let name = properties["Name"]?.stringValue ?? properties["Alias"]?.stringValue ?? address
        return FoundBoard(name: name, address: address, rssi: properties["RSSI"]?.integerValue, path: path)
    }

    /// Calls `found` (on the D-Bus thread) for each device that appears or
    /// changes under our adapter and advertises FFE0.
    private func watchDevices(_ found: @escaping @Sendable (FoundBoard) -> Void) -> UInt64 {
        let adapter = adapterPath
        return connection.addMatch(DBusMatchRule(sender: "org.bluez", pathNamespace: adapter)) { message in
            guard let path = message.path else { return }
            switch message.member {
            case "InterfacesAdded":
                guard let added = message.arguments.first?.stringValue, added.hasPrefix(adapter + "/"),
                      let interfaces = message.arguments.dropFirst().first?.dictionaryValue,
                      let device = interfaces["org.bluez.Device1"]?.dictionaryValue,
                      let board = Self.board(path: added, properties: device, requireService: true) else { return }
                found(board)
            case "PropertiesChanged":
                // RSSI and UUIDs arrive in PropertiesChanged for a device
                // bluetoothd already had; the whole picture is then asked for.
                guard path.hasPrefix(adapter + "/"), message.arguments.first?.stringValue == "org.bluez.Device1" else { return }
                found(FoundBoard(name: "", address: "", rssi: nil, path: path))
            default:
                return
            }
        }
    }

    private func startDiscovery() throws {
        // Only LE devices offering FFE0: bluetoothd filters (and duplicate
        // reports refresh RSSI).
        let filter = DBusValue.properties([
            ("UUIDs", .strings([Self.serviceUUID])),
            ("Transport", .string("le")),
        ])
        do {
            _ = try connection.callAndWait(destination: "org.bluez", path: adapterPath, interface: "org.bluez.Adapter1", method: "SetDiscoveryFilter", arguments: [filter])
            _ = try connection.callAndWait(destination: "org.bluez", path: adapterPath, interface: "org.bluez.Adapter1", method: "StartDiscovery")
        } catch {
            throw CentralError("cannot start discovery on \(adapterPath): \(error) (is the adapter powered? `bluetoothctl power on`)")
        }
    }

    private func stopDiscovery() {
        _ = try? connection.callAndWait(destination: "org.bluez", path: adapterPath, interface: "org.bluez.Adapter1", method: "StopDiscovery", timeout: .seconds(2))
    }

    /// A call made while connecting waits as long as the connect may (its
    /// deadline; never less than a call's default wait):
    /// right after Connect, bluetoothd is busy resolving the services, and
    /// in the VM tier's guest on a loaded host it took more than 5 s to
    /// answer a Properties.Get.
    private func callTimeout(within deadline: ContinuousClock.Instant) -> Duration {
        max(DBusConnection.defaultTimeout, deadline - .now)
    }

    private func servicesResolved(_ path: String, within deadline: ContinuousClock.Instant) throws -> Bool {
        let reply = try connection.callAndWait(destination: "org.bluez", path: path, interface: "org.freedesktop.DBus.Properties", method: "Get",
                                               arguments: [.string("org.bluez.Device1"), .string("ServicesResolved")], timeout: callTimeout(within: deadline))
        return reply.first?.boolValue == true
    }

    private func characteristicPath(under device: String, within deadline: ContinuousClock.Instant) throws -> String? {
        let objects = try Self.managedObjects(connection, timeout: callTimeout(within: deadline))
        return objects.keys.sorted().first { path in
            guard path.hasPrefix(device + "/"), let characteristic = objects[path]?["org.bluez.GattCharacteristic1"],
                  characteristic["UUID"]?.stringValue?.lowercased() == Self.characteristicUUID,
                  let service = characteristic["Service"]?.stringValue,
                  objects[service]?["org.bluez.GattService1"]?["UUID"]?.stringValue?.lowercased() == Self.serviceUUID
            else { return false }
            return true
        }
    }
}

/// A connected board: frames go to its FFE1; `close` disconnects.
public final class BoardLink: @unchecked Sendable {
    private let central: BLECentral
    public let board: FoundBoard
    let characteristic: String
    let subscription: UInt64
    private var closed = false

    init(central: BLECentral, board: FoundBoard, characteristic: String, subscription: UInt64) {
        self.central = central
        self.board = board
        self.characteristic = characteristic
        self.subscription = subscription
    }

    /// Writes `bytes` to FFE1: with response (ATT Write Request) or without
    /// (Write Command), as the original app chooses per command.
    public func write(_ bytes: [UInt8], withResponse: Bool) throws {
        try central.write(bytes, withResponse: withResponse, to: characteristic)
    }

    /// Stops notifications and disconnects (once).
    public func close() {
        guard !closed else { return }
        closed = true
        central.finish(self)
    }

    deinit { close() }
}

/// Values posted from the D-Bus thread, taken in order by a waiting caller.
final class Mailbox<Value: Sendable>: @unchecked Sendable {
    private let condition = Condition()
    private var items: [Value] = []

    func post(_ value: Value) {
        condition.withLock {
            items.append(value)
            condition.signal()
        }
    }

    /// The oldest value, waiting until `deadline` for one; nil when none came.
    func take(until deadline: ContinuousClock.Instant) -> Value? {
        condition.withLock {
            while items.isEmpty {
                guard condition.wait(until: deadline) || !items.isEmpty else { return nil }
            }
            return items.removeFirst()
        }
    }
}

private extension String {
    func caseInsensitiveCompare(_ other: String) -> Bool { lowercased() == other.lowercased() }
}
