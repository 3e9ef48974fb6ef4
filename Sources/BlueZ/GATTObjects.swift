import DBus

/// The D-Bus objects of the board's GATT application, advertisement and
/// pairing agent (BlueZ's doc/org.bluez.GattService.rst,
/// org.bluez.GattCharacteristic.rst, org.bluez.LEAdvertisement.rst and
/// org.bluez.Agent.rst), built from closures so they hold no state of
/// their own: the peripheral owns the state, these describe it.
enum GATTObjects {
    static let serviceUUID = "0000ffe0-0000-1000-8000-00805f9b34fb"
    static let characteristicUUID = "0000ffe1-0000-1000-8000-00805f9b34fb"
    static let deviceInformationUUID = "0000180a-0000-1000-8000-00805f9b34fb"

    static let applicationPath = "/org/blecontrol/gatt"
    static let servicePath = applicationPath + "/service0"
    static let characteristicPath = servicePath + "/char0"
    static let deviceInformationPath = applicationPath + "/service1"
    static let advertisementPath = "/org/blecontrol/advertisement0"
    static let agentPath = "/org/blecontrol/agent"
    static let characteristicInterface = "org.bluez.GattCharacteristic1"

    /// Where the services go in bluetoothd's database: fixed handles, so a
    /// bonded phone's cached handles stay true across restarts of the
    /// daemon, reloads and upgrades. Left to bluetoothd (Handle 0), a new
    /// registration lands after the highest handle its database has ever
    /// used (src/shared/gatt-db.c, gatt_db_insert_service: next_handle only
    /// grows), so every restart of the daemon would move FFE1. 0x8000 is far
    /// above what bluetoothd and its plugins take at start (5.82's audio
    /// plugins register a few dozen handles), and leaves the range above it
    /// for other applications. The characteristics follow in order.
    static let serviceHandle: UInt16 = 0x8000
    static let deviceInformationHandle: UInt16 = 0x8010

    /// A primary service; `handle` nil: wherever bluetoothd puts it.
    static func service(uuid: String, handle: @escaping () -> UInt16?) -> DBusInterface {
        let service = DBusInterface("org.bluez.GattService1")
        service.property("UUID", "s", get: { .string(uuid) })
        service.property("Primary", "b", get: { .bool(true) })
        // bluetoothd reads it at registration and writes back where it put
        // the service (gatt-database.c, write_handle): 0 asks it to choose.
        service.property("Handle", "q", get: { .uint16(handle() ?? 0) }, set: { _ in })
        return service
    }

    /// FFE1's flags: what a central may do, and what link it needs.
    static func flags(security: BLEPeripheral.Security, writeWithoutResponse: Bool) -> [String] {
        var flags = ["write"]
        // Without write-without-response, bluetoothd waits for our WriteValue
        // reply before it answers any write (gatt-database.c chrc_write_cb
        // passes a pending-write queue only then), so every acknowledgement
        // means "applied". The price: the app's servo frames, sent without
        // response, are refused by the central's stack.
        if writeWithoutResponse { flags.append("write-without-response") }
        flags.append("notify")
        switch security {
        case .open: break
        // encrypt-notify / encrypt-authenticated-notify guard the CCC write
        // (subscribing); BlueZ ≥ 5.62 knows them. Reads are refused anyway.
        case .encrypted: flags += ["encrypt-write", "encrypt-notify"]
        case .authenticated: flags += ["encrypt-authenticated-write", "encrypt-authenticated-notify"]
        }
        return flags
    }

    /// What the serial characteristic asks of its owner.
    struct SerialHandlers {
        var notifying: () -> Bool
        var value: () -> [UInt8]
        var writeAcquired: () -> Bool
        var notifyAcquired: () -> Bool
        var writeValue: (DBusMethodCall) -> Void
        var acquire: (DBusMethodCall, _ notify: Bool) -> Void
        var setNotifying: (Bool) -> Void
    }

    static func serialCharacteristic(flags: [String], acquireWrite: Bool, _ handlers: SerialHandlers) -> DBusInterface {
        let characteristic = DBusInterface(characteristicInterface)
        characteristic.property("UUID", "s", get: { .string(characteristicUUID) })
        characteristic.property("Service", "o", get: { .objectPath(servicePath) })
        characteristic.property("Flags", "as", get: { .strings(flags) })
        characteristic.property("Notifying", "b", get: { .bool(handlers.notifying()) })
        characteristic.property("Value", "ay", get: { .bytes(handlers.value()) })
        // BlueZ (and BlueZoo) try AcquireWrite only when the property exists.
        if acquireWrite {
            characteristic.property("WriteAcquired", "b", get: { .bool(handlers.writeAcquired()) })
            characteristic.method("AcquireWrite", in: "a{sv}", out: "hq") { call in handlers.acquire(call, false) }
        }
        characteristic.property("NotifyAcquired", "b", get: { .bool(handlers.notifyAcquired()) })
        characteristic.method("WriteValue", in: "aya{sv}") { call in handlers.writeValue(call) }
        characteristic.method("AcquireNotify", in: "a{sv}", out: "hq") { call in handlers.acquire(call, true) }
        characteristic.method("StartNotify") { call in
            handlers.setNotifying(true)
            call.reply()
        }
        characteristic.method("StopNotify") { call in
            handlers.setNotifying(false)
            call.reply()
        }
        characteristic.method("ReadValue", in: "a{sv}", out: "ay") { call in
            call.fail("org.bluez.Error.NotPermitted", "FFE1 is write and notify only")
        }
        return characteristic
    }

