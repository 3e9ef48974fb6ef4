#if canImport(Glibc)
import Glibc
#endif
import DBus
import Logging
import Reactor

/// The board as a BLE peripheral through BlueZ (bluetoothd, or any service
/// with its D-Bus API such as BlueZoo): a GATT application with the HM-10
/// style serial service (FFE0/FFE1) and the Device Information service, an
/// LE advertisement, and the self-healing that keeps both registered across
/// bluetoothd restarts and adapter power cycles (``Registration``). Knows
/// nothing of the firmware: bytes go out through ``Handlers``.
///
/// Who may write: only bluetoothd. Every call into our objects must come
/// from the current owner of `org.bluez` (others get AccessDenied and are
/// counted); the central a write is for, its address (for `ble.allow`) and
/// whether it is connected come from bluetoothd's own Device1 objects, never
/// from the call's options alone, so a caller cannot forge them; a write is
/// at most 512 bytes, the longest attribute value ATT allows.
///
/// Everything runs on one D-Bus loop of its own; the public methods are
/// safe from any thread.
public final class BLEPeripheral: @unchecked Sendable {
    // Loop-confined: all mutable state is used on `loop` only, except
    // `published` (under `statusLock`), which makes the unchecked Sendable sound.

    private typealias Devices = DeviceDirectory<(call: DBusMethodCall, then: (CentralDevice) -> Void)>

    private let configuration: Configuration
    private let handlers: Handlers
    private let logger: Logger
    private let loop: EventLoop
    private let adapterPath: String
    private var connection: DBusConnection?
    private var registration: Registration
    private var retryTimer: LoopToken?
    private var running = false
    /// bluetoothd's Device1 objects on our adapter, and the writes waiting
    /// for it to vouch for theirs.
    private var devices = Devices()
    /// Ask bluetoothd for the fixed handles (``GATTObjects/serviceHandle``);
    /// given up, for this run, if a registration with them fails (another
    /// application holds them): the board then still comes on the air.
    private var pinHandles = true
    /// The interval the advertisement asks for, and the timer that ends
    /// the fast period.
    private var interval = AdvertisingInterval.fast
    private var intervalTimer: LoopToken?
    /// The central whose passkey is on display, and the passkey.
    private var pairing: (device: String, passkey: String)?
    private var notifying = false
    private var value: [UInt8] = []
    private var centrals: Set<String> = []
    private var acquired = AcquiredSockets()
    private var statistics = Statistics()
    private var detail = "not started"
    private var lastLogged: String?

    private let statusLock = Lock()
    private var published = Status(state: .stopped, centrals: 0, statistics: Statistics())

    public init(configuration: Configuration, handlers: Handlers, logger: Logger) throws {
        self.configuration = configuration
        self.handlers = handlers
        self.logger = logger
        adapterPath = "/org/bluez/" + configuration.adapter
        registration = Registration(options: .init(
            adapter: configuration.adapter, powerOn: configuration.powerOn,
            agent: configuration.security.agentCapability, alias: configuration.setAlias ? configuration.name : nil
        ))
        loop = try EventLoop(name: "blecontrol-dbus")
    }

    /// Where the peripheral stands (from any thread).
    public var status: Status { statusLock.withLock { published } }

    /// What the transport is doing, as one line for status.
    public var stateDescription: String {
        let status = self.status
        var refused = status.statistics.refused > 0 ? ", \(status.statistics.refused) writes refused (ble.allow)" : ""
        if status.statistics.deniedCallers > 0 { refused += ", \(status.statistics.deniedCallers) calls refused (not bluetoothd)" }
        if status.statistics.spoofedSignals > 0 { refused += ", \(status.statistics.spoofedSignals) signals ignored (not from the bus or bluetoothd)" }
        if status.statistics.oversized > 0 { refused += ", \(status.statistics.oversized) oversized writes refused" }
        if status.statistics.unknownDevices > 0 { refused += ", \(status.statistics.unknownDevices) writes for devices bluetoothd does not report connected" }
        if let passkey = status.passkey { refused += ", pairing: passkey \(passkey)" }
        switch status.state {
        case .stopped: return "stopped"
        case .unavailable(let why), .starting(let why): return why + refused
        case .advertising:
            return "advertising as \(configuration.name) on \(configuration.adapter), \(status.centrals) central\(status.centrals == 1 ? "" : "s")" + refused
        }
    }

