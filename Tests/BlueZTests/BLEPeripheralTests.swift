#if canImport(Glibc)
import Glibc
#endif
import BlueZ
import DBus
import Reactor
import Foundation
import Testing
import TestSupport

/// A minimal bluetoothd on the private bus: one adapter with GattManager1
/// and LEAdvertisingManager1 that read back what the peripheral exports,
/// the way bluetoothd does.
final class FakeBlueZ: @unchecked Sendable {
    let loop: EventLoop
    let connection: DBusConnection
    /// The centrals bluetoothd knows on hci0 (Device1 objects), connected.
    static let centralA = "/org/bluez/hci0/dev_00_00_00_02_00_01"
    static let centralB = "/org/bluez/hci0/dev_00_00_00_03_00_01"
    private var connected: [String: Bool] = [centralA: true, centralB: true]
    let registered = Collected<String>()
    /// AgentManager1 calls, as "register <path> <capability>" / "default <path>".
    let agents = Collected<String>()
    /// Adapter1.RemoveDevice calls, by device path.
    let removed = Collected<String>()
    /// Each registered advertisement's "MinInterval-MaxInterval" (ms).
    let intervals = Collected<String>()
    /// The services' Handle properties at each RegisterApplication, in path order.
    let serviceHandles = Collected<String>()
    /// Refuse a registration that asks for fixed handles, as bluetoothd does
    /// when another application holds them.
    var handlesTaken = false
    /// RegisterAdvertisement left unanswered, as bluetoothd leaves it while
    /// the kernel takes the advertisement.
    let holdAdvertisements = LockedBox(false)
    /// How long bluetoothd takes before it reads a registered
    /// advertisement's properties (a busy machine, qemu-user).
    let advertisementReadDelay = LockedBox(Duration.zero)
    /// LEAdvertisingManager1 calls in the order they came ("register" or
    /// "unregister", then the path).
    let advertisingCalls = Collected<String>()
    var powered = false
    private let poweredLock = NSLock()

    init(address: String) throws {
        loop = try testLoop()
        connection = try DBusConnection(address: address, loop: loop, logger: logger)
        let adapter = DBusInterface("org.bluez.Adapter1")
        adapter.property("Address", "s", get: { .string("00:00:00:01:00:01") })
        adapter.property("Powered", "b", get: { [unowned self] in .bool(poweredLock.withLock { powered }) }, set: { [unowned self] value in
            poweredLock.withLock { powered = value.boolValue ?? false }
            connection.emitPropertiesChanged(path: "/org/bluez/hci0", interface: "org.bluez.Adapter1", changed: [("Powered", value)])
        })
        adapter.method("RemoveDevice", in: "o") { [unowned self] call in
            removed.append(call.arguments[0].stringValue ?? "?")
            call.reply()
        }
        let gatt = DBusInterface("org.bluez.GattManager1")
        gatt.method("RegisterApplication", in: "oa{sv}") { [unowned self] call in
            let root = call.arguments[0].stringValue ?? "/"
            connection.call(destination: call.sender, path: root, interface: "org.freedesktop.DBus.ObjectManager", method: "GetManagedObjects", timeout: Patience.time) { result in
                guard case .success(let values) = result, let objects = values.first?.dictionaryValue else { return call.fail("org.bluez.Error.Failed", "no objects") }
                let uuids = objects.values.compactMap { $0.dictionaryValue?["org.bluez.GattCharacteristic1"]?.dictionaryValue?["UUID"]?.stringValue }
                let handles = objects.keys.sorted().compactMap { objects[$0]?.dictionaryValue?["org.bluez.GattService1"]?.dictionaryValue?["Handle"]?.integerValue }
                self.serviceHandles.append(handles.map(String.init).joined(separator: ","))
                if self.handlesTaken, handles.contains(where: { $0 != 0 }) {
                    return call.fail("org.bluez.Error.Failed", "Failed to create entry in database")
                }
                self.registered.append("app " + uuids.sorted().joined(separator: ","))
                call.reply()
            }
        }
        let advertising = DBusInterface("org.bluez.LEAdvertisingManager1")
        advertising.method("RegisterAdvertisement", in: "oa{sv}") { [unowned self] call in
            let path = call.arguments[0].stringValue ?? "/"
            advertisingCalls.append("register \(path)")
            if holdAdvertisements.value { return }
            _ = loop.schedule(after: advertisementReadDelay.value) { [unowned self] in
                connection.call(destination: call.sender, path: path, interface: "org.freedesktop.DBus.Properties", method: "GetAll", arguments: [.string("org.bluez.LEAdvertisement1")], timeout: Patience.time) { result in
                    guard case .success(let values) = result, let properties = values.first?.dictionaryValue else { return call.fail("org.bluez.Error.Failed", "no properties") }
                    self.registered.append("adv \(properties["LocalName"]?.stringValue ?? "?") discoverable=\(properties["Discoverable"]?.boolValue ?? false)")
                    self.intervals.append("\(properties["MinInterval"]?.integerValue ?? -1)-\(properties["MaxInterval"]?.integerValue ?? -1)")
                    call.reply()
                }
            }
        }
        advertising.method("UnregisterAdvertisement", in: "o") { [unowned self] call in
            advertisingCalls.append("unregister \(call.arguments[0].stringValue ?? "/")")
            call.reply()
        }
        gatt.method("UnregisterApplication", in: "o") { call in call.reply() }
        let agentManager = DBusInterface("org.bluez.AgentManager1")
        agentManager.method("RegisterAgent", in: "os") { [unowned self] call in
            agents.append("register \(call.arguments[0].stringValue ?? "?") \(call.arguments[1].stringValue ?? "?")")
            call.reply()
        }
        agentManager.method("RequestDefaultAgent", in: "o") { [unowned self] call in
            agents.append("default \(call.arguments[0].stringValue ?? "?")")
            call.reply()
        }
        connection.exportObjectManager(at: "/")
        connection.export(path: "/org/bluez", interfaces: [agentManager])
        connection.export(path: "/org/bluez/hci0", interfaces: [adapter, gatt, advertising])
        for (path, address) in [(Self.centralA, "00:00:00:02:00:01"), (Self.centralB, "00:00:00:03:00:01")] {
            let device = DBusInterface("org.bluez.Device1")
            device.property("Address", "s", get: { .string(address) })
            device.property("Adapter", "o", get: { .objectPath("/org/bluez/hci0") })
            device.property("Connected", "b", get: { [unowned self] in .bool(poweredLock.withLock { connected[path] ?? false }) })
            // Central A has bonded with the board (Paired, as bluetoothd 5.66 says it).
            device.property("Paired", "b", get: { .bool(path == Self.centralA) })
            connection.export(path: path, interfaces: [device])
        }
        connection.own("org.bluez")
    }

