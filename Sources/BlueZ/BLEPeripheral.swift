#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Logging

/// The board as a BLE peripheral through BlueZ (bluetoothd, or any service
/// with its D-Bus API such as BlueZoo): a GATT application with the HM-10
/// style serial service (FFE0/FFE1, PROTOCOL.md "Transport") and the
/// Device Information service, an LE advertisement, and the self-healing
/// that keeps both registered across bluetoothd restarts and adapter power
/// cycles. Knows nothing of the firmware: bytes go out through ``Handlers``.
///
/// Everything runs on one ``DBusThread`` of its own; the public methods are
/// safe from any thread.
public final class BLEPeripheral: @unchecked Sendable {
    // Thread-confined: all mutable state is used on `thread` only, except
    // `stateText` (under `lock`), which makes the unchecked Sendable sound.

    /// How writes are protected (the board file's `ble.security`).
    public enum Security: String, Sendable, CaseIterable {
        /// Anyone may write, as the original HM-10 board.
        case open
        /// Writes need an encrypted link (BlueZ pairs "just works" on demand).
        case encrypted
        /// Writes need an authenticated (MITM-protected) encrypted link.
        case authenticated
    }

    public struct Configuration: Sendable {
        /// The advertised complete local name.
        public var name: String
        /// `hci0`, …
        public var adapter: String
        /// Switch the adapter on when it is off.
        public var powerOn: Bool
        public var security: Security
        /// Bluetooth addresses (`AA:BB:CC:DD:EE:FF`) allowed to write; empty: anyone.
        public var allow: [String]
        /// Device Information service strings.
        public var manufacturer: String
        public var model: String
        public var firmwareRevision: String
        /// The bus address (default: the system bus, honouring DBUS_SYSTEM_BUS_ADDRESS).
        public var busAddress: String?
        /// Offer `AcquireWrite` (the `WriteAcquired` property). Once a socket
        /// is acquired bluetoothd sends every FFE1 write through it, write
        /// requests included, and answers those at once (gatt-database.c,
        /// chrc_write_cb): faster, but a write with response is then
        /// acknowledged before it is applied. False keeps every write on
        /// WriteValue, where a request is answered only once applied.
        public var acquireWrite: Bool

        public init(name: String, adapter: String = "hci0", powerOn: Bool = true, security: Security = .open, allow: [String] = [],
                    manufacturer: String = "BLEControl", model: String = "BLEControl board", firmwareRevision: String = "0.1.0",
                    busAddress: String? = nil, acquireWrite: Bool = true) {
            self.name = name
            self.adapter = adapter
            self.powerOn = powerOn
            self.security = security
            self.allow = allow
            self.manufacturer = manufacturer
            self.model = model
            self.firmwareRevision = firmwareRevision
            self.busAddress = busAddress
            self.acquireWrite = acquireWrite
        }
    }

    /// What the peripheral tells its owner. All run on the peripheral's thread.
    public struct Handlers: Sendable {
        /// Bytes a central wrote to FFE1, in order. `central` is its BlueZ
        /// device path. With response: call `done` once the frames are
        /// applied (nil) or failed (a reason); the ATT write is answered
        /// then. Without response `done` may be ignored. Bytes from an
        /// AcquireWrite socket always come without response (BlueZ has
        /// answered the ATT write already).
        public var write: @Sendable (_ central: String, _ bytes: [UInt8], _ withResponse: Bool, _ done: @escaping @Sendable (String?) -> Void) -> Void
        /// The central is gone (disconnected, adapter or BlueZ gone).
        public var disconnected: @Sendable (_ central: String) -> Void
        /// Pairing with `ble.security: authenticated`: show `passkey` (six
        /// digits, or a legacy PIN code) to the user; nil when pairing
        /// ended or was cancelled and the display may be restored.
        public var passkey: @Sendable (_ central: String, _ passkey: String?) -> Void

        public init(write: @escaping @Sendable (String, [UInt8], Bool, @escaping @Sendable (String?) -> Void) -> Void,
                    disconnected: @escaping @Sendable (String) -> Void,
                    passkey: @escaping @Sendable (String, String?) -> Void = { _, _ in }) {
            self.write = write
            self.disconnected = disconnected
            self.passkey = passkey
        }
    }

    /// Counters for status.
    public struct Statistics: Sendable, Equatable {
        public var registrations = 0
        public var writes = 0
        /// Writes refused by the allow-list.
        public var refused = 0
        public var notifications = 0
    }

    public static let serviceUUID = "0000ffe0-0000-1000-8000-00805f9b34fb"
    public static let characteristicUUID = "0000ffe1-0000-1000-8000-00805f9b34fb"
    static let deviceInformationUUID = "0000180a-0000-1000-8000-00805f9b34fb"

