#if canImport(Glibc)
import Glibc
#endif
import BlueZ
import Foundation
import Testing

/// A minimal bluetoothd on the private bus: one adapter with GattManager1
/// and LEAdvertisingManager1 that read back what the peripheral exports,
/// the way bluetoothd does.
final class FakeBlueZ: @unchecked Sendable {
    let connection: DBusConnection
    let registered = Collected<String>()
    var powered = false
    private let poweredLock = NSLock()

    init(address: String) throws {
        connection = try DBusConnection(address: address, logger: logger)
        let adapter = DBusInterface("org.bluez.Adapter1")
        adapter.property("Address", "s", get: { .string("00:00:00:01:00:01") })
        adapter.property("Powered", "b", get: { [unowned self] in .bool(poweredLock.withLock { powered }) }, set: { [unowned self] value in
            poweredLock.withLock { powered = value.boolValue ?? false }
            connection.emitPropertiesChanged(path: "/org/bluez/hci0", interface: "org.bluez.Adapter1", changed: [("Powered", value)])
        })
        let gatt = DBusInterface("org.bluez.GattManager1")
        gatt.method("RegisterApplication", in: "oa{sv}") { [unowned self] call in
            let root = call.arguments[0].stringValue ?? "/"
            connection.call(destination: call.sender, path: root, interface: "org.freedesktop.DBus.ObjectManager", method: "GetManagedObjects") { result in
                guard case .success(let values) = result, let objects = values.first?.dictionaryValue else { return call.fail("org.bluez.Error.Failed", "no objects") }
                let uuids = objects.values.compactMap { $0.dictionaryValue?["org.bluez.GattCharacteristic1"]?.dictionaryValue?["UUID"]?.stringValue }
                self.registered.append("app " + uuids.sorted().joined(separator: ","))
                call.reply()
            }
        }
        let advertising = DBusInterface("org.bluez.LEAdvertisingManager1")
        advertising.method("RegisterAdvertisement", in: "oa{sv}") { [unowned self] call in
            let path = call.arguments[0].stringValue ?? "/"
            connection.call(destination: call.sender, path: path, interface: "org.freedesktop.DBus.Properties", method: "GetAll", arguments: [.string("org.bluez.LEAdvertisement1")]) { result in
                guard case .success(let values) = result, let properties = values.first?.dictionaryValue else { return call.fail("org.bluez.Error.Failed", "no properties") }
                self.registered.append("adv \(properties["LocalName"]?.stringValue ?? "?") discoverable=\(properties["Discoverable"]?.boolValue ?? false)")
                call.reply()
            }
        }
        advertising.method("UnregisterAdvertisement", in: "o") { call in call.reply() }
        gatt.method("UnregisterApplication", in: "o") { call in call.reply() }
        connection.exportObjectManager(at: "/")
        connection.export(path: "/org/bluez/hci0", interfaces: [adapter, gatt, advertising])
        let box = Collected<Bool>()
        connection.requestName("org.bluez") { result in box.append((try? result.get()) ?? false) }
        _ = eventually { box.all == [true] }
    }

    /// Writes to the peripheral's FFE1 as bluetoothd does for a central.
    func write(_ bytes: [UInt8], type: String?, to peripheral: String) throws {
        var options: [(String, DBusValue)] = [("device", .objectPath("/org/bluez/hci0/dev_00_00_00_02_00_01")), ("mtu", .uint16(517))]
        if let type { options.append(("type", .string(type))) }
        _ = try connection.callAndWait(destination: peripheral, path: BLEPeripheral.characteristicPath, interface: "org.bluez.GattCharacteristic1",
                                       method: "WriteValue", arguments: [.bytes(bytes), .properties(options)])
    }

    func disconnectCentral() {
        connection.emitPropertiesChanged(path: "/org/bluez/hci0/dev_00_00_00_02_00_01", interface: "org.bluez.Device1", changed: [("Connected", .bool(false))])
    }
}

@Suite(.serialized, .enabled(if: PrivateBus.available, "dbus-daemon is not installed"))
struct BLEPeripheralTests {
    final class Events: @unchecked Sendable {
        let writes = Collected<String>()
        let disconnects = Collected<String>()
        /// Pending acknowledgements of writes with response.
        let acks = Collected<@Sendable (String?) -> Void>()
    }

    func peripheral(_ bus: PrivateBus, events: Events, allow: [String] = []) -> BLEPeripheral {
        BLEPeripheral(
            configuration: .init(name: "Test-Board", adapter: "hci0", powerOn: true, allow: allow, busAddress: bus.address),
            handlers: .init(
                write: { central, bytes, withResponse, done in
                    events.writes.append("\(central.split(separator: "/").last ?? "") \(bytes.map { String(format: "%02x", $0) }.joined()) \(withResponse ? "request" : "command")")
                    if withResponse { events.acks.append(done) }
                },
                disconnected: { central in events.disconnects.append(String(central.split(separator: "/").last ?? "")) }
            ),
            logger: logger
        )
    }