    /// Writes to the peripheral's FFE1 as bluetoothd does for a central.
    func write(_ bytes: [UInt8], type: String?, to peripheral: String, device: String = FakeBlueZ.centralA) throws {
        var options: [(String, DBusValue)] = [("device", .objectPath(device)), ("mtu", .uint16(517))]
        if let type { options.append(("type", .string(type))) }
        _ = try connection.callAndWait(destination: peripheral, path: BLEPeripheral.characteristicPath, interface: "org.bluez.GattCharacteristic1",
                                       method: "WriteValue", arguments: [.bytes(bytes), .properties(options)], timeout: Patience.time)
    }

    /// AcquireWrite / AcquireNotify as bluetoothd calls them: (device, mtu, link) → (fd, mtu).
    func acquire(_ method: String, central: String = "/org/bluez/hci0/dev_00_00_00_02_00_01", mtu: UInt16 = 185, from peripheral: String) throws -> (fd: Int32, mtu: Int) {
        let reply = try connection.callAndWait(destination: peripheral, path: BLEPeripheral.characteristicPath, interface: "org.bluez.GattCharacteristic1", method: method,
                                               arguments: [.properties([("device", .objectPath(central)), ("mtu", .uint16(mtu)), ("link", .string("LE"))])], timeout: Patience.time)
        guard reply.count == 2, case .unixFD(let fd) = reply[0], let mtu = reply[1].integerValue else { throw DBusFailure("test.BadReply", "\(reply)") }
        return (fd, mtu)
    }

    func characteristicProperty(_ name: String, of peripheral: String) -> Bool? {
        (try? connection.callAndWait(destination: peripheral, path: BLEPeripheral.characteristicPath, interface: "org.freedesktop.DBus.Properties", method: "Get",
                                     arguments: [.string("org.bluez.GattCharacteristic1"), .string(name)], timeout: Patience.time))?.first?.boolValue
    }

    /// The unique name of the only other client exporting FFE1 on the bus.
    func peripheralName() throws -> String {
        let names = try connection.callAndWait(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", method: "ListNames", timeout: Patience.time)
            .first?.arrayValue?.compactMap(\.stringValue).filter { $0.hasPrefix(":") && $0 != connection.uniqueName } ?? []
        for candidate in names where (try? connection.callAndWait(destination: candidate, path: BLEPeripheral.characteristicPath, interface: "org.freedesktop.DBus.Properties",
                                                                  method: "Get", arguments: [.string("org.bluez.GattCharacteristic1"), .string("UUID")], timeout: Patience.time)) != nil {
            return candidate
        }
        throw DBusFailure("test.NoPeripheral", "no FFE1 on the bus")
    }

    func disconnectCentral(_ path: String = FakeBlueZ.centralA) {
        poweredLock.withLock { connected[path] = false }
        connection.emitPropertiesChanged(path: path, interface: "org.bluez.Device1", changed: [("Connected", .bool(false))])
    }

    func close() {
        connection.close()
        loop.stop()
    }
}

@Suite(.serialized, .enabled(if: PrivateBus.available, "dbus-daemon is not installed"))
struct BLEPeripheralTests {
    final class Events: @unchecked Sendable {
        let writes = Collected<String>()
        let disconnects = Collected<String>()
        /// Pending acknowledgements of writes with response.
        let acks = Collected<@Sendable (String?) -> Void>()
        /// Passkeys shown ("-" when the display may be restored).
        let passkeys = Collected<String>()
    }