    /// Starts the loop and connects; never fails: a missing bus or BlueZ is
    /// a state, retried until ``stop()``.
    public func start() {
        loop.start()
        loop.execute { [self] in
            running = true
            perform(registration.handle(.start))
        }
    }

    /// Unregisters (best effort, at most about half a second), restores the
    /// adapter's alias, closes the bus and ends the loop.
    public func stop() {
        let finished = Promise<Void>()
        loop.execute { [self] in
            running = false
            if let retryTimer { loop.cancel(retryTimer) }
            if let intervalTimer { loop.cancel(intervalTimer) }
            var calls: [(String, String, [DBusValue])] = []
            if registration.advertisementMayBeHeld {
                calls.append(("org.bluez.LEAdvertisingManager1", "UnregisterAdvertisement", [.objectPath(Self.advertisementPath)]))
            }
            if registration.applicationRegistered {
                calls.append(("org.bluez.GattManager1", "UnregisterApplication", [.objectPath(Self.applicationPath)]))
            }
            if configuration.setAlias, let previous = registration.previousAlias, previous != configuration.name {
                calls.append(("org.freedesktop.DBus.Properties", "Set", [.string("org.bluez.Adapter1"), .string("Alias"), .variant(.string(previous))]))
            }
            guard let connection, let owner = registration.owner, !calls.isEmpty else { return finished.fulfil(()) }
            // bluetoothd drops our registrations when we leave the bus
            // anyway; asking first makes it stop advertising at once.
            let remaining = Countdown(calls.count) { finished.fulfil(()) }
            for (interface, method, arguments) in calls {
                connection.call(destination: owner, path: adapterPath, interface: interface, method: method, arguments: arguments, timeout: .milliseconds(500)) { _ in
                    remaining.tick()
                }
            }
        }
        _ = finished.wait(until: .now + .seconds(1))
        let closed = Promise<Void>()
        loop.execute { [self] in
            _ = registration.handle(.stop)
            closeAcquired(for: nil)
            endAllSessions()
            connection?.close()
            connection = nil
            setDetail("stopped")
            closed.fulfil(())
        }
        _ = closed.wait(until: .now + .seconds(1))
        loop.stop()
    }

    /// Sends a frame as FFE1 notifications to `central` (nil: everyone).
    ///
    /// When the central has a socket from `AcquireNotify`, the frame goes
    /// there and to no one else, so an ERROR caused by one central reaches
    /// that central only. Otherwise it falls back to a broadcast: a
    /// PropertiesChanged of `Value` after `StartNotify` (BlueZ then notifies
    /// every subscribed central), or every acquired notify socket. Note that
    /// bluetoothd keeps one notify socket per characteristic and notifies
    /// all subscribed devices from it (gatt-database.c, sock_io_read →
    /// send_notification_to_devices), so with bluetoothd per-central holds
    /// only while one central is subscribed; BlueZoo acquires per link.
    public func notify(_ bytes: [UInt8], central: String?) {
        loop.execute { [self] in
            value = bytes
            if let central, let socket = acquired.notify[central] {
                send(bytes, through: socket)
            } else if notifying, let connection {
                connection.emitPropertiesChanged(path: Self.characteristicPath, interface: GATTObjects.characteristicInterface, names: ["Value"])
            } else if !acquired.notify.isEmpty {
                for key in acquired.notify.keys.sorted() { send(bytes, through: acquired.notify[key]!) }
            } else {
                return
            }
            statistics.notifications += 1
            publish()
        }
    }

    /// One notification per datagram, each at most ATT_MTU - 3 bytes
    /// (Core 5.3 Vol 3 Part F 3.4.7.1).
    private func send(_ bytes: [UInt8], through socket: AcquiredSocket) {
        let chunk = max(socket.mtu - 3, 20)
        var start = 0
        repeat {
            let end = min(start + chunk, bytes.count)
            if !socket.send(Array(bytes[start..<end])) {
                logger.debug("notification to \(socket.central) dropped (socket closed or full)")
                return
            }
            start = end
        } while start < bytes.count
    }