    @Test func withoutBlueZItSaysSoAndRegistersWhenBlueZArrives() throws {
        guard let bus = try PrivateBus.start() else { return }
        defer { bus.stop() }
        let events = Events()
        let ble = peripheral(bus, events: events)
        ble.start()
        defer { ble.stop() }
        #expect(eventually { ble.state.contains("no BlueZ on the system bus") })
        let bluez = try FakeBlueZ(address: bus.address)
        defer { bluez.connection.close() }
        // Powered off at first: ble.power_on switches it on, then it registers.
        #expect(eventually { ble.state.hasPrefix("advertising as Test-Board on hci0") })
        #expect(bluez.powered)
        #expect(bluez.registered.all == ["app 00002a24-0000-1000-8000-00805f9b34fb,00002a26-0000-1000-8000-00805f9b34fb,00002a29-0000-1000-8000-00805f9b34fb,0000ffe1-0000-1000-8000-00805f9b34fb", "adv Test-Board discoverable=true"])
    }

    @Test func aWriteWithResponseIsAnsweredOnlyOnceApplied() throws {
        guard let bus = try PrivateBus.start() else { return }
        defer { bus.stop() }
        let bluez = try FakeBlueZ(address: bus.address)
        defer { bluez.connection.close() }
        let events = Events()
        let ble = peripheral(bus, events: events)
        ble.start()
        defer { ble.stop() }
        #expect(eventually { ble.state.hasPrefix("advertising") })
        let name = try bluez.connection.callAndWait(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", method: "ListNames")
            .first?.arrayValue?.compactMap(\.stringValue).filter { $0.hasPrefix(":") && $0 != bluez.connection.uniqueName } ?? []
        // The peripheral is the only other client on this bus.
        let peripheralName = try #require(name.first { candidate in
            (try? bluez.connection.callAndWait(destination: candidate, path: BLEPeripheral.characteristicPath, interface: "org.freedesktop.DBus.Properties", method: "Get",
                                               arguments: [.string("org.bluez.GattCharacteristic1"), .string("UUID")])) != nil
        })

        try bluez.write([0x02, 0x03, 0x00, 0x01, 0xF4], type: "command", to: peripheralName)
        let answered = Collected<Bool>()
        let writer = Thread {
            do {
                try bluez.write([0x05, 0x00], type: nil, to: peripheralName)  // BlueZ 5.66: no type → request
                answered.append(true)
            } catch { answered.append(false) }
        }
        writer.start()
        #expect(eventually { events.acks.all.count == 1 })
        usleep(100_000)
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

    @Test func aBlueZRestartRegistersAgain() throws {
        guard let bus = try PrivateBus.start() else { return }
        defer { bus.stop() }
        let first = try FakeBlueZ(address: bus.address)
        let events = Events()
        let ble = peripheral(bus, events: events)
        ble.start()
        defer { ble.stop() }
        #expect(eventually { ble.state.hasPrefix("advertising") })
        first.connection.close()
        #expect(eventually { ble.state.contains("no BlueZ on the system bus") })
        let started = ContinuousClock.now
        let second = try FakeBlueZ(address: bus.address)
        defer { second.connection.close() }
        #expect(eventually { ble.state.hasPrefix("advertising") && second.registered.all.count == 2 })
        #expect(started.duration(to: .now) < .seconds(2))
    }

    @Test func theAllowListRefusesOthers() throws {
        guard let bus = try PrivateBus.start() else { return }
        defer { bus.stop() }
        let bluez = try FakeBlueZ(address: bus.address)
        defer { bluez.connection.close() }
        let events = Events()
        let ble = peripheral(bus, events: events, allow: ["AA:BB:CC:DD:EE:FF"])
        ble.start()
        defer { ble.stop() }
        #expect(eventually { ble.state.hasPrefix("advertising") })
        let names = try bluez.connection.callAndWait(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", method: "ListNames")
            .first?.arrayValue?.compactMap(\.stringValue).filter { $0.hasPrefix(":") && $0 != bluez.connection.uniqueName } ?? []
        var refused = 0
        for name in names {
            do { try bluez.write([0x00, 0x00], type: "command", to: name) } catch let failure as DBusFailure where failure.name == "org.bluez.Error.NotAuthorized" { refused += 1 } catch {}
        }
        #expect(refused == 1)
        #expect(events.writes.all.isEmpty)
        #expect(ble.state.contains("1 writes refused"))
    }
}