    /// A private bus with a fake BlueZ and a started peripheral that is
    /// advertising; skipped (returns) where there is no dbus-daemon.
    func withAdvertisingPeripheral(allow: [String] = [], security: BLEPeripheral.Security = .open, acquireWrite: Bool = true,
                                   _ body: (FakeBlueZ, BLEPeripheral, Events) throws -> Void) throws {
        guard let bus = try PrivateBus.start() else { return }
        defer { bus.stop() }
        let bluez = try FakeBlueZ(address: bus.address)
        defer { bluez.close() }
        let events = Events()
        let ble = try peripheral(bus, events: events, allow: allow, security: security, acquireWrite: acquireWrite)
        ble.start()
        defer { ble.stop() }
        #expect(eventually { ble.stateDescription.hasPrefix("advertising") })
        try body(bluez, ble, events)
    }

    func peripheral(_ bus: PrivateBus, events: Events, allow: [String] = [], security: BLEPeripheral.Security = .open, acquireWrite: Bool = true,
                    fastAdvertisingPeriod: Duration = .seconds(30)) throws -> BLEPeripheral {
        try BLEPeripheral(
            configuration: .init(name: "Test-Board", adapter: "hci0", powerOn: true, security: security, allow: allow, busAddress: bus.address, acquireWrite: acquireWrite,
                                 fastAdvertisingPeriod: fastAdvertisingPeriod),
            handlers: .init(
                write: { central, bytes, withResponse, done in
                    events.writes.append("\(central.split(separator: "/").last ?? "") \(bytes.map { String(format: "%02x", $0) }.joined()) \(withResponse ? "request" : "command")")
                    if withResponse { events.acks.append(done) }
                },
                disconnected: { central in events.disconnects.append(String(central.split(separator: "/").last ?? "")) },
                passkey: { central, passkey in events.passkeys.append("\(central.split(separator: "/").last ?? "") \(passkey ?? "-")") }
            ),
            logger: logger
        )
    }

    @Test func withoutBlueZItSaysSoAndRegistersWhenBlueZArrives() throws {
        guard let bus = try PrivateBus.start() else { return }
        defer { bus.stop() }
        let events = Events()
        let ble = try peripheral(bus, events: events)
        ble.start()
        defer { ble.stop() }
        #expect(eventually { ble.stateDescription.contains("no BlueZ on the system bus") })
        let bluez = try FakeBlueZ(address: bus.address)
        defer { bluez.close() }
        // Powered off at first: ble.power_on switches it on, then it registers.
        #expect(eventually { ble.stateDescription.hasPrefix("advertising as Test-Board on hci0") })
        #expect(bluez.powered)
        #expect(bluez.registered.all == ["app 00002a24-0000-1000-8000-00805f9b34fb,00002a26-0000-1000-8000-00805f9b34fb,00002a29-0000-1000-8000-00805f9b34fb,0000ffe1-0000-1000-8000-00805f9b34fb", "adv Test-Board discoverable=true"])
    }

    @Test func aWriteWithResponseIsAnsweredOnlyOnceApplied() throws {
        try withAdvertisingPeripheral { bluez, ble, events in
            let peripheralName = try bluez.peripheralName()

            try bluez.write([0x02, 0x03, 0x00, 0x01, 0xF4], type: "command", to: peripheralName)
            let answered = Collected<Bool>()
            // BlueZ 5.66: no type → request. Asynchronous: its reply is
            // handled on the fake BlueZ's loop, in the order replies arrive.
            bluez.connection.call(destination: peripheralName, path: BLEPeripheral.characteristicPath, interface: "org.bluez.GattCharacteristic1", method: "WriteValue",
                                  arguments: [.bytes([0x05, 0x00]), .properties([("device", .objectPath(FakeBlueZ.centralA))])], timeout: Patience.time) { result in
                answered.append((try? result.get()) != nil)
            }
            #expect(eventually { events.acks.all.count == 1 })
            // A round trip after the write was handled: had the peripheral
            // answered the write already, that reply would have arrived first
            // (one connection, in order). No sleeping and hoping.
            _ = bluez.characteristicProperty("Notifying", of: peripheralName)
            #expect(answered.all.isEmpty, "answered before the frames were applied")
            events.acks.all.first?(nil)
            #expect(eventually { answered.all == [true] })
            #expect(events.writes.all == ["dev_00_00_00_02_00_01 02030001f4 command", "dev_00_00_00_02_00_01 0500 request"])

            // A failed apply is an error reply (an ATT error for the central).
            let failedWrite = Collected<String>()
            let second = Thread {
                do { try bluez.write([0x05, 0x00], type: "request", to: peripheralName); failedWrite.append("ok") } catch { failedWrite.append("\(error)") }
            }
            second.start()
            #expect(eventually { events.acks.all.count == 2 })
            events.acks.all[1]("PCA9685 did not answer")
            #expect(eventually { failedWrite.all.count == 1 })
            #expect(failedWrite.all.first?.contains("org.bluez.Error.Failed") == true)

            bluez.disconnectCentral()
            #expect(eventually { events.disconnects.all == ["dev_00_00_00_02_00_01"] })
        }
    }