    // MARK: Registration actions

    private func perform(_ actions: [Registration.Action]) {
        for action in actions {
            switch action {
            case .connectBus:
                connect()
            case .call(let call, let generation):
                perform(call, generation: generation)
            case .retry(let delay, let generation):
                if let retryTimer { loop.cancel(retryTimer) }
                retryTimer = loop.schedule(after: delay) { [weak self] in
                    guard let self else { return }
                    self.retryTimer = nil
                    self.perform(self.registration.handle(.retry(generation: generation)))
                }
            case .dropSessions:
                pairingEnded()
                notifying = false
                closeAcquired(for: nil)
                endAllSessions()
            case .report(let text):
                setDetail(text)
                // On the air (again): fast first.
                if text == "advertising" { advertiseFast() }
            case .onAir:
                startFastPeriod()
            }
        }
        publish()
    }

    private func feed(_ event: Registration.Event) {
        guard running else { return }
        perform(registration.handle(event))
    }

    private func connect() {
        guard running else { return }
        let address = configuration.busAddress ?? DBusConnection.systemBusAddress
        let connection: DBusConnection
        do {
            connection = try DBusConnection(address: address, loop: loop, logger: logger)
        } catch {
            let reason = (error as? DBusFailure)?.message ?? "\(error)"
            return feed(.busConnectFailed("cannot connect to \(address): \(reason)"))
        }
        self.connection = connection
        connection.acceptCaller = { [weak self] sender in
            guard let self else { return false }
            if sender == self.registration.owner { return true }
            self.statistics.deniedCallers += 1
            self.logger.warning("BLE: refused a call from \(sender), which is not bluetoothd")
            self.publish()
            return false
        }
        connection.onRefusedSignal = { [weak self] signal in
            guard let self else { return }
            self.statistics.spoofedSignals += 1
            // Logged while few, then counted only (status): a local user can
            // send them as fast as the bus lets it.
            let count = self.statistics.spoofedSignals
            if count <= 3 || count.nonzeroBitCount == 1 {
                self.logger.warning("BLE: ignored \(signal.interface ?? "?").\(signal.member ?? "?") from \(signal.sender ?? "?"), which is not its sender (the bus daemon or bluetoothd); \(count) so far")
            }
            self.publish()
        }
        connection.onDisconnect = { [weak self] in
            guard let self else { return }
            self.loop.execute {
                self.connection = nil
                self.feed(.busLost)
            }
        }
        exportObjects(on: connection)
        let bus = "org.freedesktop.DBus"
        connection.addMatch(DBusMatchRule(sender: bus, interface: bus, member: "NameOwnerChanged", arg0: "org.bluez")) { [weak self] signal in
            guard let self, signal.arguments.count == 3, let new = signal.arguments[2].stringValue else { return }
            self.feed(new.isEmpty ? .bluezGone : .bluezAppeared(owner: new))
        }
        connection.addMatch(DBusMatchRule(sender: "org.bluez", interface: "org.freedesktop.DBus.ObjectManager")) { [weak self] signal in
            self?.objectManagerSignal(signal)
        }
        connection.addMatch(DBusMatchRule(sender: "org.bluez", interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged", pathNamespace: "/org/bluez")) { [weak self] signal in
            self?.propertiesChanged(signal)
        }
        feed(.busConnected)
        connection.call(destination: bus, path: "/org/freedesktop/DBus", interface: bus, method: "GetNameOwner", arguments: [.string("org.bluez")]) { [weak self] result in
            guard let self, case .success(let values) = result, let name = values.first?.stringValue else { return }
            self.feed(.bluezAppeared(owner: name))
        }
    }

    private func perform(_ call: Registration.Call, generation: Int) {
        guard let connection, let owner = registration.owner else { return }
        let reply: @Sendable (Result<[DBusValue], DBusFailure>) -> Void = { [weak self] result in
            guard let self else { return }
            switch result {
            case .success: self.feed(.succeeded(call, generation: generation))
            case .failure(let failure):
                if call == .registerApplication, failure.name != "org.bluez.Error.AlreadyExists", self.pinHandles {
                    // bluetoothd could not put the services at their fixed
                    // handles ("Failed to create entry in database"): let it
                    // choose, as a board on the air beats stable handles.
                    self.pinHandles = false
                    self.logger.warning("BLE: GATT handles 0x\(String(GATTObjects.serviceHandle, radix: 16)) taken (\(failure.message)); letting bluetoothd choose them: a bonded phone may need to rediscover the board after a restart")
                }
                self.feed(.failed(call, failure, generation: generation))
            }
        }
        switch call {
        case .inspect:
            connection.call(destination: owner, path: "/", interface: "org.freedesktop.DBus.ObjectManager", method: "GetManagedObjects") { [weak self] result in
                guard let self else { return }
                switch result {
                case .success(let values):
                    let objects = values.first?.dictionaryValue ?? [:]
                    self.learnDevices(from: objects)
                    self.feed(.inspected(self.adapter(in: objects), generation: generation))
                case .failure(let failure):
                    self.feed(.failed(.inspect, failure, generation: generation))
                }
            }
        case .powerOn:
            connection.call(destination: owner, path: adapterPath, interface: "org.freedesktop.DBus.Properties", method: "Set",
                            arguments: [.string("org.bluez.Adapter1"), .string("Powered"), .variant(.bool(true))], completion: reply)
        case .setAlias(let alias):
            connection.call(destination: owner, path: adapterPath, interface: "org.freedesktop.DBus.Properties", method: "Set",
                            arguments: [.string("org.bluez.Adapter1"), .string("Alias"), .variant(.string(alias))], completion: reply)
        case .registerAgent:
            connection.call(destination: owner, path: "/org/bluez", interface: "org.bluez.AgentManager1", method: "RegisterAgent",
                            arguments: [.objectPath(Self.agentPath), .string(configuration.security.agentCapability ?? "NoInputNoOutput")], completion: reply)
        case .requestDefaultAgent:
            connection.call(destination: owner, path: "/org/bluez", interface: "org.bluez.AgentManager1", method: "RequestDefaultAgent",
                            arguments: [.objectPath(Self.agentPath)], completion: reply)
        case .registerApplication:
            connection.call(destination: owner, path: adapterPath, interface: "org.bluez.GattManager1", method: "RegisterApplication",
                            arguments: [.objectPath(Self.applicationPath), .properties([])], timeout: .seconds(10), completion: reply)
        case .registerAdvertisement:
            connection.call(destination: owner, path: adapterPath, interface: "org.bluez.LEAdvertisingManager1", method: "RegisterAdvertisement",
                            arguments: [.objectPath(Self.advertisementPath), .properties([])], timeout: .seconds(10), completion: reply)
        case .unregisterAdvertisement:
            connection.call(destination: owner, path: adapterPath, interface: "org.bluez.LEAdvertisingManager1", method: "UnregisterAdvertisement",
                            arguments: [.objectPath(Self.advertisementPath)], timeout: .seconds(10), completion: reply)
        }
    }

    private func adapter(in objects: [String: DBusValue]) -> Registration.Adapter? {
        guard let interfaces = objects[adapterPath]?.dictionaryValue, let adapter = interfaces["org.bluez.Adapter1"]?.dictionaryValue else { return nil }
        return Registration.Adapter(
            powered: adapter["Powered"]?.boolValue == true,
            hasGATT: interfaces["org.bluez.GattManager1"] != nil,
            hasAdvertising: interfaces["org.bluez.LEAdvertisingManager1"] != nil,
            alias: adapter["Alias"]?.stringValue
        )
    }

    // MARK: bluetoothd's view of the centrals

    private func learnDevices(from objects: [String: DBusValue]) {
        for (path, value) in objects where path.hasPrefix(adapterPath + "/") {
            if let properties = value.dictionaryValue?["org.bluez.Device1"]?.dictionaryValue { learnDevice(path, properties) }
        }
    }

    private func learnDevice(_ path: String, _ properties: [String: DBusValue]) {
        // A central that may pair next: clear the way for its bond first.
        if devices.learn(path, properties), configuration.security != .open { removeStaleDevices() }
    }

    /// Removes the Device1 objects of centrals that are gone and were never
    /// bonded (bluetoothd keeps them for TemporaryTimeout, 30 s). Why: when
    /// a phone pairs from a private address and gives its identity address,
    /// and bluetoothd still holds such an object for that identity (the same
    /// phone, seen unbonded a moment ago), it merges the two but leaves the
    /// old object's timer running; when it fires, bluetoothd removes that
    /// object and deletes its storage directory, which is now the new
    /// bond's: the keys are gone at the next start of bluetoothd (BlueZ
    /// 5.66 to 5.82 at least: adapter.c new_irk_callback, device.c
    /// device_disappeared -> device_remove_stored). Removing them before the
    /// keys are distributed leaves nothing to merge. Nothing is lost: an
    /// unbonded object holds no keys and no stored data.
    private func removeStaleDevices() {
        guard let connection, let owner = registration.owner else { return }
        for (path, device) in devices.takeStale() {
            logger.debug("BLE: removing \(device.address), gone and not bonded, before a pairing")
            connection.call(destination: owner, path: adapterPath, interface: "org.bluez.Adapter1", method: "RemoveDevice",
                            arguments: [.objectPath(path)], timeout: .seconds(5)) { _ in }
        }
    }

    private func objectManagerSignal(_ signal: DBusMessageInfo) {
        guard signal.sender == registration.owner, let object = signal.arguments.first?.stringValue else { return }
        switch signal.member {
        case "InterfacesAdded":
            if object == adapterPath { feed(.adapterAdded) }
            if object.hasPrefix(adapterPath + "/"), signal.arguments.count > 1,
               let properties = signal.arguments[1].dictionaryValue?["org.bluez.Device1"]?.dictionaryValue {
                learnDevice(object, properties)
            }
        case "InterfacesRemoved":
            let names = signal.arguments.count > 1 ? signal.arguments[1].arrayValue?.compactMap(\.stringValue) ?? [] : []
            if object == adapterPath, names.contains("org.bluez.Adapter1") {
                devices.forgetAll()
                feed(.adapterRemoved)
            } else if names.contains("org.bluez.Device1") {
                devices.forget(object)
                centralGone(object, why: "removed")
            }
        default:
            break
        }
    }

    private func propertiesChanged(_ signal: DBusMessageInfo) {
        guard signal.sender == registration.owner, signal.arguments.count >= 2, let path = signal.path,
              let interface = signal.arguments[0].stringValue, let changed = signal.arguments[1].dictionaryValue else { return }
        if path == adapterPath, interface == "org.bluez.Adapter1", let powered = changed["Powered"]?.boolValue {
            feed(.adapterPowered(powered))
        } else if interface == "org.bluez.Device1", path.hasPrefix(adapterPath + "/") {
            learnDevice(path, changed)
            // bluetoothd does not tell the agent that pairing succeeded: Paired does.
            if path == pairing?.device, changed["Paired"]?.boolValue == true || changed["Connected"]?.boolValue == false { pairingEnded() }
            if changed["Connected"]?.boolValue == false { centralGone(path, why: "disconnected") }
        }
    }

    /// Runs `body` once bluetoothd has vouched that `device` is a connected
    /// central on our adapter: at once when we know it, else after asking
    /// it (calls for the same device keep their order), else refuses `call`.
    private func withConnectedDevice(_ device: String?, call: DBusMethodCall, _ body: @escaping (CentralDevice) -> Void) {
        guard let device, device.hasPrefix(adapterPath + "/dev_"), DBusNames.isValidPath(device) else {
            statistics.unknownDevices += 1
            publish()
            return call.fail("org.bluez.Error.InvalidArguments", "no device of \(configuration.adapter) named in the options")
        }
        if let known = devices.connected(device) { return body(known) }
        guard devices.wait(for: device, (call, body)) else { return }
        guard let connection, let owner = registration.owner else { return resolveAwaiting(device) }
        connection.call(destination: owner, path: device, interface: "org.freedesktop.DBus.Properties", method: "GetAll",
                        arguments: [.string("org.bluez.Device1")], timeout: .seconds(2)) { [weak self] result in
            guard let self else { return }
            if case .success(let values) = result, let properties = values.first?.dictionaryValue { self.learnDevice(device, properties) }
            self.resolveAwaiting(device)
        }
    }

    private func resolveAwaiting(_ device: String) {
        for (call, body) in devices.takeWaiters(for: device) {
            if let known = devices.connected(device) {
                body(known)
            } else {
                statistics.unknownDevices += 1
                call.fail("org.bluez.Error.NotPermitted", "bluetoothd does not report \(device) connected")
            }
        }
        publish()
    }

    private func centralGone(_ central: String, why: String) {
        closeAcquired(for: central)
        guard centrals.remove(central) != nil else { return }
        logger.info("central \(central) \(why)")
        handlers.disconnected(central)
        if centrals.isEmpty {
            notifying = false
            advertiseFast()
        }
        publish()
        // BlueZ resumes advertising by itself once the link is gone; if it
        // released our advertisement meanwhile, Release() re-registers it.
    }

    private func endAllSessions() {
        for central in centrals.sorted() { handlers.disconnected(central) }
        centrals.removeAll()
    }

    // MARK: Exported objects

    private func exportObjects(on connection: DBusConnection) {
        connection.exportObjectManager(at: Self.applicationPath)
        connection.export(path: GATTObjects.servicePath, interfaces: [GATTObjects.service(
            uuid: Self.serviceUUID, handle: { [weak self] in self?.pinHandles == true ? GATTObjects.serviceHandle : nil })])
        let handlers = GATTObjects.SerialHandlers(
            notifying: { [weak self] in self?.notifying ?? false },
            value: { [weak self] in self?.value ?? [] },
            writeAcquired: { [weak self] in !(self?.acquired.write.isEmpty ?? true) },
            notifyAcquired: { [weak self] in !(self?.acquired.notify.isEmpty ?? true) },
            writeValue: { [weak self] call in self?.writeValue(call) },
            acquire: { [weak self] call, notify in self?.acquire(call, notify: notify) },
            setNotifying: { [weak self] on in self?.setNotifying(on) }
        )
        let flags = GATTObjects.flags(security: configuration.security, writeWithoutResponse: configuration.writeWithoutResponse)
        connection.export(path: Self.characteristicPath, interfaces: [GATTObjects.serialCharacteristic(flags: flags, acquireWrite: configuration.acquireWrite, handlers)])
        for (path, interfaces) in GATTObjects.deviceInformation(
            manufacturer: configuration.manufacturer, model: configuration.model, firmware: configuration.firmwareRevision,
            handle: { [weak self] in self?.pinHandles == true ? GATTObjects.deviceInformationHandle : nil }) {
            connection.export(path: path, interfaces: interfaces)
        }
        connection.export(path: Self.advertisementPath, interfaces: [GATTObjects.advertisement(
            name: configuration.name, interval: { [weak self] in (self?.interval ?? .fast).milliseconds }
        ) { [weak self] in
            self?.feed(.advertisementReleased)
        }])
        if configuration.security != .open {
            connection.export(path: Self.agentPath, interfaces: [GATTObjects.agent(
                justWorks: configuration.security == .encrypted,
                show: { [weak self] device, passkey in self?.showPasskey(passkey, for: device) },
                showing: { [weak self] in self?.pairing },
                end: { [weak self] in self?.pairingEnded() },
                released: { [weak self] in self?.feed(.agentReleased) }
            )])
        }
    }

    private func setNotifying(_ on: Bool) {
        guard notifying != on else { return }
        notifying = on
        connection?.emitPropertiesChanged(path: Self.characteristicPath, interface: GATTObjects.characteristicInterface, names: ["Notifying"])
    }

    private func showPasskey(_ passkey: String, for device: String) {
        // Before the passkey is shown (so before the central can finish
        // pairing and send its keys): see removeStaleDevices.
        removeStaleDevices()
        pairing = (device, passkey)
        logger.notice("BLE: pairing with \(device): passkey \(passkey)")
        // The status first: whoever the handler tells reads it right.
        publish()
        handlers.passkey(device, passkey)
    }

    private func pairingEnded() {
        guard let device = pairing?.device else { return }
        pairing = nil
        logger.info("BLE: pairing with \(device) ended")
        publish()
        handlers.passkey(device, nil)
    }

    // MARK: Advertising interval

    /// The fast interval for `fastAdvertisingPeriod`, then the slow one.
    /// The period counts from when bluetoothd holds the fast advertisement
    /// (``startFastPeriod()``), not from when it was asked for: a period
    /// that ended before the registration did would leave the registration
    /// carrying whichever interval bluetoothd happened to read.
    private func advertiseFast() {
        if let intervalTimer { loop.cancel(intervalTimer) }
        intervalTimer = nil
        setInterval(.fast)
        startFastPeriod()
    }

    /// Starts the fast period's timer once the fast advertisement is on
    /// the air (Registration's `.onAir`, or at once if it already was).
    private func startFastPeriod() {
        guard interval == .fast, intervalTimer == nil, registration.isAdvertising else { return }
        intervalTimer = loop.schedule(after: configuration.fastAdvertisingPeriod) { [weak self] in
            guard let self else { return }
            self.intervalTimer = nil
            self.setInterval(.slow)
        }
    }

    private func setInterval(_ new: AdvertisingInterval) {
        guard interval != new else { return }
        interval = new
        let (min, max) = new.milliseconds
        logger.info("BLE: advertising interval \(min)-\(max) ms (\(new == .fast ? "fast, for \(configuration.fastAdvertisingPeriod)" : "slow"))")
        // bluetoothd reads the properties once, at registration.
        feed(.readvertise)
    }

    // MARK: Bonds

    /// Removes every central bluetoothd holds a bond with on the board's
    /// adapter (`Adapter1.RemoveDevice`: its keys go, a connected one is
    /// disconnected), so each must pair again. Completes on the peripheral's
    /// loop with the addresses forgotten (identity addresses, for phones
    /// that gave theirs when bonding).
    public func forgetBonds(_ completion: @escaping @Sendable (Result<[String], BondFailure>) -> Void) {
        loop.execute { [self] in
            guard let connection, let owner = registration.owner else {
                return completion(.failure(BondFailure(description: "bluetoothd is not reachable (BLE: \(detail))")))
            }
            Bonds.forget(on: connection, owner: owner, adapterPath: adapterPath, logger: logger, completion)
        }
    }

    // MARK: Writes

    private func writeValue(_ call: DBusMethodCall) {
        guard let bytes = call.arguments.first?.byteArray else { return call.fail("org.bluez.Error.InvalidArguments", "WriteValue takes (aya{sv})") }
        guard bytes.count <= Self.maximumWriteLength else {
            statistics.oversized += 1
            publish()
            return call.fail("org.bluez.Error.InvalidValueLength", "\(bytes.count) bytes: an ATT value is at most \(Self.maximumWriteLength)")
        }
        let options = call.arguments.count > 1 ? call.arguments[1].dictionaryValue ?? [:] : [:]
        // BlueZ 5.66 sends no `type`; without it the write may be a request,
        // and answering a command late costs nothing but a little time.
        let withResponse = options["type"]?.stringValue != "command"
        withConnectedDevice(options["device"]?.stringValue, call: call) { [weak self] device in
            guard let self else { return }
            let central = call.arguments.count > 1 ? (options["device"]?.stringValue ?? "") : ""
            guard self.allowed(device, central: central) else { return call.fail("org.bluez.Error.NotAuthorized", "not in the allow-list") }
            self.statistics.writes += 1
            if self.centrals.insert(central).inserted {
                self.logger.info("central \(central) (\(device.address)) writing")
                self.publish()
            }
            if withResponse {
                self.handlers.write(central, bytes, true) { error in
                    if let error { call.fail("org.bluez.Error.Failed", error) } else { call.reply() }
                }
            } else {
                // BlueZ still waits for the D-Bus reply of a command; it costs no ATT traffic.
                self.handlers.write(central, bytes, false) { _ in }
                call.reply()
            }
        }
    }

    /// Checks ble.allow against the address bluetoothd reports, counting
    /// and logging a refusal.
    private func allowed(_ device: CentralDevice, central: String) -> Bool {
        guard !configuration.allow.isEmpty, !configuration.allow.contains(device.address) else { return true }
        statistics.refused += 1
        publish()
        logger.notice("write from \(central) (\(device.address)) refused: not in ble.allow")
        return false
    }

    // MARK: Acquired sockets

    /// AcquireWrite / AcquireNotify(options: device, mtu, link) → (h fd, q mtu).
    /// A new acquisition for the same central replaces the old socket
    /// (BlueZ acquires again after a reconnect or an MTU change).
    private func acquire(_ call: DBusMethodCall, notify: Bool) {
        let options = call.arguments.first?.dictionaryValue ?? [:]
        let central = options["device"]?.stringValue
        // 23 is the LE default ATT_MTU (Core 5.3 Vol 3 Part F 3.2.8).
        let mtu = min(max(options["mtu"]?.integerValue ?? 23, 23), 517)
        withConnectedDevice(central, call: call) { [weak self] device in
            guard let self, let central else { return }
            if !notify {
                guard self.allowed(device, central: central) else { return call.fail("org.bluez.Error.NotAuthorized", "not in the allow-list") }
            }
            guard let (socket, remote) = AcquiredSocket.pair(central: central, mtu: mtu, loop: self.loop) else {
                return call.fail("org.bluez.Error.Failed", "socketpair: \(String(cString: strerror(errno)))")
            }
            let name = notify ? "NotifyAcquired" : "WriteAcquired"
            let (first, replaced) = self.acquired.add(socket, notify: notify)
            replaced?.drainQueued()
            do {
                try socket.start(received: { [weak self, weak socket] bytes in
                    // BlueZ writes nothing into a notify socket (indications only confirm there).
                    guard let self, let socket, !notify else { return }
                    self.statistics.writes += 1
                    self.publish()
                    self.handlers.write(socket.central, bytes, false) { _ in }
                }, ended: { [weak self, weak socket] in
                    guard let self, let socket else { return }
                    self.acquiredEnded(socket, notify: notify)
                })
            } catch {
                socket.close()
                close(remote)
                return call.fail("org.bluez.Error.Failed", "\(error)")
            }
            call.reply([.unixFD(remote), .uint16(UInt16(mtu))])
            // libdbus duplicated the descriptor into the reply; BlueZ owns that copy.
            close(remote)
            self.logger.info("\(notify ? "AcquireNotify" : "AcquireWrite") from \(central) (MTU \(mtu))")
            if !notify, self.centrals.insert(central).inserted { self.publish() }
            if first {
                self.connection?.emitPropertiesChanged(path: Self.characteristicPath, interface: GATTObjects.characteristicInterface, names: [name])
            }
        }
    }

    /// BlueZ closed its end: the acquisition ends, not the session — that
    /// ends on Device1 Connected=false.
    private func acquiredEnded(_ socket: AcquiredSocket, notify: Bool) {
        guard case .released(let last) = acquired.ended(socket, notify: notify) else { return }
        if last {
            connection?.emitPropertiesChanged(path: Self.characteristicPath, interface: GATTObjects.characteristicInterface, names: [notify ? "NotifyAcquired" : "WriteAcquired"])
        }
        logger.info("\(notify ? "acquired notify" : "acquired write") of \(socket.central) released")
    }

    /// Closes the sockets of `central` (nil: all), releasing the acquisitions.
    private func closeAcquired(for central: String?) {
        for (key, notify) in acquired.close(for: central) {
            logger.info("\(notify ? "acquired notify" : "acquired write") of \(key) released")
        }
    }

    // MARK: State

    private func setDetail(_ text: String) {
        detail = text
        if text != lastLogged {
            lastLogged = text
            if text == "advertising" {
                logger.notice("BLE: advertising as \(configuration.name) on \(configuration.adapter) (GATT application and advertisement registered)")
            } else {
                logger.notice("BLE: \(text)")
            }
        }
    }

    private func publish() {
        let state: State
        switch registration.phase {
        case .stopped: state = .stopped
        case .advertising: state = .advertising
        case _ where registration.readvertising: state = .advertising
        case .connectingBus, .waitingForBlueZ, .waitingForAdapter, .adapterOff: state = .unavailable(detail)
        default: state = .starting(detail)
        }
        var statistics = self.statistics
        statistics.registrations = registration.registrations
        let snapshot = Status(state: state, centrals: centrals.count, statistics: statistics, passkey: pairing?.passkey)
        statusLock.withLock { published = snapshot }
    }
}