    static func readOnlyCharacteristic(uuid: String, service: String, value: [UInt8]) -> DBusInterface {
        let characteristic = DBusInterface(characteristicInterface)
        characteristic.property("UUID", "s", get: { .string(uuid) })
        characteristic.property("Service", "o", get: { .objectPath(service) })
        characteristic.property("Flags", "as", get: { .strings(["read"]) })
        characteristic.method("ReadValue", in: "a{sv}", out: "ay") { call in
            let offset = call.arguments.first?.dictionaryValue?["offset"]?.integerValue ?? 0
            guard offset >= 0, offset <= value.count else { return call.fail("org.bluez.Error.InvalidOffset", "offset \(offset) past \(value.count) bytes") }
            call.reply([.bytes(Array(value[offset...]))])
        }
        return characteristic
    }

    /// The Device Information service's strings: manufacturer (2A29),
    /// model (2A24), firmware revision (2A26).
    static func deviceInformation(manufacturer: String, model: String, firmware: String,
                                  handle: @escaping () -> UInt16?) -> [(path: String, interfaces: [DBusInterface])] {
        var objects: [(String, [DBusInterface])] = [(deviceInformationPath, [service(uuid: deviceInformationUUID, handle: handle)])]
        for (index, (uuid, text)) in [("2a29", manufacturer), ("2a24", model), ("2a26", firmware)].enumerated() {
            objects.append((deviceInformationPath + "/char\(index)",
                            [readOnlyCharacteristic(uuid: "0000\(uuid)-0000-1000-8000-00805f9b34fb", service: deviceInformationPath, value: Array(text.utf8))]))
        }
        return objects
    }

    static func advertisement(name: String, interval: @escaping () -> (min: UInt32, max: UInt32),
                              released: @escaping () -> Void) -> DBusInterface {
        let advertisement = DBusInterface("org.bluez.LEAdvertisement1")
        advertisement.property("Type", "s", get: { .string("peripheral") })
        advertisement.property("MinInterval", "u", get: { .uint32(interval().min) })
        advertisement.property("MaxInterval", "u", get: { .uint32(interval().max) })
        advertisement.property("ServiceUUIDs", "as", get: { .strings([serviceUUID]) })
        advertisement.property("LocalName", "s", get: { .string(name) })
        // BlueZoo (and some scanners' filters) want an explicitly discoverable advertisement.
        advertisement.property("Discoverable", "b", get: { .bool(true) })
        advertisement.method("Release") { call in
            call.reply()
            released()
        }
        return advertisement
    }

    /// org.bluez.Agent1 for a board that can display but not type or
    /// confirm. Requests for input are rejected. Just Works (bluetoothd's
    /// RequestAuthorization) is accepted with `justWorks` (`ble.security:
    /// encrypted`), refused otherwise: it is not MITM-protected (Core 5.3
    /// Vol 3 Part H 2.3.5.1).
    static func agent(justWorks: Bool, show: @escaping (_ device: String, _ passkey: String) -> Void, showing: @escaping () -> (device: String, passkey: String)?, end: @escaping () -> Void, released: @escaping () -> Void) -> DBusInterface {
        let agent = DBusInterface("org.bluez.Agent1")
        agent.method("Release") { call in
            call.reply()
            // bluetoothd unregistered us (another default agent, or shutdown).
            released()
            end()
        }
        agent.method("DisplayPasskey", in: "ouq") { call in
            defer { call.reply() }
            guard let device = call.arguments[0].stringValue, case .uint32(let passkey) = call.arguments[1] else { return }
            // Called again, with the same passkey, as the central types each
            // digit (`entered`): show it once. A new passkey for the same
            // device is a new pairing on the same link (a phone that failed
            // once and tries again; bluetoothd sends no Cancel for a
            // display): it replaces the old one.
            let digits = sixDigits(passkey)
            if let shown = showing(), shown.device == device, shown.passkey == digits { return }
            show(device, digits)
        }
        agent.method("DisplayPinCode", in: "os") { call in
            defer { call.reply() }
            guard let device = call.arguments[0].stringValue, let pin = call.arguments[1].stringValue else { return }
            show(device, pin)
        }
        agent.method("RequestConfirmation", in: "ou") { call in
            // Numeric comparison: the board cannot press "yes", so it shows
            // the number and accepts; the user confirms on the central only
            // when both match.
            guard let device = call.arguments[0].stringValue, case .uint32(let passkey) = call.arguments[1] else {
                return call.fail("org.bluez.Error.Rejected", "bad arguments")
            }
            show(device, sixDigits(passkey))
            call.reply()
        }
        agent.method("RequestPinCode", in: "o", out: "s") { call in call.fail("org.bluez.Error.Rejected", "display-only board: cannot enter a PIN") }
        agent.method("RequestPasskey", in: "o", out: "u") { call in call.fail("org.bluez.Error.Rejected", "display-only board: cannot enter a passkey") }
        agent.method("RequestAuthorization", in: "o") { call in
            if justWorks { return call.reply() }
            call.fail("org.bluez.Error.Rejected", "ble.security is authenticated: Just Works pairing refused")
        }
        agent.method("AuthorizeService", in: "os") { call in call.reply() }
        agent.method("Cancel") { call in
            end()
            call.reply()
        }
        return agent
    }

    /// A passkey as the six digits a central shows (leading zeros kept).
    static func sixDigits(_ passkey: UInt32) -> String {
        let digits = String(passkey % 1_000_000)
        return String(repeating: "0", count: max(0, 6 - digits.count)) + digits
    }
}