    @Test func aBlueZRestartRegistersAgain() throws {
        guard let bus = try PrivateBus.start() else { return }
        defer { bus.stop() }
        let first = try FakeBlueZ(address: bus.address)
        let events = Events()
        let ble = try peripheral(bus, events: events)
        ble.start()
        defer { ble.stop() }
        #expect(eventually { ble.stateDescription.hasPrefix("advertising") })
        first.close()
        #expect(eventually { ble.stateDescription.contains("no BlueZ on the system bus") })
        let second = try FakeBlueZ(address: bus.address)
        defer { second.close() }
        #expect(eventually { ble.stateDescription.hasPrefix("advertising") && second.registered.all.count == 2 })
    }

    @Test func theAllowListRefusesOthers() throws {
        try withAdvertisingPeripheral(allow: ["AA:BB:CC:DD:EE:FF"]) { bluez, ble, events in
            let names = try bluez.connection.callAndWait(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", method: "ListNames", timeout: Patience.time)
                .first?.arrayValue?.compactMap(\.stringValue).filter { $0.hasPrefix(":") && $0 != bluez.connection.uniqueName } ?? []
            var refused = 0
            for name in names {
                do { try bluez.write([0x00, 0x00], type: "command", to: name) } catch let failure as DBusFailure where failure.name == "org.bluez.Error.NotAuthorized" { refused += 1 } catch {}
            }
            #expect(refused == 1)
            #expect(events.writes.all.isEmpty)
            #expect(eventually { ble.stateDescription.contains("1 writes refused") })
        }
    }

    /// Reads one datagram, waiting for it as `eventually` does; nil once
    /// the socket is closed (or nothing came).
    static func receive(_ fd: Int32) -> [UInt8]? {
        var datagram: [UInt8]?
        receiveChunks(from: fd) { chunk in
            datagram = chunk
            return false
        }
        return datagram
    }

    @Test func acquiredWriteSocketCarriesFramesAndCanBeReacquired() throws {
        try withAdvertisingPeripheral { bluez, ble, events in
            let name = try bluez.peripheralName()
            #expect(bluez.characteristicProperty("WriteAcquired", of: name) == false)

            let first = try bluez.acquire("AcquireWrite", mtu: 185, from: name)
            #expect(first.mtu == 185)
            #expect(bluez.characteristicProperty("WriteAcquired", of: name) == true)
            // One datagram per ATT write-without-response.
            var frame: [UInt8] = [0x02, 0x03, 0x00, 0x01, 0xF4]
            #expect(write(first.fd, &frame, frame.count) == frame.count)
            var second: [UInt8] = [0x05, 0x00]
            #expect(write(first.fd, &second, second.count) == second.count)
            #expect(eventually { events.writes.all == ["dev_00_00_00_02_00_01 02030001f4 command", "dev_00_00_00_02_00_01 0500 command"] })

            // After a reconnect or an MTU change BlueZ acquires again (and
            // BlueZoo does when it has not yet seen WriteAcquired change):
            // the new socket replaces the old one, but nothing written to the
            // old one is lost: what was queued comes first, in order, and the
            // old socket is read until BlueZ closes its end.
            var queued: [UInt8] = [0x01, 0x02, 0x00, 0x01]
            #expect(write(first.fd, &queued, queued.count) == queued.count)
            let again = try bluez.acquire("AcquireWrite", mtu: 247, from: name)
            #expect(again.mtu == 247)
            var late: [UInt8] = [0x00, 0x00]
            #expect(write(first.fd, &late, late.count) == late.count)
            var third: [UInt8] = [0x06]
            #expect(write(again.fd, &third, 1) == 1)
            #expect(eventually { Set(events.writes.all.suffix(2)) == ["dev_00_00_00_02_00_01 0000 command", "dev_00_00_00_02_00_01 06 command"] })
            #expect(events.writes.all.count == 5 && events.writes.all[2] == "dev_00_00_00_02_00_01 01020001 command", "\(events.writes.all)")
            close(first.fd)
            #expect(bluez.characteristicProperty("WriteAcquired", of: name) == true, "the old socket's end released nothing")

            // BlueZ closing its end releases the acquisition but not the session.
            close(again.fd)
            #expect(eventually { bluez.characteristicProperty("WriteAcquired", of: name) == false })
            #expect(events.disconnects.all.isEmpty)
            bluez.disconnectCentral()
            #expect(eventually { events.disconnects.all == ["dev_00_00_00_02_00_01"] })
        }
    }

    @Test func acquiredNotifySocketsCarryEachCentralsOwnNotifications() throws {
        try withAdvertisingPeripheral { bluez, ble, events in
            let name = try bluez.peripheralName()
            let centralA = FakeBlueZ.centralA
            let centralB = FakeBlueZ.centralB
            let a = try bluez.acquire("AcquireNotify", central: centralA, mtu: 23, from: name)
            let b = try bluez.acquire("AcquireNotify", central: centralB, mtu: 23, from: name)
            defer { close(b.fd) }
            #expect(eventually { bluez.characteristicProperty("NotifyAcquired", of: name) == true })

            // An ERROR caused by A goes to A only.
            ble.notify([0xFF, 0x01, 0x09], central: centralA)
            #expect(Self.receive(a.fd) == [0xFF, 0x01, 0x09])
            ble.notify([0xFF, 0x02, 0x09], central: centralB)
            #expect(Self.receive(b.fd) == [0xFF, 0x02, 0x09])

            // A frame longer than ATT_MTU - 3 is split into notifications of 20 bytes.
            let long = (0..<30).map { UInt8($0) }
            ble.notify(long, central: centralA)
            // A's socket keeps the order they were sent in: had B's error
            // reached A, it would come first.
            #expect(Self.receive(a.fd) == Array(long.prefix(20)), "B's error reached A")
            #expect(Self.receive(a.fd) == Array(long.suffix(10)))

            // No central: everyone.
            ble.notify([0x01], central: nil)
            #expect(Self.receive(a.fd) == [0x01])
            #expect(Self.receive(b.fd) == [0x01])
            #expect(eventually { ble.status.statistics.notifications == 4 })

            // A disconnect closes that central's socket.
            try bluez.write([0x00, 0x00], type: "command", to: name)
            bluez.disconnectCentral()
            #expect(eventually { events.disconnects.all == ["dev_00_00_00_02_00_01"] })
            #expect(Self.receive(a.fd) == nil)
            close(a.fd)
            ble.notify([0x02], central: centralB)
            #expect(Self.receive(b.fd) == [0x02])
        }
    }

    @Test func authenticatedSecurityRegistersADisplayOnlyAgentThatShowsThePasskey() throws {
        try withAdvertisingPeripheral(security: .authenticated) { bluez, ble, events in
            #expect(bluez.agents.all == ["register /org/blecontrol/agent DisplayOnly", "default /org/blecontrol/agent"])
            let name = try bluez.peripheralName()
            let flags = try bluez.connection.callAndWait(destination: name, path: BLEPeripheral.characteristicPath, interface: "org.freedesktop.DBus.Properties", method: "Get",
                                                         arguments: [.string("org.bluez.GattCharacteristic1"), .string("Flags")], timeout: Patience.time).first?.arrayValue?.compactMap(\.stringValue) ?? []
            #expect(flags.contains("encrypt-authenticated-write") && flags.contains("encrypt-authenticated-notify"))

            let device = "/org/bluez/hci0/dev_00_00_00_02_00_01"
            func agent(_ method: String, _ arguments: [DBusValue]) throws {
                _ = try bluez.connection.callAndWait(destination: name, path: BLEPeripheral.agentPath, interface: "org.bluez.Agent1", method: method, arguments: arguments, timeout: Patience.time)
            }
            // Passkey entry: shown once while the central types it, gone once paired.
            try agent("DisplayPasskey", [.objectPath(device), .uint32(4321), .uint16(0)])
            try agent("DisplayPasskey", [.objectPath(device), .uint32(4321), .uint16(3)])
            #expect(events.passkeys.all == ["dev_00_00_00_02_00_01 004321"])
            // That pairing failed, and the phone tries again on the same link
            // (bluetoothd cancels nothing at a display): the new passkey
            // replaces the one the user could no longer use.
            try agent("DisplayPasskey", [.objectPath(device), .uint32(20344), .uint16(0)])
            #expect(events.passkeys.all == ["dev_00_00_00_02_00_01 004321", "dev_00_00_00_02_00_01 020344"])
            // Also in status, for a board without an LCD.
            #expect(ble.stateDescription.contains("pairing: passkey 020344"))
            bluez.connection.emitPropertiesChanged(path: device, interface: "org.bluez.Device1", changed: [("Paired", .bool(true))])
            #expect(eventually { events.passkeys.all.count == 3 })
            #expect(events.passkeys.all.last == "dev_00_00_00_02_00_01 -")
            #expect(!ble.stateDescription.contains("passkey"))

            // Numeric comparison is shown and accepted; Cancel restores the display.
            try agent("RequestConfirmation", [.objectPath(device), .uint32(987654)])
            try agent("Cancel", [])
            #expect(events.passkeys.all.suffix(2) == ["dev_00_00_00_02_00_01 987654", "dev_00_00_00_02_00_01 -"])

            // A display-only board types nothing, and Just Works is not MITM-safe.
            for (method, arguments) in [("RequestPasskey", [DBusValue.objectPath(device)]), ("RequestPinCode", [.objectPath(device)]), ("RequestAuthorization", [.objectPath(device)])] {
                do {
                    try agent(method, arguments)
                    Issue.record("\(method) was accepted")
                } catch let failure as DBusFailure {
                    #expect(failure.name == "org.bluez.Error.Rejected")
                }
            }
            try agent("Release", [])
        }
    }

    /// bluetoothd asks the default agent to authorise a Just Works pairing
    /// a central starts, and without an agent it neither accepts the
    /// pairing nor bonds (found in the image tier: "No agent available",
    /// SMP "Numeric comparison failed"): `encrypted` registers a
    /// NoInputNoOutput agent that says yes, and still types nothing.
    @Test func encryptedSecurityRegistersAJustWorksAgentThatAcceptsThePairing() throws {
        try withAdvertisingPeripheral(security: .encrypted) { bluez, _, events in
            #expect(bluez.agents.all == ["register /org/blecontrol/agent NoInputNoOutput", "default /org/blecontrol/agent"])
            let name = try bluez.peripheralName()
            let device = "/org/bluez/hci0/dev_00_00_00_02_00_01"
            func agent(_ method: String, _ arguments: [DBusValue]) throws {
                _ = try bluez.connection.callAndWait(destination: name, path: BLEPeripheral.agentPath, interface: "org.bluez.Agent1", method: method, arguments: arguments, timeout: Patience.time)
            }
            try agent("RequestAuthorization", [.objectPath(device)])
            for (method, arguments) in [("RequestPasskey", [DBusValue.objectPath(device)]), ("RequestPinCode", [.objectPath(device)])] {
                do {
                    try agent(method, arguments)
                    Issue.record("\(method) was accepted")
                } catch let failure as DBusFailure {
                    #expect(failure.name == "org.bluez.Error.Rejected")
                }
            }
            #expect(events.passkeys.all.isEmpty)
        }
    }

    @Test func openSecurityRegistersNoAgent() throws {
        try withAdvertisingPeripheral(security: .open) { bluez, _, _ in
            #expect(bluez.agents.all.isEmpty)
        }
    }

    @Test func advertisesFastThenSlowAndFastAgainWhenTheLastCentralLeaves() throws {
        guard let bus = try PrivateBus.start() else { return }
        defer { bus.stop() }
        let bluez = try FakeBlueZ(address: bus.address)
        defer { bluez.close() }
        let events = Events()
        // A fast period far shorter than the time bluetoothd takes to read
        // the advertisement: the period counts from when bluetoothd holds
        // the fast advertisement, so the order below is the same however
        // slow the machine (the test waits for the order of events, never
        // for a time).
        bluez.advertisementReadDelay.value = .milliseconds(20)
        let ble = try peripheral(bus, events: events, fastAdvertisingPeriod: .milliseconds(1))
        ble.start()
        defer { ble.stop() }
        // Fast at first, then slow (registered again with the new interval).
        #expect(eventually { bluez.intervals.all == ["20-30", "152-211"] })
        #expect(ble.stateDescription.hasPrefix("advertising as Test-Board"))
        // A central comes and goes: fast again, then slow again.
        try bluez.write([0x02, 0x03, 0x00, 0x01, 0xF4], type: "command", to: try bluez.peripheralName())
        #expect(eventually { events.writes.all.count == 1 })
        bluez.disconnectCentral()
        #expect(eventually { bluez.intervals.all == ["20-30", "152-211", "20-30", "152-211"] })
        #expect(ble.stateDescription.hasPrefix("advertising as Test-Board"))
        // Re-registering the advertisement is not a new registration.
        #expect(ble.status.statistics.registrations == 1)
    }

    /// A daemon stopped while bluetoothd had not answered its
    /// RegisterAdvertisement (seen in the image test: a restart 0.4 s after
    /// the switch to the slow interval, then ActiveInstances 2 for good).
    @Test func stoppingWhileTheAdvertisementIsBeingRegisteredUnregistersIt() throws {
        guard let bus = try PrivateBus.start() else { return }
        defer { bus.stop() }
        let bluez = try FakeBlueZ(address: bus.address)
        defer { bluez.close() }
        bluez.holdAdvertisements.value = true
        let ble = try peripheral(bus, events: Events())
        ble.start()
        let path = BLEPeripheral.advertisementPath
        #expect(eventually { bluez.advertisingCalls.all == ["register \(path)"] })
        ble.stop()
        #expect(eventually { bluez.advertisingCalls.all == ["register \(path)", "unregister \(path)"] })
    }

    @Test func theServicesAskForFixedHandlesAndLetBluetoothdChooseWhenTheyAreTaken() throws {
        try withAdvertisingPeripheral { bluez, _, _ in
            // FFE0 at 0x8000, Device Information at 0x8010: the same every run.
            #expect(bluez.serviceHandles.all == ["32768,32784"])
        }
        guard let bus = try PrivateBus.start() else { return }
        defer { bus.stop() }
        let bluez = try FakeBlueZ(address: bus.address)
        defer { bluez.close() }
        bluez.handlesTaken = true
        let ble = try peripheral(bus, events: Events())
        ble.start()
        defer { ble.stop() }
        // Refused with them, registered without: on the air all the same.
        #expect(eventually { ble.stateDescription.hasPrefix("advertising as Test-Board") })
        #expect(bluez.serviceHandles.all == ["32768,32784", "0,0"])
    }

    @Test func forgetBondsRemovesEveryPairedDeviceOfTheAdapter() throws {
        try withAdvertisingPeripheral(security: .authenticated) { bluez, ble, _ in
            let result = Collected<String>()
            ble.forgetBonds { outcome in
                switch outcome {
                case .success(let addresses): result.append(addresses.joined(separator: ","))
                case .failure(let failure): result.append("failed: \(failure)")
                }
            }
            #expect(eventually { result.all.count == 1 })
            // Central A is paired, central B is not: only A goes.
            #expect(result.all == ["00:00:00:02:00:01"])
            #expect(bluez.removed.all == [FakeBlueZ.centralA])
        }
    }

    @Test func beforeAPairingTheCentralsThatLeftUnbondedAreRemoved() throws {
        try withAdvertisingPeripheral(security: .authenticated) { bluez, _, _ in
            let name = try bluez.peripheralName()
            // B leaves without a bond; A (paired) stays connected. (Signals
            // and calls from one connection arrive in order: no wait needed.)
            bluez.disconnectCentral(FakeBlueZ.centralB)
            _ = try bluez.connection.callAndWait(destination: name, path: BLEPeripheral.agentPath, interface: "org.bluez.Agent1", method: "DisplayPasskey",
                                                 arguments: [.objectPath(FakeBlueZ.centralA), .uint32(4321), .uint16(0)], timeout: Patience.time)
            #expect(eventually { bluez.removed.all == [FakeBlueZ.centralB] }, "\(bluez.removed.all)")
            // A bonded central that leaves is kept.
            bluez.disconnectCentral(FakeBlueZ.centralA)
            bluez.connection.emitPropertiesChanged(path: FakeBlueZ.centralB, interface: "org.bluez.Device1", changed: [("Connected", .bool(true))])
            // A round trip after the signal: the peripheral has acted on it.
            _ = bluez.characteristicProperty("Notifying", of: name)
            #expect(bluez.removed.all == [FakeBlueZ.centralB])
        }
        // Open: nobody pairs, nothing is removed.
        try withAdvertisingPeripheral { bluez, ble, _ in
            bluez.disconnectCentral(FakeBlueZ.centralB)
            bluez.connection.emitPropertiesChanged(path: FakeBlueZ.centralA, interface: "org.bluez.Device1", changed: [("Connected", .bool(true))])
            _ = bluez.characteristicProperty("Notifying", of: try bluez.peripheralName())
            #expect(ble.stateDescription.contains("advertising"))
            #expect(bluez.removed.all.isEmpty)
        }
    }

    @Test func withoutAcquireWriteEveryWriteStaysOnWriteValue() throws {
        try withAdvertisingPeripheral(acquireWrite: false) { bluez, ble, events in
            let name = try bluez.peripheralName()
            // bluetoothd looks for the property before it tries AcquireWrite.
            #expect(bluez.characteristicProperty("WriteAcquired", of: name) == nil)
            #expect(throws: DBusFailure.self) { try bluez.acquire("AcquireWrite", from: name) }
            #expect(bluez.characteristicProperty("NotifyAcquired", of: name) == false)
        }
    }

    @Test func theAllowListRefusesAcquireWrite() throws {
        try withAdvertisingPeripheral(allow: ["AA:BB:CC:DD:EE:FF"]) { bluez, ble, events in
            let name = try bluez.peripheralName()
            do {
                _ = try bluez.acquire("AcquireWrite", from: name)
                Issue.record("AcquireWrite from a central outside ble.allow was accepted")
            } catch let failure as DBusFailure {
                #expect(failure.name == "org.bluez.Error.NotAuthorized")
            }
            #expect(eventually { ble.stateDescription.contains("1 writes refused") })
        }
    }

    @Test func onlyBluetoothdMayCallTheGATTObjects() throws {
        try withAdvertisingPeripheral { bluez, ble, events in
            let name = try bluez.peripheralName()
            // Another connection on the same bus: not the owner of org.bluez.
            let loop = try testLoop()
            defer { loop.stop() }
            let stranger = try DBusConnection(address: bluez.connection.address, loop: loop, logger: logger)
            defer { stranger.close() }
            do {
                _ = try stranger.callAndWait(destination: name, path: BLEPeripheral.characteristicPath, interface: "org.bluez.GattCharacteristic1", method: "WriteValue",
                                             arguments: [.bytes([0x01, 0x02, 0x00, 0x01]), .properties([("device", .objectPath(FakeBlueZ.centralA))])], timeout: Patience.time)
                Issue.record("a caller that is not bluetoothd drove the outputs")
            } catch let failure as DBusFailure {
                #expect(failure.name == DBusFailure.accessDenied)
            }
            #expect(events.writes.all.isEmpty)
            #expect(eventually { ble.status.statistics.deniedCallers == 1 })
        }
    }

    /// Any local user may send a unicast signal to the daemon (the system
    /// bus's default policy); only the daemon can check who sent it.
    @Test func signalsFromImpostorsOfTheBusAndOfBluetoothdChangeNothing() throws {
        try withAdvertisingPeripheral { bluez, ble, events in
            let name = try bluez.peripheralName()
            try bluez.write([0x01, 0x02, 0x00, 0x01], type: "command", to: name)
            let loop = try testLoop()
            defer { loop.stop() }
            let stranger = try DBusConnection(address: bluez.connection.address, loop: loop, logger: logger)
            defer { stranger.close() }
            // "bluetoothd is gone", then "a stranger owns org.bluez".
            stranger.emitSignal(path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", member: "NameOwnerChanged",
                                arguments: [.string("org.bluez"), .string(bluez.connection.uniqueName), .string("")], destination: name)
            stranger.emitSignal(path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", member: "NameOwnerChanged",
                                arguments: [.string("org.bluez"), .string(""), .string(stranger.uniqueName)], destination: name)
            // "The central left" and "a new central connected".
            stranger.emitSignal(path: FakeBlueZ.centralA, interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged",
                                arguments: [.string("org.bluez.Device1"), .properties([("Connected", .bool(false))]), .strings([])], destination: name)
            stranger.emitSignal(path: "/", interface: "org.freedesktop.DBus.ObjectManager", member: "InterfacesAdded",
                                arguments: [.objectPath("/org/bluez/hci0/dev_66_66_66_66_66_66"),
                                            .dictionary(key: "s", value: "a{sv}", [DBusEntry(.string("org.bluez.Device1"), .properties([("Connected", .bool(true)), ("Address", .string("66:66:66:66:66:66"))]))])],
                                destination: name)
            // Synchronised on the outcome: all four were seen and dropped.
            #expect(eventually { ble.status.statistics.spoofedSignals == 4 })
            #expect(ble.stateDescription.hasPrefix("advertising"), "\(ble.stateDescription)")
            #expect(ble.stateDescription.contains("4 signals ignored"))
            #expect(events.disconnects.all.isEmpty, "a stranger's PropertiesChanged ended a central's session")
            // bluetoothd is still believed and served: its next write is taken.
            try bluez.write([0x02, 0x03, 0x00, 0x01, 0xF4], type: "command", to: name)
            #expect(eventually { events.writes.all.count == 2 })
            // The stranger is not: it still may not call, and a device it
            // announced gets no session.
            #expect(throws: DBusFailure.self) {
                _ = try stranger.callAndWait(destination: name, path: BLEPeripheral.characteristicPath, interface: "org.bluez.GattCharacteristic1", method: "WriteValue",
                                             arguments: [.bytes([0x00, 0x00]), .properties([("device", .objectPath(FakeBlueZ.centralA))])], timeout: Patience.time)
            }
            #expect(throws: DBusFailure.self) { try bluez.write([0x00, 0x00], type: "command", to: name, device: "/org/bluez/hci0/dev_66_66_66_66_66_66") }
            #expect(events.writes.all.count == 2)
        }
    }