    public static let applicationPath = "/org/blecontrol/gatt"
    public static let servicePath = applicationPath + "/service0"
    public static let characteristicPath = servicePath + "/char0"
    static let deviceInformationPath = applicationPath + "/service1"
    public static let advertisementPath = "/org/blecontrol/advertisement0"
    /// The pairing agent (org.bluez.Agent1), registered with `ble.security: authenticated`.
    public static let agentPath = "/org/blecontrol/agent"

    private let configuration: Configuration
    private let handlers: Handlers
    private let logger: Logger
    private let thread = DBusThread()
    private let adapterPath: String
    private var connection: DBusConnection?
    private var bluezOwner: String?
    /// Bumped whenever BlueZ or the bus comes or goes: replies from an
    /// earlier generation are stale and ignored.
    private var generation = 0
    private var applicationRegistered = false
    private var advertisementRegistered = false
    private var agentRegistered = false
    /// The central whose passkey is on display (Cancel clears it).
    private var pairing: String?
    private var setupInFlight = false
    private var retryTimer: DBusThread.Token?
    private var notifying = false
    private var value: [UInt8] = []
    private var centrals: Set<String> = []
    /// AcquireWrite sockets by central: write-without-response frames
    /// arrive there with no D-Bus message per write.
    private var writeSockets: [String: AcquiredSocket] = [:]
    /// AcquireNotify sockets by the central BlueZ named when acquiring.
    private var notifySockets: [String: AcquiredSocket] = [:]
    private var statistics = Statistics()
    private var lastLogged: String?
    private var running = false

    private let lock = NSLock()
    private var stateText = "not started"
    private var statisticsCopy = Statistics()
    private var centralCount = 0

    public init(configuration: Configuration, handlers: Handlers, logger: Logger) {
        self.configuration = configuration
        self.handlers = handlers
        self.logger = logger
        adapterPath = "/org/bluez/" + configuration.adapter
    }

    /// What the transport is doing, for status ("advertising as …", "no BlueZ …").
    public var state: String {
        lock.withLock {
            let refused = statisticsCopy.refused > 0 ? ", \(statisticsCopy.refused) writes refused (ble.allow)" : ""
            return (stateText == "advertising" ? "advertising as \(configuration.name) on \(configuration.adapter), \(centralCount) central\(centralCount == 1 ? "" : "s")" : stateText) + refused
        }
    }

    public var currentStatistics: Statistics { lock.withLock { statisticsCopy } }

    /// Starts the thread and connects; never fails: a missing bus or BlueZ
    /// is a state, retried until ``stop()``.
    public func start() {
        thread.start(name: "blecontrol-ble")
        thread.execute { [self] in
            running = true
            connect()
        }
    }