    @Test func writesLongerThanAnATTValueAreRefused() throws {
        try withAdvertisingPeripheral { bluez, ble, events in
            let name = try bluez.peripheralName()
            do {
                try bluez.write([UInt8](repeating: 0, count: 513), type: "command", to: name)
                Issue.record("a 513-byte write was accepted")
            } catch let failure as DBusFailure {
                #expect(failure.name == "org.bluez.Error.InvalidValueLength")
            }
            try bluez.write([UInt8](repeating: 0, count: 512), type: "command", to: name)
            #expect(events.writes.all.count == 1)
            #expect(ble.status.statistics.oversized == 1)
        }
    }

    @Test func aDeviceBluetoothdDoesNotReportConnectedGetsNoSession() throws {
        try withAdvertisingPeripheral { bluez, ble, events in
            let name = try bluez.peripheralName()
            for device in ["/org/bluez/hci0/dev_11_22_33_44_55_66", "/org/bluez/hci1/dev_00_00_00_02_00_01", "/made/up"] {
                do {
                    try bluez.write([0x00, 0x00], type: "command", to: name, device: device)
                    Issue.record("a write for \(device) was accepted")
                } catch let failure as DBusFailure {
                    #expect(failure.name == "org.bluez.Error.NotPermitted" || failure.name == "org.bluez.Error.InvalidArguments")
                }
            }
            bluez.disconnectCentral(FakeBlueZ.centralB)
            #expect(throws: DBusFailure.self) { try bluez.write([0x00, 0x00], type: "command", to: name, device: FakeBlueZ.centralB) }
            #expect(events.writes.all.isEmpty)
            try bluez.write([0x00, 0x00], type: "command", to: name)
            #expect(events.writes.all.count == 1)
        }
    }

    @Test func theAllowListUsesBluetoothdsAddressNotTheCallersOptions() throws {
        // centralA is 00:00:00:02:00:01; allowing centralB's address must not
        // let a write naming centralA through, whatever its options say.
        try withAdvertisingPeripheral(allow: ["00:00:00:03:00:01"]) { bluez, ble, events in
            let name = try bluez.peripheralName()
            #expect(throws: DBusFailure.self) { try bluez.write([0x00, 0x00], type: "command", to: name, device: FakeBlueZ.centralA) }
            try bluez.write([0x00, 0x00], type: "command", to: name, device: FakeBlueZ.centralB)
            #expect(events.writes.all == ["dev_00_00_00_03_00_01 0000 command"])
        }
    }
}