    /// Unregisters (best effort, briefly), closes the bus and ends the thread.
    public func stop() {
        let done = DispatchSemaphore(value: 0)
        thread.execute { [self] in
            running = false
            if let retryTimer { thread.cancel(retryTimer) }
            guard let connection, let owner = bluezOwner, applicationRegistered || advertisementRegistered else {
                done.signal()
                return
            }
            // bluetoothd drops our registrations when we leave the bus anyway;
            // asking first makes it stop advertising at once.
            let group = DispatchGroup()
            if advertisementRegistered {
                group.enter()
                connection.call(destination: owner, path: adapterPath, interface: "org.bluez.LEAdvertisingManager1", method: "UnregisterAdvertisement",
                                arguments: [.objectPath(Self.advertisementPath)], timeout: .milliseconds(500)) { _ in group.leave() }
            }
            if applicationRegistered {
                group.enter()
                connection.call(destination: owner, path: adapterPath, interface: "org.bluez.GattManager1", method: "UnregisterApplication",
                                arguments: [.objectPath(Self.applicationPath)], timeout: .milliseconds(500)) { _ in group.leave() }
            }
            group.notify(queue: .global()) { done.signal() }
        }
        _ = done.wait(timeout: .now() + .seconds(1))
        thread.execute { [self] in
            closeAcquired(for: nil)
            for central in centrals.sorted() { handlers.disconnected(central) }
            centrals.removeAll()
            connection?.close()
            connection = nil
            setState("stopped")
        }
        thread.stop()
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
        thread.execute { [self] in
            value = bytes
            if let central, let socket = notifySockets[central] {
                send(bytes, through: socket)
            } else if notifying, let connection {
                connection.emitPropertiesChanged(path: Self.characteristicPath, interface: "org.bluez.GattCharacteristic1", names: ["Value"])
            } else if !notifySockets.isEmpty {
                for key in notifySockets.keys.sorted() { send(bytes, through: notifySockets[key]!) }
            } else {
                return
            }
            statistics.notifications += 1
            publishStatistics()
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

    // MARK: Bus

    private func connect() {
        guard running else { return }
        let address = configuration.busAddress ?? DBusConnection.systemBusAddress
        let connection: DBusConnection
        do {
            connection = try DBusConnection(address: address, logger: logger, thread: thread)
        } catch {
            let reason = (error as? DBusFailure)?.message ?? "\(error)"
            setState("no BlueZ on the system bus (cannot connect to \(address): \(reason)): BLE off, TCP still serving")
            retry(after: .seconds(2)) { [weak self] in self?.connect() }
            return
        }
        self.connection = connection
        generation += 1
        connection.onDisconnect = { [weak self] in
            guard let self else { return }
            self.thread.execute { self.busLost() }
        }
        exportObjects(on: connection)
        let owner = "org.freedesktop.DBus"
        connection.addMatch(DBusMatchRule(sender: owner, interface: owner, member: "NameOwnerChanged", arg0: "org.bluez")) { [weak self] signal in
            guard let self, signal.arguments.count == 3, let new = signal.arguments[2].stringValue else { return }
            if new.isEmpty { self.bluezGone() } else { self.bluezAppeared(owner: new) }
        }
        connection.addMatch(DBusMatchRule(sender: "org.bluez", interface: "org.freedesktop.DBus.ObjectManager")) { [weak self] signal in
            self?.objectManagerSignal(signal)
        }
        connection.addMatch(DBusMatchRule(sender: "org.bluez", interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged", pathNamespace: "/org/bluez")) { [weak self] signal in
            self?.propertiesChanged(signal)
        }
        let generation = self.generation
        connection.call(destination: owner, path: "/org/freedesktop/DBus", interface: owner, method: "GetNameOwner", arguments: [.string("org.bluez")]) { [weak self] result in
            guard let self, self.generation == generation else { return }
            switch result {
            case .success(let values):
                if let name = values.first?.stringValue { self.bluezAppeared(owner: name) }
            case .failure:
                self.setState("no BlueZ on the system bus: BLE off, TCP still serving")
            }
        }
    }

    private func busLost() {
        generation += 1
        dropRegistrations()
        bluezOwner = nil
        connection?.close()
        connection = nil
        setState("the system bus went away: BLE off, TCP still serving; reconnecting")
        retry(after: .seconds(1)) { [weak self] in self?.connect() }
    }

    private func bluezAppeared(owner: String) {
        guard bluezOwner != owner else { return }
        generation += 1
        dropRegistrations()
        bluezOwner = owner
        setupInFlight = false
        logger.info("BlueZ is on the bus (\(owner))")
        setup()
    }

    private func bluezGone() {
        guard bluezOwner != nil else { return }
        generation += 1
        bluezOwner = nil
        dropRegistrations()
        setState("no BlueZ on the system bus: BLE off, TCP still serving")
    }

    /// BlueZ forgot us (restart, adapter gone or off): every central is gone too.
    private func dropRegistrations() {
        agentRegistered = false
        endPairing()
        applicationRegistered = false
        advertisementRegistered = false
        setupInFlight = false
        notifying = false
        closeAcquired(for: nil)
        for central in centrals.sorted() { handlers.disconnected(central) }
        centrals.removeAll()
        publishStatistics()
    }

    private func retry(after delay: Duration, _ work: @escaping () -> Void) {
        if let retryTimer { thread.cancel(retryTimer) }
        retryTimer = thread.schedule(after: delay) { [weak self] in
            self?.retryTimer = nil
            work()
        }
    }

    // MARK: Registration

    /// Finds the adapter, powers it on if asked, registers the application
    /// and the advertisement. Idempotent; every failure retries shortly.
    private func setup() {
        guard running, let connection, let owner = bluezOwner, !setupInFlight else { return }
        guard !(applicationRegistered && advertisementRegistered) else { return }
        setupInFlight = true
        let generation = self.generation
        connection.call(destination: owner, path: "/", interface: "org.freedesktop.DBus.ObjectManager", method: "GetManagedObjects") { [weak self] result in
            guard let self, self.generation == generation else { return }
            self.setupInFlight = false
            guard case .success(let values) = result, let objects = values.first?.dictionaryValue else {
                if case .failure(let error) = result { self.setState("BlueZ does not answer GetManagedObjects (\(error)); retrying") }
                return self.retry(after: .seconds(1)) { [weak self] in self?.setup() }
            }
            guard let interfaces = objects[self.adapterPath]?.dictionaryValue, let adapter = interfaces["org.bluez.Adapter1"]?.dictionaryValue else {
                self.setState("waiting for adapter \(self.configuration.adapter)")
                // InterfacesAdded normally brings it; poll as well, cheaply.
                return self.retry(after: .seconds(1)) { [weak self] in self?.setup() }
            }
            guard interfaces["org.bluez.GattManager1"] != nil, interfaces["org.bluez.LEAdvertisingManager1"] != nil else {
                self.setState("adapter \(self.configuration.adapter) has no GATT server or LE advertising (BlueZ too old, or not LE)")
                return self.retry(after: .seconds(2)) { [weak self] in self?.setup() }
            }
            if adapter["Powered"]?.boolValue != true {
                if self.configuration.powerOn {
                    self.setState("powering adapter \(self.configuration.adapter) on")
                    connection.call(destination: owner, path: self.adapterPath, interface: "org.freedesktop.DBus.Properties", method: "Set",
                                    arguments: [.string("org.bluez.Adapter1"), .string("Powered"), .variant(.bool(true))]) { [weak self] result in
                        guard let self, self.generation == generation else { return }
                        if case .failure(let error) = result { self.setState("cannot power adapter \(self.configuration.adapter) on: \(error)") }
                        self.retry(after: .milliseconds(300)) { [weak self] in self?.setup() }
                    }
                } else {
                    self.setState("adapter \(self.configuration.adapter) is powered off: waiting (ble.power_on is false)")
                }
                return
            }
            self.register(connection: connection, owner: owner, generation: generation)
        }
    }

    private func register(connection: DBusConnection, owner: String, generation: Int) {
        setState("registering on \(configuration.adapter)")
        setupInFlight = true
        let finish: @Sendable () -> Void = { [weak self] in
            guard let self, self.generation == generation else { return }
            self.setupInFlight = false
            if self.applicationRegistered && self.advertisementRegistered {
                self.statistics.registrations += 1
                self.publishStatistics()
                self.setState("advertising")
            } else {
                self.retry(after: .seconds(1)) { [weak self] in self?.setup() }
            }
        }
        let registerAdvertisement: @Sendable () -> Void = { [weak self] in
            guard let self, self.generation == generation else { return }
            guard !self.advertisementRegistered else { return finish() }
            connection.call(destination: owner, path: self.adapterPath, interface: "org.bluez.LEAdvertisingManager1", method: "RegisterAdvertisement",
                            arguments: [.objectPath(Self.advertisementPath), .properties([])], timeout: .seconds(10)) { [weak self] result in
                guard let self, self.generation == generation else { return }
                switch result {
                case .success: self.advertisementRegistered = true
                case .failure(let error) where error.name == "org.bluez.Error.AlreadyExists": self.advertisementRegistered = true
                case .failure(let error): self.setState("RegisterAdvertisement failed: \(error); retrying")
                }
                finish()
            }
        }
        let registerApplication: @Sendable () -> Void = { [weak self] in
            guard let self, self.generation == generation else { return }
            if self.applicationRegistered { return registerAdvertisement() }
            self.registerApplication(connection: connection, owner: owner, generation: generation, then: registerAdvertisement)
        }
        guard configuration.security == .authenticated, !agentRegistered else { return registerApplication() }
        registerAgent(connection: connection, owner: owner, generation: generation, then: registerApplication)
    }

    /// AgentManager1.RegisterAgent(DisplayOnly) + RequestDefaultAgent, so
    /// bluetoothd pairs with passkey entry (the central types the number the
    /// board shows), the MITM-protected method a display-only device has
    /// (Core 5.3 Vol 3 Part H 2.3.5.1, Table 2.8). A failure is logged and
    /// does not stop the GATT service: unauthenticated writes then fail.
    private func registerAgent(connection: DBusConnection, owner: String, generation: Int, then next: @escaping @Sendable () -> Void) {
        connection.call(destination: owner, path: "/org/bluez", interface: "org.bluez.AgentManager1", method: "RegisterAgent",
                        arguments: [.objectPath(Self.agentPath), .string("DisplayOnly")]) { [weak self] result in
            guard let self, self.generation == generation else { return }
            switch result {
            case .success: break
            case .failure(let error) where error.name == "org.bluez.Error.AlreadyExists": break
            case .failure(let error):
                self.logger.warning("BLE: cannot register the pairing agent: \(error); authenticated pairing will fail")
                return next()
            }
            connection.call(destination: owner, path: "/org/bluez", interface: "org.bluez.AgentManager1", method: "RequestDefaultAgent",
                            arguments: [.objectPath(Self.agentPath)]) { [weak self] result in
                guard let self, self.generation == generation else { return }
                if case .failure(let error) = result {
                    self.logger.warning("BLE: pairing agent registered but not the default: \(error)")
                }
                self.agentRegistered = true
                self.logger.info("BLE: pairing agent registered (DisplayOnly)")
                next()
            }
        }
    }

    private func registerApplication(connection: DBusConnection, owner: String, generation: Int, then registerAdvertisement: @escaping @Sendable () -> Void) {
        connection.call(destination: owner, path: adapterPath, interface: "org.bluez.GattManager1", method: "RegisterApplication",
                        arguments: [.objectPath(Self.applicationPath), .properties([])], timeout: .seconds(10)) { [weak self] result in
            guard let self, self.generation == generation else { return }
            switch result {
            case .success: self.applicationRegistered = true
            case .failure(let error) where error.name == "org.bluez.Error.AlreadyExists": self.applicationRegistered = true
            case .failure(let error):
                self.setState("RegisterApplication failed: \(error); retrying")
                self.setupInFlight = false
                return self.retry(after: .seconds(1)) { [weak self] in self?.setup() }
            }
            registerAdvertisement()
        }
    }

    // MARK: BlueZ signals

    private func fromBlueZ(_ signal: DBusMessageInfo) -> Bool {
        guard let owner = bluezOwner else { return false }
        return signal.sender == owner && (signal.path ?? "").hasPrefix("/org/bluez") || signal.sender == owner && signal.path == "/"
    }

    private func objectManagerSignal(_ signal: DBusMessageInfo) {
        guard fromBlueZ(signal), let object = signal.arguments.first?.stringValue else { return }
        switch signal.member {
        case "InterfacesAdded":
            if object == adapterPath { setup() }
        case "InterfacesRemoved":
            let names = signal.arguments.count > 1 ? signal.arguments[1].arrayValue?.compactMap(\.stringValue) ?? [] : []
            if object == adapterPath, names.contains("org.bluez.Adapter1") {
                generation += 1
                dropRegistrations()
                setState("waiting for adapter \(configuration.adapter) (it went away)")
                retry(after: .seconds(1)) { [weak self] in self?.setup() }
            } else if centrals.contains(object), names.contains("org.bluez.Device1") {
                centralGone(object, why: "removed")
            }
        default:
            break
        }
    }

    private func propertiesChanged(_ signal: DBusMessageInfo) {
        guard fromBlueZ(signal), signal.arguments.count >= 2, let path = signal.path,
              let interface = signal.arguments[0].stringValue, let changed = signal.arguments[1].dictionaryValue else { return }
        if path == adapterPath, interface == "org.bluez.Adapter1", let powered = changed["Powered"]?.boolValue {
            generation += 1
            dropRegistrations()
            if powered {
                logger.info("adapter \(configuration.adapter) powered on")
                setup()
            } else {
                setState("adapter \(configuration.adapter) is powered off: waiting")
                if configuration.powerOn { retry(after: .seconds(1)) { [weak self] in self?.setup() } }
            }
        } else if interface == "org.bluez.Device1" {
            // bluetoothd does not tell the agent that pairing succeeded: Paired does.
            if path == pairing, changed["Paired"]?.boolValue == true || changed["Connected"]?.boolValue == false { endPairing() }
            if changed["Connected"]?.boolValue == false, centrals.contains(path) { centralGone(path, why: "disconnected") }
        }
    }

    private func centralGone(_ central: String, why: String) {
        closeAcquired(for: central)
        guard centrals.remove(central) != nil else { return }
        logger.info("central \(central) \(why)")
        handlers.disconnected(central)
        if centrals.isEmpty { notifying = false }
        publishStatistics()
        // BlueZ resumes advertising by itself once the link is gone; if it
        // released our advertisement meanwhile, Release() re-registers it.
    }

    // MARK: Exported objects

    private func exportObjects(on connection: DBusConnection) {
        connection.exportObjectManager(at: Self.applicationPath)
        connection.export(path: Self.servicePath, interfaces: [serialService()])
        connection.export(path: Self.characteristicPath, interfaces: [serialCharacteristic()])
        connection.export(path: Self.deviceInformationPath, interfaces: [service(uuid: Self.deviceInformationUUID)])
        let strings = [
            ("2a29", configuration.manufacturer),
            ("2a24", configuration.model),
            ("2a26", configuration.firmwareRevision),
        ]
        for (index, (uuid, text)) in strings.enumerated() {
            connection.export(path: Self.deviceInformationPath + "/char\(index)",
                              interfaces: [readOnlyCharacteristic(uuid: "0000\(uuid)-0000-1000-8000-00805f9b34fb", service: Self.deviceInformationPath, value: Array(text.utf8))])
        }
        connection.export(path: Self.advertisementPath, interfaces: [advertisement()])
        if configuration.security == .authenticated {
            connection.export(path: Self.agentPath, interfaces: [agent()])
        }
    }

    /// org.bluez.Agent1 for a board that can display but not type or confirm
    /// (doc/org.bluez.Agent.rst). Requests for input are rejected.
    private func agent() -> DBusInterface {
        let agent = DBusInterface("org.bluez.Agent1")
        agent.method("Release") { [weak self] call in
            call.reply()
            guard let self else { return }
            // bluetoothd unregistered us (another default agent, or shutdown): register again on the next setup.
            self.agentRegistered = false
            self.endPairing()
        }
        agent.method("DisplayPasskey", in: "ouq") { [weak self] call in
            defer { call.reply() }
            guard let self, let device = call.arguments[0].stringValue, case .uint32(let passkey) = call.arguments[1] else { return }
            // Called again as the central types each digit (`entered`); show it once.
            guard self.pairing != device else { return }
            self.showPasskey(String(format: "%06u", passkey), for: device)
        }
        agent.method("DisplayPinCode", in: "os") { [weak self] call in
            defer { call.reply() }
            guard let self, let device = call.arguments[0].stringValue, let pin = call.arguments[1].stringValue else { return }
            self.showPasskey(pin, for: device)
        }
        agent.method("RequestConfirmation", in: "ou") { [weak self] call in
            // Numeric comparison: the board cannot press "yes", so it shows
            // the number and accepts; the user confirms on the central only
            // when both match.
            guard let self, let device = call.arguments[0].stringValue, case .uint32(let passkey) = call.arguments[1] else {
                return call.fail("org.bluez.Error.Rejected", "bad arguments")
            }
            self.showPasskey(String(format: "%06u", passkey), for: device)
            call.reply()
        }
        agent.method("RequestPinCode", in: "o", out: "s") { call in call.fail("org.bluez.Error.Rejected", "display-only board: cannot enter a PIN") }
        agent.method("RequestPasskey", in: "o", out: "u") { call in call.fail("org.bluez.Error.Rejected", "display-only board: cannot enter a passkey") }
        // Just Works is not MITM-protected: refuse it when authentication is required.
        agent.method("RequestAuthorization", in: "o") { call in call.fail("org.bluez.Error.Rejected", "ble.security is authenticated: Just Works pairing refused") }
        agent.method("AuthorizeService", in: "os") { call in call.reply() }
        agent.method("Cancel") { [weak self] call in
            self?.endPairing()
            call.reply()
        }
        return agent
    }

    private func showPasskey(_ passkey: String, for device: String) {
        pairing = device
        logger.notice("BLE: pairing with \(device): passkey \(passkey)")
        handlers.passkey(device, passkey)
    }

    private func endPairing() {
        guard let device = pairing else { return }
        pairing = nil
        handlers.passkey(device, nil)
    }

    private func service(uuid: String) -> DBusInterface {
        let service = DBusInterface("org.bluez.GattService1")
        service.property("UUID", "s", get: { .string(uuid) })
        service.property("Primary", "b", get: { .bool(true) })
        return service
    }

    private func serialService() -> DBusInterface { service(uuid: Self.serviceUUID) }

    private var characteristicFlags: [String] {
        switch configuration.security {
        case .open: return ["write", "write-without-response", "notify"]
        // encrypt-notify / encrypt-authenticated-notify guard the CCC write
        // (subscribing); BlueZ ≥ 5.62 knows them. Reads are refused anyway.
        case .encrypted: return ["write", "write-without-response", "notify", "encrypt-write", "encrypt-notify"]
        case .authenticated: return ["write", "write-without-response", "notify", "encrypt-authenticated-write", "encrypt-authenticated-notify"]
        }
    }

    private func serialCharacteristic() -> DBusInterface {
        let characteristic = DBusInterface("org.bluez.GattCharacteristic1")
        let flags = characteristicFlags
        characteristic.property("UUID", "s", get: { .string(Self.characteristicUUID) })
        characteristic.property("Service", "o", get: { .objectPath(Self.servicePath) })
        characteristic.property("Flags", "as", get: { .strings(flags) })
        characteristic.property("Notifying", "b", get: { [weak self] in .bool(self?.notifying ?? false) })
        characteristic.property("Value", "ay", get: { [weak self] in .bytes(self?.value ?? []) })
        // BlueZ (and BlueZoo) try AcquireWrite only when the property exists.
        if configuration.acquireWrite {
            characteristic.property("WriteAcquired", "b", get: { [weak self] in .bool(!(self?.writeSockets.isEmpty ?? true)) })
            characteristic.method("AcquireWrite", in: "a{sv}", out: "hq") { [weak self] call in self?.acquire(call, notify: false) }
        }
        characteristic.property("NotifyAcquired", "b", get: { [weak self] in .bool(!(self?.notifySockets.isEmpty ?? true)) })
        characteristic.method("WriteValue", in: "aya{sv}") { [weak self] call in self?.writeValue(call) }
        characteristic.method("AcquireNotify", in: "a{sv}", out: "hq") { [weak self] call in self?.acquire(call, notify: true) }
        characteristic.method("StartNotify") { [weak self] call in
            guard let self else { return call.fail("org.bluez.Error.Failed", "shutting down") }
            if !self.notifying {
                self.notifying = true
                self.connection?.emitPropertiesChanged(path: Self.characteristicPath, interface: "org.bluez.GattCharacteristic1", names: ["Notifying"])
            }
            call.reply()
        }
        characteristic.method("StopNotify") { [weak self] call in
            guard let self else { return call.fail("org.bluez.Error.Failed", "shutting down") }
            if self.notifying {
                self.notifying = false
                self.connection?.emitPropertiesChanged(path: Self.characteristicPath, interface: "org.bluez.GattCharacteristic1", names: ["Notifying"])
            }
            call.reply()
        }
        characteristic.method("ReadValue", in: "a{sv}", out: "ay") { call in
            call.fail("org.bluez.Error.NotPermitted", "FFE1 is write and notify only")
        }
        return characteristic
    }

    private func readOnlyCharacteristic(uuid: String, service: String, value: [UInt8]) -> DBusInterface {
        let characteristic = DBusInterface("org.bluez.GattCharacteristic1")
        characteristic.property("UUID", "s", get: { .string(uuid) })
        characteristic.property("Service", "o", get: { .objectPath(service) })
        characteristic.property("Flags", "as", get: { .strings(["read"]) })
        characteristic.method("ReadValue", in: "a{sv}", out: "ay") { call in
            let offset = call.arguments.first?.dictionaryValue?["offset"]?.integerValue ?? 0
            guard offset <= value.count else { return call.fail("org.bluez.Error.InvalidOffset", "offset \(offset) past \(value.count) bytes") }
            call.reply([.bytes(Array(value[offset...]))])
        }
        return characteristic
    }

    private func advertisement() -> DBusInterface {
        let advertisement = DBusInterface("org.bluez.LEAdvertisement1")
        let name = configuration.name
        advertisement.property("Type", "s", get: { .string("peripheral") })
        advertisement.property("ServiceUUIDs", "as", get: { .strings([Self.serviceUUID]) })
        advertisement.property("LocalName", "s", get: { .string(name) })
        // BlueZoo (and some scanners' filters) want an explicitly discoverable advertisement.
        advertisement.property("Discoverable", "b", get: { .bool(true) })
        advertisement.method("Release") { [weak self] call in
            call.reply()
            guard let self, self.advertisementRegistered else { return }
            // BlueZ dropped it without being asked (adapter reset): register again.
            self.advertisementRegistered = false
            self.logger.notice("BlueZ released the advertisement; registering it again")
            self.retry(after: .milliseconds(200)) { [weak self] in self?.setup() }
        }
        return advertisement
    }

    // MARK: Writes

    private func writeValue(_ call: DBusMethodCall) {
        guard let bytes = call.arguments.first?.byteArray else { return call.fail("org.bluez.Error.InvalidArguments", "WriteValue takes (aya{sv})") }
        let options = call.arguments.count > 1 ? call.arguments[1].dictionaryValue ?? [:] : [:]
        let central = options["device"]?.stringValue ?? "unknown"
        // BlueZ 5.66 sends no `type`; without it the write may be a request,
        // and answering a command late costs nothing but a little time.
        let withResponse = options["type"]?.stringValue != "command"
        guard allowed(central) else { return call.fail("org.bluez.Error.NotAuthorized", "not in the allow-list") }
        statistics.writes += 1
        if centrals.insert(central).inserted {
            logger.info("central \(central) writing")
            publishStatistics()
        }
        if withResponse {
            handlers.write(central, bytes, true) { error in
                if let error { call.fail("org.bluez.Error.Failed", error) } else { call.reply() }
            }
        } else {
            // BlueZ still waits for the D-Bus reply of a command; it costs no ATT traffic.
            handlers.write(central, bytes, false) { _ in }
            call.reply()
        }
    }

    /// Checks ble.allow, counting and logging a refusal.
    private func allowed(_ central: String) -> Bool {
        guard !configuration.allow.isEmpty, !configuration.allow.contains(Self.address(of: central)) else { return true }
        statistics.refused += 1
        publishStatistics()
        logger.notice("write from \(central) refused: not in ble.allow")
        return false
    }

    // MARK: Acquired sockets

    /// AcquireWrite / AcquireNotify(options: device, mtu, link) → (h fd, q mtu).
    /// A new acquisition for the same central replaces the old socket
    /// (BlueZ acquires again after a reconnect or an MTU change).
    private func acquire(_ call: DBusMethodCall, notify: Bool) {
        let options = call.arguments.first?.dictionaryValue ?? [:]
        let central = options["device"]?.stringValue ?? "unknown"
        // 23 is the LE default ATT_MTU (Core 5.3 Vol 3 Part F 3.2.8).
        let mtu = min(max(options["mtu"]?.integerValue ?? 23, 23), 517)
        if !notify {
            guard allowed(central) else { return call.fail("org.bluez.Error.NotAuthorized", "not in the allow-list") }
        }
        guard let (socket, remote) = AcquiredSocket.pair(central: central, mtu: mtu) else {
            return call.fail("org.bluez.Error.Failed", "socketpair: \(String(cString: strerror(errno)))")
        }
        let name = notify ? "NotifyAcquired" : "WriteAcquired"
        let wasAcquired = notify ? !notifySockets.isEmpty : !writeSockets.isEmpty
        let old = notify ? notifySockets.updateValue(socket, forKey: central) : writeSockets.updateValue(socket, forKey: central)
        old?.close()
        socket.start(name: notify ? "blecontrol-ble-ntf" : "blecontrol-ble-wr", received: { [weak self] bytes in
            // BlueZ writes nothing into a notify socket (indications only confirm there).
            guard let self, !notify else { return }
            self.thread.execute { [weak self] in self?.acquiredWrite(bytes, from: socket) }
        }, ended: { [weak self] in
            guard let self else { return }
            self.thread.execute { [weak self] in self?.acquiredEnded(socket, notify: notify) }
        })
        call.reply([.unixFD(remote), .uint16(UInt16(mtu))])
        // libdbus duplicated the descriptor into the reply; BlueZ owns that copy.
        close(remote)
        logger.info("\(notify ? "AcquireNotify" : "AcquireWrite") from \(central) (MTU \(mtu))")
        if !notify, centrals.insert(central).inserted { publishStatistics() }
        if !wasAcquired {
            connection?.emitPropertiesChanged(path: Self.characteristicPath, interface: "org.bluez.GattCharacteristic1", names: [name])
        }
    }

    private func acquiredWrite(_ bytes: [UInt8], from socket: AcquiredSocket) {
        statistics.writes += 1
        publishStatistics()
        handlers.write(socket.central, bytes, false) { _ in }
    }

    /// BlueZ closed its end (or we did): the acquisition ends, not the
    /// session — that ends on Device1 Connected=false.
    private func acquiredEnded(_ socket: AcquiredSocket, notify: Bool) {
        if notify {
            guard notifySockets[socket.central] === socket else { return }
            notifySockets[socket.central] = nil
            if notifySockets.isEmpty { connection?.emitPropertiesChanged(path: Self.characteristicPath, interface: "org.bluez.GattCharacteristic1", names: ["NotifyAcquired"]) }
        } else {
            guard writeSockets[socket.central] === socket else { return }
            writeSockets[socket.central] = nil
            if writeSockets.isEmpty { connection?.emitPropertiesChanged(path: Self.characteristicPath, interface: "org.bluez.GattCharacteristic1", names: ["WriteAcquired"]) }
        }
        logger.info("\(notify ? "acquired notify" : "acquired write") of \(socket.central) released")
    }

    /// Closes the sockets of `central` (nil: all); their readers report the end.
    private func closeAcquired(for central: String?) {
        for (key, socket) in writeSockets where central == nil || key == central { socket.close() }
        for (key, socket) in notifySockets where central == nil || key == central { socket.close() }
    }

    /// `AA:BB:CC:DD:EE:FF` from `/org/bluez/hci0/dev_AA_BB_CC_DD_EE_FF`.
    static func address(of devicePath: String) -> String {
        guard let last = devicePath.split(separator: "/").last, last.hasPrefix("dev_") else { return devicePath }
        return last.dropFirst(4).replacingOccurrences(of: "_", with: ":").uppercased()
    }

    // MARK: State

    private func setState(_ text: String) {
        lock.withLock { stateText = text }
        if text != lastLogged {
            lastLogged = text
            if text == "advertising" {
                logger.notice("BLE: advertising as \(configuration.name) on \(configuration.adapter) (GATT application and advertisement registered)")
            } else {
                logger.notice("BLE: \(text)")
            }
        }
    }

    private func publishStatistics() {
        let statistics = self.statistics
        let count = centrals.count
        lock.withLock {
            statisticsCopy = statistics
            centralCount = count
        }
    }
}
